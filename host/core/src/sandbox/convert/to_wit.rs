//! JSON → WIT values.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Value};
use wasmtime::component::Val;
use wasmtime::component::types::{self, Type};

use super::{ConvertError, JsonPath, names_match};

/// Converts `json` to a value of type `ty`.
pub fn from_json(ty: &Type, json: &Value) -> Result<Val, ConvertError> {
    convert(ty, json, &mut JsonPath::default())
}

fn convert(ty: &Type, json: &Value, path: &mut JsonPath) -> Result<Val, ConvertError> {
    Ok(match ty {
        Type::Bool => match json {
            Value::Bool(b) => Val::Bool(*b),
            other => return Err(mismatch(path, "bool", other)),
        },
        Type::S8 => Val::S8(int(json, path, "s8")?),
        Type::U8 => Val::U8(int(json, path, "u8")?),
        Type::S16 => Val::S16(int(json, path, "s16")?),
        Type::U16 => Val::U16(int(json, path, "u16")?),
        Type::S32 => Val::S32(int(json, path, "s32")?),
        Type::U32 => Val::U32(int(json, path, "u32")?),
        Type::S64 => Val::S64(int(json, path, "s64")?),
        Type::U64 => Val::U64(int(json, path, "u64")?),
        Type::Float32 => {
            let f = float(json, path, "f32")?;
            if f.is_finite() && f.abs() > f64::from(f32::MAX) {
                return Err(path.error(format!("{json} is out of range for f32")));
            }
            Val::Float32(f as f32)
        }
        Type::Float64 => Val::Float64(float(json, path, "f64")?),
        Type::Char => match json {
            Value::String(s) => {
                let mut chars = s.chars();
                match (chars.next(), chars.next()) {
                    (Some(c), None) => Val::Char(c),
                    _ => return Err(mismatch(path, "char (a one-character string)", json)),
                }
            }
            other => return Err(mismatch(path, "char (a one-character string)", other)),
        },
        Type::String => match json {
            Value::String(s) => Val::String(s.clone()),
            other => return Err(mismatch(path, "string", other)),
        },
        Type::List(list) => self::list(list, json, path)?,
        Type::FixedLengthList(list) => {
            let items = array(json, path, "array")?;
            let len = list.len() as usize;
            if items.len() != len {
                return Err(path.error(format!(
                    "expected an array of exactly {len} elements, got {}",
                    items.len()
                )));
            }
            Val::FixedLengthList(elements(&list.ty(), items, path)?)
        }
        Type::Map(map) => self::map(map, json, path)?,
        Type::Record(record) => self::record(record, json, path)?,
        Type::Tuple(tuple) => {
            let items = array(json, path, "array (tuple)")?;
            let types: Vec<Type> = tuple.types().collect();
            if items.len() != types.len() {
                return Err(path.error(format!(
                    "expected a tuple of {} elements, got {}",
                    types.len(),
                    items.len()
                )));
            }
            let values = types
                .iter()
                .zip(items)
                .enumerate()
                .map(|(i, (ty, item))| path.index(i, |p| convert(ty, item, p)))
                .collect::<Result<_, _>>()?;
            Val::Tuple(values)
        }
        Type::Variant(variant) => self::variant(variant, json, path)?,
        Type::Enum(e) => {
            let Value::String(name) = json else {
                return Err(mismatch(
                    path,
                    &format!("one of {}", list_names(e.names())),
                    json,
                ));
            };
            match e.names().find(|case| names_match(case, name)) {
                Some(case) => Val::Enum(case.to_owned()),
                None => {
                    return Err(path.error(format!(
                        "unknown case \"{name}\" (expected one of {})",
                        list_names(e.names())
                    )));
                }
            }
        }
        Type::Option(option) => match json {
            Value::Null => Val::Option(None),
            other => Val::Option(Some(Box::new(convert(&option.ty(), other, path)?))),
        },
        Type::Result(result) => self::result(result, json, path)?,
        Type::Flags(flags) => {
            let items = array(json, path, "array of flag names")?;
            let mut set = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let found = match item {
                    Value::String(name) => flags.names().find(|f| names_match(f, name)),
                    _ => None,
                };
                match found {
                    Some(flag) if !set.iter().any(|f| f == flag) => set.push(flag.to_owned()),
                    Some(_) => {}
                    None => {
                        return Err(path.index(i, |p| {
                            p.error(format!(
                                "expected one of {}, got {}",
                                list_names(flags.names()),
                                describe(item)
                            ))
                        }));
                    }
                }
            }
            Val::Flags(set)
        }
        Type::Own(_) | Type::Borrow(_) | Type::Future(_) | Type::Stream(_) | Type::ErrorContext => {
            return Err(path.error(format!(
                "{} values cannot be passed as JSON",
                super::super::signature::render(ty)
            )));
        }
    })
}

