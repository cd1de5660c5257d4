//! A sample JSON value for a WIT type: what `corral dev` pastes into its
//! ready-to-run command lines, so a newcomer sees the shape to send.

use serde_json::{Map, Value, json};
use wasmtime::component::types::Type;

/// A value of type `ty` that the conversion accepts (`null` for types that
/// have no JSON form).
pub fn sample(ty: &Type) -> Value {
    match ty {
        Type::Bool => json!(true),
        Type::S8
        | Type::U8
        | Type::S16
        | Type::U16
        | Type::S32
        | Type::U32
        | Type::S64
        | Type::U64 => json!(1),
        Type::Float32 | Type::Float64 => json!(1.5),
        Type::Char => json!("x"),
        Type::String => json!("text"),
        Type::List(l) if l.ty() == Type::U8 => json!("aGVsbG8="),
        Type::List(l) => json!([sample(&l.ty())]),
        Type::FixedLengthList(l) => Value::Array((0..l.len()).map(|_| sample(&l.ty())).collect()),
        Type::Map(m) if m.key() == Type::String => json!({ "key": sample(&m.value()) }),
        Type::Map(m) => json!([[sample(&m.key()), sample(&m.value())]]),
        Type::Record(r) => Value::Object(
            r.fields()
                .map(|f| (f.name.to_owned(), sample(&f.ty)))
                .collect::<Map<_, _>>(),
        ),
        Type::Tuple(t) => Value::Array(t.types().map(|t| sample(&t)).collect()),
        Type::Variant(v) => match v.cases().next() {
            Some(case) => match &case.ty {
                Some(ty) => json!({ case.name: sample(ty) }),
                None => json!(case.name),
            },
            None => Value::Null,
        },
        Type::Enum(e) => e.names().next().map_or(Value::Null, |n| json!(n)),
        Type::Option(o) => sample(&o.ty()),
        Type::Result(r) => json!({ "ok": r.ok().as_ref().map_or(Value::Null, sample) }),
        Type::Flags(f) => Value::Array(f.names().take(1).map(|n| json!(n)).collect()),
        Type::Own(_) | Type::Borrow(_) | Type::Future(_) | Type::Stream(_) | Type::ErrorContext => {
            Value::Null
        }
    }
}
