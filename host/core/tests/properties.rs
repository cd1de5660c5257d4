//! Properties over generated inputs (proptest, bounded for CI): JSON ⇄ WIT
//! conversion over values generated from every type the `echo` component
//! exports and over generated WIT types of any shape (built as components
//! from WAT), hostile JSON that matches no type, and the loader over mutated
//! components. Nothing panics, refusals name what is wrong, and what fits
//! round-trips, also through a guest.

mod common;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Map, Value, json};
use wasmtime::component::types::Type;

use corral_core::sandbox::convert::{from_json, to_json};
use corral_core::testing::{TestComponent, TestHost};

use common::{example, host};

/// JSON values of type `ty`, in the form the host returns them.
fn value_of(ty: &Type) -> BoxedStrategy<Value> {
    match ty {
        Type::Bool => any::<bool>().prop_map(Value::from).boxed(),
        Type::S8 => any::<i8>().prop_map(Value::from).boxed(),
        Type::U8 => any::<u8>().prop_map(Value::from).boxed(),
        Type::S16 => any::<i16>().prop_map(Value::from).boxed(),
        Type::U16 => any::<u16>().prop_map(Value::from).boxed(),
        Type::S32 => any::<i32>().prop_map(Value::from).boxed(),
        Type::U32 => any::<u32>().prop_map(Value::from).boxed(),
        Type::S64 => any::<i64>().prop_map(Value::from).boxed(),
        Type::U64 => any::<u64>().prop_map(Value::from).boxed(),
        Type::Float32 => any::<f32>()
            .prop_filter("JSON numbers are finite", |f| f.is_finite())
            .prop_map(|f| json!(f64::from(f)))
            .boxed(),
        Type::Float64 => any::<f64>()
            .prop_filter("JSON numbers are finite", |f| f.is_finite())
            .prop_map(|f| json!(f))
            .boxed(),
        Type::Char => any::<char>()
            .prop_map(|c| Value::String(c.to_string()))
            .boxed(),
        Type::String => "\\PC{0,16}".prop_map(Value::String).boxed(),
        Type::List(list) if list.ty() == Type::U8 => proptest::collection::vec(any::<u8>(), 0..48)
            .prop_map(|bytes| Value::String(BASE64.encode(bytes)))
            .boxed(),
        Type::List(list) => proptest::collection::vec(value_of(&list.ty()), 0..4)
            .prop_map(Value::Array)
            .boxed(),
        Type::Tuple(tuple) => tuple
            .types()
            .map(|t| value_of(&t))
            .collect::<Vec<_>>()
            .prop_map(Value::Array)
            .boxed(),
        Type::Record(record) => record
            .fields()
            .map(|field| {
                let name = field.name.to_owned();
                value_of(&field.ty).prop_map(move |v| (name.clone(), v))
            })
            .collect::<Vec<_>>()
            .prop_map(|fields| Value::Object(fields.into_iter().collect::<Map<_, _>>()))
            .boxed(),
        Type::Variant(variant) => {
            let cases: Vec<BoxedStrategy<Value>> = variant
                .cases()
                .map(|case| {
                    let name = case.name.to_owned();
                    match &case.ty {
                        Some(ty) => value_of(ty)
                            .prop_map(move |v| json!({ name.clone(): v }))
                            .boxed(),
                        None => Just(Value::String(name)).boxed(),
                    }
                })
                .collect();
            proptest::strategy::Union::new(cases).boxed()
        }
        Type::Enum(e) => {
            let names: Vec<Value> = e.names().map(|n| Value::String(n.to_owned())).collect();
            proptest::sample::select(names).boxed()
        }
        Type::Flags(flags) => {
            let names: Vec<String> = flags.names().map(str::to_owned).collect();
            let n = names.len();
            proptest::sample::subsequence(names, 0..=n)
                .prop_map(|set| json!(set))
                .boxed()
        }
        Type::Option(option) => prop_oneof![Just(Value::Null), value_of(&option.ty())].boxed(),
        Type::Result(result) => {
            let case = |name: &'static str, ty: Option<Type>| match ty {
                Some(ty) => value_of(&ty).prop_map(move |v| json!({ name: v })).boxed(),
                None => Just(json!({ name: null })).boxed(),
            };
            prop_oneof![case("ok", result.ok()), case("err", result.err())].boxed()
        }
        _ => Just(Value::Null).boxed(),
    }
}