fn list(list: &types::List, json: &Value, path: &mut JsonPath) -> Result<Val, ConvertError> {
    let element = list.ty();
    if element == Type::U8
        && let Value::String(text) = json
    {
        let bytes = BASE64.decode(text).map_err(|e| {
            path.error(format!(
                "expected list<u8> as a base64 string or an array of numbers: {e}"
            ))
        })?;
        return Ok(Val::List(bytes.into_iter().map(Val::U8).collect()));
    }
    let items = array(json, path, "array")?;
    Ok(Val::List(elements(&element, items, path)?))
}

fn elements(ty: &Type, items: &[Value], path: &mut JsonPath) -> Result<Vec<Val>, ConvertError> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| path.index(i, |p| convert(ty, item, p)))
        .collect()
}

fn map(map: &types::Map, json: &Value, path: &mut JsonPath) -> Result<Val, ConvertError> {
    let (key_ty, value_ty) = (map.key(), map.value());
    let mut entries = Vec::new();
    match json {
        Value::Object(object) if key_ty == Type::String => {
            for (key, value) in object {
                let value = path.field(key, |p| convert(&value_ty, value, p))?;
                entries.push((Val::String(key.clone()), value));
            }
        }
        Value::Array(pairs) => {
            for (i, pair) in pairs.iter().enumerate() {
                let entry = path.index(i, |p| match pair {
                    Value::Array(kv) if kv.len() == 2 => Ok((
                        p.index(0, |p| convert(&key_ty, &kv[0], p))?,
                        p.index(1, |p| convert(&value_ty, &kv[1], p))?,
                    )),
                    other => Err(mismatch(p, "a [key, value] pair", other)),
                })?;
                entries.push(entry);
            }
        }
        other => {
            return Err(mismatch(
                path,
                "an object or an array of [key, value] pairs",
                other,
            ));
        }
    }
    Ok(Val::Map(entries))
}

fn record(record: &types::Record, json: &Value, path: &mut JsonPath) -> Result<Val, ConvertError> {
    let Value::Object(object) = json else {
        return Err(mismatch(path, "object (record)", json));
    };
    let fields: Vec<types::Field<'_>> = record.fields().collect();
    if let Some(unknown) = object
        .keys()
        .find(|key| !fields.iter().any(|f| names_match(f.name, key)))
    {
        return Err(path.error(format!(
            "unknown field \"{unknown}\" (expected {})",
            list_names(fields.iter().map(|f| f.name))
        )));
    }
    let mut values = Vec::with_capacity(fields.len());
    for field in &fields {
        let value = match lookup(object, field.name) {
            Some(value) => path.field(field.name, |p| convert(&field.ty, value, p))?,
            None if matches!(field.ty, Type::Option(_)) => Val::Option(None),
            None => return Err(path.error(format!("missing field \"{}\"", field.name))),
        };
        values.push((field.name.to_owned(), value));
    }
    Ok(Val::Record(values))
}

fn lookup<'a>(object: &'a Map<String, Value>, wit_name: &str) -> Option<&'a Value> {
    object.get(wit_name).or_else(|| {
        object
            .iter()
            .find(|(key, _)| names_match(wit_name, key))
            .map(|(_, value)| value)
    })
}

