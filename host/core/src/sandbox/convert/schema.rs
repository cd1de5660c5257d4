//! JSON Schemas (draft 2020-12) of the JSON an activity type accepts and
//! produces, derived from its WIT signature by the same rules as the
//! converter, so an engine that checks contracts (Aion) checks them against
//! what the component really takes.
//!
//! Inputs are an object of named parameters. Input names are spelled in
//! snake_case (`max_len`: what JSON writers and Aion's AWL use; the
//! converter also accepts the WIT kebab-case and camelCase), outputs carry
//! the WIT names the converter produces. Likewise input enum cases are
//! also listed in PascalCase (`Formal`), which the converter accepts. `s64` and `u64`
//! carry no upper bound (JSON numbers past them are refused when a task
//! arrives, naming the path) so that they match engines' plain integers.

use serde_json::{Map, Value, json};
use wasmtime::component::types::Type;

use crate::sandbox::ActivityType;

/// Which side of the call a schema describes: inputs admit a few more
/// spellings than outputs produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Input,
    Output,
}

impl Side {
    /// How a WIT name is spelled in JSON on this side.
    fn spell(self, wit: &str) -> String {
        match self {
            Side::Input => wit.replace('-', "_"),
            Side::Output => wit.to_owned(),
        }
    }

    /// The strings that name enum cases, flags and payload-less variant
    /// cases: inputs also take them in PascalCase (`very-formal` as
    /// `VeryFormal`, AWL's spelling), outputs produce the WIT names.
    fn names<'a>(self, wit: impl Iterator<Item = &'a str>) -> Vec<String> {
        let wit: Vec<String> = wit.map(str::to_owned).collect();
        let mut names = wit.clone();
        if self == Side::Input {
            for name in &wit {
                let pascal: String = name
                    .split('-')
                    .map(|word| {
                        let mut chars = word.chars();
                        chars.next().map_or_else(String::new, |first| {
                            first.to_ascii_uppercase().to_string() + chars.as_str()
                        })
                    })
                    .collect();
                if !names.contains(&pascal) {
                    names.push(pascal);
                }
            }
        }
        names
    }
}

/// The schema of the object of named arguments an activity type takes.
pub fn input_schema(activity: &ActivityType) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for (name, ty) in &activity.params {
        let name = Side::Input.spell(name);
        if !matches!(ty, Type::Option(_)) {
            required.push(Value::String(name.clone()));
        }
        properties.insert(name, schema(ty, Side::Input));
    }
    object(properties, required)
}

/// The schema of an activity type's result. A top-level `result<T, E>`
/// produces `T` (its `err` is a failure, not a value); no result is `null`.
pub fn output_schema(activity: &ActivityType) -> Value {
    match &activity.result {
        None => json!({ "type": "null" }),
        Some(Type::Result(result)) => result
            .ok()
            .map_or_else(|| json!({ "type": "null" }), |ok| schema(&ok, Side::Output)),
        Some(ty) => schema(ty, Side::Output),
    }
}

fn object(properties: Map<String, Value>, required: Vec<Value>) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

impl Side {
    /// An integer type: bounded where it is produced.
    fn integer(self, min: i64, max: u64) -> Value {
        match self {
            Side::Input => json!({ "type": "integer" }),
            Side::Output => json!({ "type": "integer", "minimum": min, "maximum": max }),
        }
    }
}