/// Any JSON at all, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "\\PC{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z-]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn echo(host: &TestHost) -> TestComponent {
    host.load_file(example("echo")).unwrap()
}

/// The `echo-*` functions: one parameter, the same type back.
fn echoed_types(echo: &TestComponent) -> Vec<(String, Type)> {
    echo.activity_types()
        .iter()
        .filter(|a| a.name.starts_with("demo:echo/api.echo-"))
        .map(|a| (a.name.to_string(), a.params[0].1.clone()))
        .collect()
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

#[test]
fn every_generated_value_round_trips_through_the_conversion() {
    let host = host().build().unwrap();
    let echo = echo(&host);
    let types = echoed_types(&echo);
    assert!(types.len() >= 20, "{types:?}");
    for (name, ty) in types {
        runner(64)
            .run(&value_of(&ty), |json| {
                let val = from_json(&ty, &json)
                    .map_err(|e| TestCaseError::fail(format!("{name}: {json}: {e}")))?;
                let back = to_json(&ty, val)
                    .map_err(|e| TestCaseError::fail(format!("{name}: {json}: {e}")))?;
                prop_assert_eq!(&back, &json, "{}", name);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn every_generated_value_round_trips_through_a_guest() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let host = host().build().unwrap();
    let echo = echo(&host);
    for (name, ty) in echoed_types(&echo) {
        runner(16)
            .run(&value_of(&ty), |json| {
                let run = runtime.block_on(echo.call(&name).arg(json.clone()).run());
                prop_assert_eq!(run.expect_ok(), &json, "{}", name);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn json_of_the_wrong_shape_is_refused_with_a_path_never_a_panic() {
    let host = host().build().unwrap();
    let echo = echo(&host);
    for (name, ty) in echoed_types(&echo) {
        runner(128)
            .run(&any_json(), |json| {
                if let Err(e) = from_json(&ty, &json) {
                    prop_assert!(e.path.starts_with('$'), "{}: {}", name, e);
                    prop_assert!(!e.message.is_empty(), "{}", name);
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn a_mutated_component_is_refused_clearly_or_loads_never_a_panic() {
    let host = host().build().unwrap();
    let original = std::fs::read(example("greeter")).unwrap();
    let len = original.len();
    let mutation = (
        proptest::collection::vec((0..len, any::<u8>()), 1..6),
        prop_oneof![Just(None), (8..len).prop_map(Some)],
    );
    runner(32)
        .run(&mutation, |(changes, cut)| {
            let mut bytes = original.clone();
            for (at, byte) in changes {
                bytes[at] = byte;
            }
            if let Some(cut) = cut {
                bytes.truncate(cut);
            }
            if let Err(e) = host.load_bytes(&bytes) {
                prop_assert!(!e.to_string().is_empty());
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The shape of a generated WIT type.
#[derive(Debug, Clone)]
enum Shape {
    Primitive(&'static str),
    List(Box<Shape>),
    Option(Box<Shape>),
    Result(Option<Box<Shape>>, Option<Box<Shape>>),
    Tuple(Vec<Shape>),
    Record(Vec<Shape>),
    Variant(Vec<Option<Shape>>),
    Enum(usize),
    Flags(usize),
}

const PRIMITIVES: [&str; 13] = [
    "bool", "s8", "u8", "s16", "u16", "s32", "u32", "s64", "u64", "f32", "f64", "char", "string",
];

/// WIT types of any shape, up to four levels deep.
fn shape() -> impl Strategy<Value = Shape> {
    let leaf = prop_oneof![
        proptest::sample::select(PRIMITIVES.to_vec()).prop_map(Shape::Primitive),
        (1..5usize).prop_map(Shape::Enum),
        (1..9usize).prop_map(Shape::Flags),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        let boxed = inner.clone().prop_map(Box::new);
        let maybe = proptest::option::of(inner.clone().prop_map(Box::new));
        prop_oneof![
            boxed.clone().prop_map(Shape::List),
            boxed.prop_map(Shape::Option),
            (maybe.clone(), maybe).prop_map(|(ok, err)| Shape::Result(ok, err)),
            proptest::collection::vec(inner.clone(), 1..4).prop_map(Shape::Tuple),
            proptest::collection::vec(inner.clone(), 1..4).prop_map(Shape::Record),
            proptest::collection::vec(proptest::option::of(inner), 1..4).prop_map(Shape::Variant),
        ]
    })
}

/// The WAT of `shape` as a type use; named types (records, variants, enums,
/// flags) are defined and imported by name into `defs`, as the component
/// model asks of types in an import's signature.
fn render(shape: &Shape, defs: &mut Vec<String>) -> String {
    let named = |body: String, defs: &mut Vec<String>| {
        let i = defs.len();
        defs.push(format!(
            "(type $d{i} {body}) (import \"t{i}\" (type $t{i} (eq $d{i})))"
        ));
        format!("$t{i}")
    };
    match shape {
        Shape::Primitive(p) => (*p).to_owned(),
        Shape::List(t) => format!("(list {})", render(t, defs)),
        Shape::Option(t) => format!("(option {})", render(t, defs)),
        Shape::Result(ok, err) => {
            let ok = ok.as_ref().map(|t| format!(" {}", render(t, defs)));
            let err = err
                .as_ref()
                .map(|t| format!(" (error {})", render(t, defs)));
            format!(
                "(result{}{})",
                ok.unwrap_or_default(),
                err.unwrap_or_default()
            )
        }
        Shape::Tuple(ts) => {
            let ts: Vec<String> = ts.iter().map(|t| render(t, defs)).collect();
            format!("(tuple {})", ts.join(" "))
        }
        Shape::Record(fields) => {
            let fields: Vec<String> = fields
                .iter()
                .enumerate()
                .map(|(i, t)| format!("(field \"field-{i}\" {})", render(t, defs)))
                .collect();
            named(format!("(record {})", fields.join(" ")), defs)
        }
        Shape::Variant(cases) => {
            let cases: Vec<String> = cases
                .iter()
                .enumerate()
                .map(|(i, t)| match t {
                    Some(t) => format!("(case \"case-{i}\" {})", render(t, defs)),
                    None => format!("(case \"case-{i}\")"),
                })
                .collect();
            named(format!("(variant {})", cases.join(" ")), defs)
        }
        Shape::Enum(n) => {
            let names: Vec<String> = (0..*n).map(|i| format!("\"name-{i}\"")).collect();
            named(format!("(enum {})", names.join(" ")), defs)
        }
        Shape::Flags(n) => {
            let names: Vec<String> = (0..*n).map(|i| format!("\"flag-{i}\"")).collect();
            named(format!("(flags {})", names.join(" ")), defs)
        }
    }
}

/// The wasmtime type of `shape`: the parameter of a function a component
/// imports, the component built from WAT.
fn wit_type(engine: &wasmtime::Engine, shape: &Shape) -> Type {
    let mut defs = Vec::new();
    let ty = render(shape, &mut defs);
    let wat = format!(
        "(component {} (import \"f\" (func (param \"x\" {ty}))))",
        defs.join(" ")
    );
    let bytes = wat::parse_str(&wat).unwrap_or_else(|e| panic!("{wat}: {e:#}"));
    let component = wasmtime::component::Component::new(engine, &bytes)
        .unwrap_or_else(|e| panic!("{wat}: {e:#}"));
    let component_type = component.component_type();
    let (_, item) = component_type
        .imports(engine)
        .find(|(name, _)| *name == "f")
        .unwrap();
    let wasmtime::component::types::ComponentItem::ComponentFunc(func) = item.ty else {
        panic!("{wat}: `f` is not a function")
    };
    func.params().next().unwrap().1
}

#[test]
fn values_of_generated_wit_types_round_trip_and_wrong_json_is_refused_with_a_path() {
    let engine = wasmtime::Engine::default();
    runner(48)
        .run(&shape(), |shape| {
            let ty = wit_type(&engine, &shape);
            runner(16)
                .run(&value_of(&ty), |json| {
                    let val = from_json(&ty, &json)
                        .map_err(|e| TestCaseError::fail(format!("{shape:?}: {json}: {e}")))?;
                    let back = to_json(&ty, val)
                        .map_err(|e| TestCaseError::fail(format!("{shape:?}: {json}: {e}")))?;
                    prop_assert_eq!(&back, &json, "{:?}", shape);
                    Ok(())
                })
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            runner(16)
                .run(&any_json(), |json| {
                    if let Err(e) = from_json(&ty, &json) {
                        prop_assert!(e.path.starts_with('$'), "{:?}: {}", shape, e);
                        prop_assert!(!e.message.is_empty(), "{:?}", shape);
                    }
                    Ok(())
                })
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}