fn variant(
    variant: &types::Variant,
    json: &Value,
    path: &mut JsonPath,
) -> Result<Val, ConvertError> {
    let expected = || list_names(variant.cases().map(|c| c.name));
    let (name, payload) = match json {
        Value::String(name) => (name, None),
        Value::Object(object) if object.len() == 1 => {
            let Some((name, payload)) = object.iter().next() else {
                unreachable!("an object of length 1 has an entry")
            };
            (name, Some(payload))
        }
        other => {
            return Err(mismatch(
                path,
                &format!(
                    "\"case\" or {{\"case\": payload}} with a case of {}",
                    expected()
                ),
                other,
            ));
        }
    };
    let Some(case) = variant.cases().find(|c| names_match(c.name, name)) else {
        return Err(path.error(format!(
            "unknown case \"{name}\" (expected one of {})",
            expected()
        )));
    };
    let value = match (&case.ty, payload) {
        (None, None | Some(Value::Null)) => None,
        (Some(ty), Some(payload)) => Some(Box::new(
            path.field(case.name, |p| convert(ty, payload, p))?,
        )),
        (Some(_), None) => {
            return Err(path.error(format!(
                "case \"{}\" carries a payload: write {{\"{}\": …}}",
                case.name, case.name
            )));
        }
        (None, Some(_)) => {
            return Err(path.error(format!(
                "case \"{}\" has no payload: write \"{}\"",
                case.name, case.name
            )));
        }
    };
    Ok(Val::Variant(case.name.to_owned(), value))
}

fn result(
    result: &types::ResultType,
    json: &Value,
    path: &mut JsonPath,
) -> Result<Val, ConvertError> {
    let entry = match json {
        Value::Object(object) if object.len() == 1 => object.iter().next(),
        _ => None,
    };
    let payload = |ty: Option<Type>, value: &Value, p: &mut JsonPath, name: &str| match ty {
        Some(ty) => p
            .field(name, |p| convert(&ty, value, p))
            .map(|v| Some(Box::new(v))),
        None if value.is_null() => Ok(None),
        None => Err(p.error(format!(
            "\"{name}\" of this result carries no value: use null"
        ))),
    };
    match entry {
        Some((key, value)) if key == "ok" => {
            Ok(Val::Result(Ok(payload(result.ok(), value, path, "ok")?)))
        }
        Some((key, value)) if key == "err" => {
            Ok(Val::Result(Err(payload(result.err(), value, path, "err")?)))
        }
        _ => Err(mismatch(path, "{\"ok\": …} or {\"err\": …}", json)),
    }
}

fn array<'a>(json: &'a Value, path: &JsonPath, what: &str) -> Result<&'a [Value], ConvertError> {
    match json {
        Value::Array(items) => Ok(items),
        other => Err(mismatch(path, what, other)),
    }
}

fn int<T>(json: &Value, path: &JsonPath, name: &str) -> Result<T, ConvertError>
where
    T: TryFrom<i64> + TryFrom<u64>,
{
    let Value::Number(n) = json else {
        return Err(mismatch(path, name, json));
    };
    let converted = if let Some(u) = n.as_u64() {
        T::try_from(u).ok()
    } else if let Some(i) = n.as_i64() {
        T::try_from(i).ok()
    } else {
        // A float: accepted only when it is a whole number in range.
        n.as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
            .and_then(|f| T::try_from(f as i64).ok())
    };
    converted.ok_or_else(|| mismatch(path, name, json))
}

fn float(json: &Value, path: &JsonPath, name: &str) -> Result<f64, ConvertError> {
    match json {
        Value::Number(n) => n.as_f64().ok_or_else(|| mismatch(path, name, json)),
        Value::String(s) if s == "NaN" => Ok(f64::NAN),
        Value::String(s) if s == "Infinity" => Ok(f64::INFINITY),
        Value::String(s) if s == "-Infinity" => Ok(f64::NEG_INFINITY),
        other => Err(mismatch(path, name, other)),
    }
}

fn mismatch(path: &JsonPath, expected: &str, got: &Value) -> ConvertError {
    path.error(format!("expected {expected}, got {}", describe(got)))
}

/// A short rendering of a JSON value for error messages.
pub fn describe(value: &Value) -> String {
    let kind = match value {
        Value::Null => return "null".to_owned(),
        Value::Bool(_) | Value::Number(_) => return value.to_string(),
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let text = value.to_string();
    if text.chars().count() <= 40 {
        format!("{kind} {text}")
    } else {
        let short: String = text.chars().take(37).collect();
        format!("{kind} {short}...")
    }
}

fn list_names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}
