//! WIT values → JSON.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Number, Value};
use wasmtime::component::Val;
use wasmtime::component::types::Type;

use super::{BytesFilter, ConvertError, JsonPath};

/// Converts a value of type `ty` returned by a guest to JSON. The value is
/// consumed: its strings and names move into the JSON instead of being
/// copied, so a large result is never held twice.
pub fn to_json(ty: &Type, val: Val) -> Result<Value, ConvertError> {
    convert(ty, val, &mut JsonPath::default())
}

/// [`to_json`], each `list<u8>` passed through `bytes` before it is
/// encoded (the host's redaction of secrets: in base64 no redaction of the
/// JSON could find one).
pub fn to_json_filtering(ty: &Type, val: Val, bytes: &BytesFilter) -> Result<Value, ConvertError> {
    convert(ty, val, &mut JsonPath::filtering_bytes(bytes))
}

fn convert(ty: &Type, val: Val, path: &mut JsonPath) -> Result<Value, ConvertError> {
    Ok(match (ty, val) {
        (_, Val::Bool(b)) => Value::Bool(b),
        (_, Val::S8(n)) => Value::from(n),
        (_, Val::U8(n)) => Value::from(n),
        (_, Val::S16(n)) => Value::from(n),
        (_, Val::U16(n)) => Value::from(n),
        (_, Val::S32(n)) => Value::from(n),
        (_, Val::U32(n)) => Value::from(n),
        (_, Val::S64(n)) => Value::from(n),
        (_, Val::U64(n)) => Value::from(n),
        (_, Val::Float32(f)) => float(f64::from(f)),
        (_, Val::Float64(f)) => float(f),
        (_, Val::Char(c)) => Value::String(c.to_string()),
        (_, Val::String(s)) => Value::String(s),
        (Type::List(list), Val::List(items)) => {
            let element = list.ty();
            if element == Type::U8 {
                let mut bytes: Vec<u8> = items
                    .iter()
                    .map(|v| match v {
                        Val::U8(b) => Ok(*b),
                        _ => Err(path.error("list<u8> holds a value that is not a u8")),
                    })
                    .collect::<Result<_, _>>()?;
                path.filter_bytes(&mut bytes);
                Value::String(BASE64.encode(bytes))
            } else {
                elements(&element, items, path)?
            }
        }
        (Type::FixedLengthList(list), Val::FixedLengthList(items)) => {
            elements(&list.ty(), items, path)?
        }
        (Type::Map(map), Val::Map(entries)) => {
            let (key_ty, value_ty) = (map.key(), map.value());
            if key_ty == Type::String {
                let mut object = Map::new();
                for (key, value) in entries {
                    let Val::String(key) = key else {
                        return Err(path.error("map<string, _> holds a key that is not a string"));
                    };
                    let value = path.field(&key, |p| convert(&value_ty, value, p))?;
                    object.insert(key, value);
                }
                Value::Object(object)
            } else {
                let mut pairs = Vec::with_capacity(entries.len());
                for (i, (key, value)) in entries.into_iter().enumerate() {
                    let pair = path.index(i, |p| {
                        Ok::<_, ConvertError>(Value::Array(vec![
                            p.index(0, |p| convert(&key_ty, key, p))?,
                            p.index(1, |p| convert(&value_ty, value, p))?,
                        ]))
                    })?;
                    pairs.push(pair);
                }
                Value::Array(pairs)
            }
        }
        (Type::Record(record), Val::Record(fields)) => {
            let mut object = Map::new();
            for (field_ty, (name, value)) in record.fields().zip(fields) {
                let value = path.field(&name, |p| convert(&field_ty.ty, value, p))?;
                object.insert(name, value);
            }
            Value::Object(object)
        }
        (Type::Tuple(tuple), Val::Tuple(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, (ty, item)) in tuple.types().zip(items).enumerate() {
                out.push(path.index(i, |p| convert(&ty, item, p))?);
            }
            Value::Array(out)
        }
        (Type::Variant(variant), Val::Variant(name, payload)) => {
            let case_ty = variant.cases().find(|c| c.name == name).and_then(|c| c.ty);
            match (case_ty, payload) {
                (Some(ty), Some(payload)) => {
                    let value = path.field(&name, |p| convert(&ty, *payload, p))?;
                    single(name, value)
                }
                _ => Value::String(name),
            }
        }
        (_, Val::Enum(name)) => Value::String(name),
        (Type::Option(option), Val::Option(value)) => match value {
            Some(value) => convert(&option.ty(), *value, path)?,
            None => Value::Null,
        },
        (Type::Result(result), Val::Result(value)) => match value {
            Ok(ok) => single(
                "ok".to_owned(),
                payload(result.ok(), ok.map(|v| *v), path, "ok")?,
            ),
            Err(err) => single(
                "err".to_owned(),
                payload(result.err(), err.map(|v| *v), path, "err")?,
            ),
        },
        (_, Val::Flags(names)) => Value::Array(names.into_iter().map(Value::String).collect()),
        (ty, _) => {
            return Err(path.error(format!(
                "the guest returned a value that cannot be represented as {}",
                super::super::signature::render(ty)
            )));
        }
    })
}