fn schema(ty: &Type, side: Side) -> Value {
    match ty {
        Type::Bool => json!({ "type": "boolean" }),
        Type::S8 => side.integer(i8::MIN.into(), i8::MAX as u64),
        Type::U8 => side.integer(0, u8::MAX.into()),
        Type::S16 => side.integer(i16::MIN.into(), i16::MAX as u64),
        Type::U16 => side.integer(0, u16::MAX.into()),
        Type::S32 => side.integer(i32::MIN.into(), i32::MAX as u64),
        Type::U32 => side.integer(0, u32::MAX.into()),
        Type::S64 => side.integer(i64::MIN, i64::MAX as u64),
        Type::U64 => side.integer(0, u64::MAX),
        // Non-finite values travel as "NaN", "Infinity", "-Infinity".
        Type::Float32 | Type::Float64 => json!({ "type": "number" }),
        Type::Char => json!({ "type": "string", "minLength": 1, "maxLength": 1 }),
        Type::String => json!({ "type": "string" }),
        Type::List(list) if list.ty() == Type::U8 => match side {
            Side::Output => json!({ "type": "string", "contentEncoding": "base64" }),
            Side::Input => json!({ "anyOf": [
                { "type": "string", "contentEncoding": "base64" },
                { "type": "array", "items": side.integer(0, 255) },
            ]}),
        },
        Type::List(list) => json!({ "type": "array", "items": schema(&list.ty(), side) }),
        Type::FixedLengthList(list) => json!({
            "type": "array",
            "items": schema(&list.ty(), side),
            "minItems": list.len(),
            "maxItems": list.len(),
        }),
        Type::Map(map) if map.key() == Type::String => json!({
            "type": "object",
            "additionalProperties": schema(&map.value(), side),
        }),
        Type::Map(map) => json!({
            "type": "array",
            "items": {
                "type": "array",
                "prefixItems": [schema(&map.key(), side), schema(&map.value(), side)],
                "minItems": 2,
                "maxItems": 2,
            },
        }),
        Type::Record(record) => {
            let mut properties = Map::new();
            let mut required = Vec::new();
            for field in record.fields() {
                let name = side.spell(field.name);
                if !matches!(field.ty, Type::Option(_)) {
                    required.push(Value::String(name.clone()));
                }
                properties.insert(name, schema(&field.ty, side));
            }
            object(properties, required)
        }
        Type::Tuple(tuple) => {
            let items: Vec<Value> = tuple.types().map(|t| schema(&t, side)).collect();
            json!({
                "type": "array",
                "prefixItems": items,
                "minItems": items.len(),
                "maxItems": items.len(),
            })
        }
        Type::Variant(variant) => {
            // Cases without a payload are strings: one string enum, so an
            // engine's plain enum type matches it.
            let names = side.names(variant.cases().filter(|c| c.ty.is_none()).map(|c| c.name));
            let mut cases: Vec<Value> = variant
                .cases()
                .filter_map(|case| Some(single(case.name, schema(&case.ty?, side))))
                .collect();
            if !names.is_empty() {
                cases.insert(0, json!({ "type": "string", "enum": names }));
            }
            match <[Value; 1]>::try_from(cases) {
                Ok([only]) => only,
                Err(cases) => json!({ "anyOf": cases }),
            }
        }
        Type::Enum(e) => json!({ "type": "string", "enum": side.names(e.names()) }),
        Type::Option(option) => {
            json!({ "anyOf": [schema(&option.ty(), side), { "type": "null" }] })
        }
        Type::Result(result) => {
            let case =
                |ty: Option<Type>| ty.map_or(json!({ "type": "null" }), |t| schema(&t, side));
            json!({ "anyOf": [single("ok", case(result.ok())), single("err", case(result.err()))] })
        }
        Type::Flags(flags) => json!({
            "type": "array",
            "items": { "type": "string", "enum": side.names(flags.names()) },
            "uniqueItems": true,
        }),
        // Resources, futures and streams are refused when a component loads:
        // no activity type has them.
        _ => json!(false),
    }
}

/// `{"name": payload}`, the JSON form of a variant case with a payload.
fn single(name: &str, payload: Value) -> Value {
    object(
        Map::from_iter([(name.to_owned(), payload)]),
        vec![json!(name)],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{Sandbox, SandboxConfig};

    #[test]
    fn parameters_become_a_closed_object_and_options_are_not_required() {
        let sandbox = Sandbox::new(SandboxConfig {
            max_instances: 1,
            ..SandboxConfig::default()
        })
        .unwrap();
        let bytes = wat::parse_str(
            r#"(component
                (core module $m (func (export "f") (param i32 i32 i32) (result i32) local.get 0))
                (core instance $i (instantiate $m))
                (func (export "count") (param "max-len" u32) (param "tag" (option s8)) (result u32)
                    (canon lift (core func $i "f"))))"#,
        )
        .unwrap();
        let component = sandbox.load(&bytes).unwrap();
        let activity = component.activity("count").unwrap();
        assert_eq!(
            input_schema(activity),
            json!({
                "type": "object",
                "properties": {
                    "max_len": { "type": "integer" },
                    "tag": { "anyOf": [{ "type": "integer" }, { "type": "null" }] },
                },
                "required": ["max_len"],
                "additionalProperties": false,
            })
        );
        assert_eq!(
            output_schema(activity),
            json!({ "type": "integer", "minimum": 0, "maximum": 4294967295u64 })
        );
    }
}