/// A lower bound of the size of `val` as compact JSON, in bytes, found
/// without building anything: an output that cannot fit its limit is
/// refused before the host builds its JSON.
pub fn json_size_at_least(val: &Val) -> usize {
    let sequence = |items: &[Val]| {
        items
            .iter()
            .fold(2 + items.len().saturating_sub(1), |sum, item| {
                sum.saturating_add(json_size_at_least(item))
            })
    };
    match val {
        Val::Bool(_) => 4,
        Val::Char(_) => 3,
        Val::String(s) | Val::Enum(s) => s.len() + 2,
        Val::List(items) | Val::Tuple(items) | Val::FixedLengthList(items) => sequence(items),
        Val::Record(fields) => {
            fields
                .iter()
                .fold(2 + fields.len().saturating_sub(1), |sum, (name, value)| {
                    sum.saturating_add(name.len() + 3)
                        .saturating_add(json_size_at_least(value))
                })
        }
        Val::Option(None) => 4,
        Val::Option(Some(inner)) => json_size_at_least(inner),
        Val::Variant(name, payload) => {
            name.len() + 2 + payload.as_deref().map_or(0, |p| json_size_at_least(p) + 3)
        }
        Val::Result(Ok(Some(inner)) | Err(Some(inner))) => json_size_at_least(inner),
        Val::U8(n) => digits(u64::from(*n)),
        Val::U16(n) => digits(u64::from(*n)),
        Val::U32(n) => digits(u64::from(*n)),
        Val::U64(n) => digits(*n),
        Val::S8(n) => signed(i64::from(*n)),
        Val::S16(n) => signed(i64::from(*n)),
        Val::S32(n) => signed(i64::from(*n)),
        Val::S64(n) => signed(*n),
        // Floats, flags, results without payload, resources: a digit, `[]`
        // or `null` at least.
        _ => 1,
    }
}

/// The length of `n` in decimal.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
}

fn signed(n: i64) -> usize {
    digits(n.unsigned_abs()) + usize::from(n < 0)
}

/// Converts the payload of a top-level `result` case: `null` when the case
/// has no payload. Each `list<u8>` passes through `bytes` (see
/// [`to_json_filtering`]).
pub fn payload_to_json_filtering(
    ty: Option<Type>,
    val: Option<Val>,
    bytes: &BytesFilter<'_>,
) -> Result<Value, ConvertError> {
    match (ty, val) {
        (Some(ty), Some(val)) => convert(&ty, val, &mut JsonPath::filtering_bytes(bytes)),
        _ => Ok(Value::Null),
    }
}

/// Converts the payload of a nested result case, `null` when it has none.
fn payload(
    ty: Option<Type>,
    val: Option<Val>,
    path: &mut JsonPath,
    name: &str,
) -> Result<Value, ConvertError> {
    match (ty, val) {
        (Some(ty), Some(val)) => path.field(name, |p| convert(&ty, val, p)),
        _ => Ok(Value::Null),
    }
}

fn elements(ty: &Type, items: Vec<Val>, path: &mut JsonPath) -> Result<Value, ConvertError> {
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        out.push(path.index(i, |p| convert(ty, item, p))?);
    }
    Ok(Value::Array(out))
}

fn single(key: String, value: Value) -> Value {
    let mut object = Map::new();
    object.insert(key, value);
    Value::Object(object)
}

/// JSON has no NaN or infinities: they travel as the strings `"NaN"`,
/// `"Infinity"` and `"-Infinity"`, which the input side accepts too.
fn float(f: f64) -> Value {
    match Number::from_f64(f) {
        Some(n) => Value::Number(n),
        None if f.is_nan() => Value::String("NaN".to_owned()),
        None if f > 0.0 => Value::String("Infinity".to_owned()),
        None => Value::String("-Infinity".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_bound_never_exceeds_the_json_and_is_exact_for_integers() {
        let values = [
            Val::List((0..1000).map(Val::U32).collect()),
            Val::List(vec![Val::S64(-12), Val::S8(0), Val::U64(u64::MAX)]),
            Val::Record(vec![
                ("name".into(), Val::String("Ada".into())),
                ("tags".into(), Val::List(vec![Val::Enum("a-b".into())])),
                ("next".into(), Val::Option(None)),
            ]),
            Val::Tuple(vec![Val::Bool(true), Val::Char('x'), Val::Float64(0.5)]),
        ];
        let json = [
            serde_json::to_string(&(0..1000).collect::<Vec<u32>>()).unwrap(),
            format!("[-12,0,{}]", u64::MAX),
            r#"{"name":"Ada","tags":["a-b"],"next":null}"#.to_owned(),
            r#"[true,"x",0.5]"#.to_owned(),
        ];
        for (val, json) in values.iter().zip(&json) {
            assert!(json_size_at_least(val) <= json.len(), "{val:?}: {json}");
        }
        assert_eq!(json_size_at_least(&values[0]), json[0].len());
        assert_eq!(json_size_at_least(&values[1]), json[1].len());
    }
}
