//! JSON ⇄ WIT round trips through a real guest (`demo:echo`) for every WIT
//! type, and the error path of each.

mod common;

use corral_core::sandbox::FailureClass;
use corral_core::testing::TestComponent;
use serde_json::{Value, json};

use common::{host, load};

fn echo() -> TestComponent {
    let host = host().build().unwrap();
    load(&host, "echo")
}

async fn call(echo: &TestComponent, function: &str, arg: Value) -> Result<Value, String> {
    let run = echo
        .call(&format!("demo:echo/api.{function}"))
        .arg(arg)
        .run()
        .await;
    match run.outcome {
        Ok(value) => Ok(value),
        Err(f) => {
            assert_eq!(f.class, FailureClass::InvalidInput, "{f}");
            Err(f.message)
        }
    }
}

/// `value` goes in and comes back unchanged.
async fn round_trip(echo: &TestComponent, function: &str, value: Value) {
    assert_eq!(
        call(echo, function, value.clone()).await,
        Ok(value),
        "{function}"
    );
}

/// `input` comes back as `output` (a normalised form).
async fn normalises(echo: &TestComponent, function: &str, input: Value, output: Value) {
    assert_eq!(call(echo, function, input).await, Ok(output), "{function}");
}

/// `value` is refused with exactly `message` (after "parameter `v`: ").
async fn refused(echo: &TestComponent, function: &str, value: Value, message: &str) {
    let got = call(echo, function, value).await;
    assert_eq!(got, Err(format!("parameter `v`: {message}")), "{function}");
}

#[tokio::test(flavor = "multi_thread")]
async fn booleans_and_integers_of_every_width_round_trip_and_are_range_checked() {
    let e = echo();
    round_trip(&e, "echo-bool", json!(true)).await;
    refused(&e, "echo-bool", json!(1), "$: expected bool, got 1").await;
    let cases: [(&str, i128, i128); 8] = [
        ("s8", i8::MIN.into(), i8::MAX.into()),
        ("u8", 0, u8::MAX.into()),
        ("s16", i16::MIN.into(), i16::MAX.into()),
        ("u16", 0, u16::MAX.into()),
        ("s32", i32::MIN.into(), i32::MAX.into()),
        ("u32", 0, u32::MAX.into()),
        ("s64", i64::MIN.into(), i64::MAX.into()),
        ("u64", 0, u64::MAX.into()),
    ];
    for (name, min, max) in cases {
        let function = format!("echo-{name}");
        let parse = |n: i128| serde_json::from_str::<Value>(&n.to_string()).unwrap();
        round_trip(&e, &function, parse(min)).await;
        round_trip(&e, &function, parse(max)).await;
        for outside in [min - 1, max + 1] {
            let value = serde_json::from_str::<Value>(&outside.to_string()).unwrap();
            let got = call(&e, &function, value).await.unwrap_err();
            assert!(
                got.starts_with(&format!("parameter `v`: $: expected {name}, got")),
                "{got}"
            );
        }
        refused(
            &e,
            &function,
            json!("7"),
            &format!("$: expected {name}, got string \"7\""),
        )
        .await;
        refused(
            &e,
            &function,
            json!(1.5),
            &format!("$: expected {name}, got 1.5"),
        )
        .await;
    }
    // A whole number written as a float is accepted.
    normalises(&e, "echo-u32", json!(3.0), json!(3)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn floats_round_trip_including_non_finite_values() {
    let e = echo();
    round_trip(&e, "echo-f64", json!(1.25)).await;
    round_trip(&e, "echo-f32", json!(-2.5)).await;
    for special in ["NaN", "Infinity", "-Infinity"] {
        round_trip(&e, "echo-f64", json!(special)).await;
        round_trip(&e, "echo-f32", json!(special)).await;
    }
    refused(
        &e,
        "echo-f32",
        json!(1e300),
        "$: 1e+300 is out of range for f32",
    )
    .await;
    refused(
        &e,
        "echo-f64",
        json!("fast"),
        "$: expected f64, got string \"fast\"",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn chars_and_strings_round_trip() {
    let e = echo();
    round_trip(&e, "echo-char", json!("é")).await;
    round_trip(&e, "echo-string", json!("héllo \"world\" \n ✓")).await;
    refused(
        &e,
        "echo-char",
        json!("ab"),
        "$: expected char (a one-character string), got string \"ab\"",
    )
    .await;
    refused(
        &e,
        "echo-string",
        json!(null),
        "$: expected string, got null",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bytes_travel_as_base64_and_are_accepted_as_arrays() {
    let e = echo();
    round_trip(&e, "echo-bytes", json!("AAEC/w==")).await;
    normalises(&e, "echo-bytes", json!([0, 1, 2, 255]), json!("AAEC/w==")).await;
    normalises(&e, "echo-bytes", json!([]), json!("")).await;
    let got = call(&e, "echo-bytes", json!("not base64!"))
        .await
        .unwrap_err();
    assert!(
        got.starts_with("parameter `v`: $: expected list<u8> as a base64 string"),
        "{got}"
    );
    refused(
        &e,
        "echo-bytes",
        json!([1, 256]),
        "$[1]: expected u8, got 256",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lists_and_tuples_round_trip() {
    let e = echo();
    round_trip(&e, "echo-list", json!([[1, 2], [], [-3]])).await;
    refused(
        &e,
        "echo-list",
        json!([[1], [2, "x"]]),
        "$[1][1]: expected s32, got string \"x\"",
    )
    .await;
    refused(
        &e,
        "echo-list",
        json!({"a": 1}),
        "$: expected array, got object {\"a\":1}",
    )
    .await;
    round_trip(&e, "echo-tuple", json!([7, "seven", true])).await;
    refused(
        &e,
        "echo-tuple",
        json!([7, "seven"]),
        "$: expected a tuple of 3 elements, got 2",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn records_use_kebab_case_and_accept_snake_and_camel_case() {
    let e = echo();
    let person = json!({"first-name": "Ada", "max-count": 3, "nick": "countess", "tags": ["math"]});
    round_trip(&e, "echo-record", person.clone()).await;
    normalises(
        &e,
        "echo-record",
        json!({"first_name": "Ada", "max_count": 3, "nick": "countess", "tags": ["math"]}),
        person.clone(),
    )
    .await;
    normalises(
        &e,
        "echo-record",
        json!({"firstName": "Ada", "maxCount": 3, "nick": "countess", "tags": ["math"]}),
        person,
    )
    .await;
    // A missing option field is none.
    normalises(
        &e,
        "echo-record",
        json!({"firstName": "Ada", "maxCount": 3, "tags": []}),
        json!({"first-name": "Ada", "max-count": 3, "nick": null, "tags": []}),
    )
    .await;
    refused(
        &e,
        "echo-record",
        json!({"firstName": "Ada", "tags": []}),
        "$: missing field \"max-count\"",
    )
    .await;
    refused(
        &e,
        "echo-record",
        json!({"firstName": "Ada", "maxCount": 3, "tags": [], "age": 36}),
        "$: unknown field \"age\" (expected \"first-name\", \"max-count\", \"nick\", \"tags\")",
    )
    .await;
    refused(
        &e,
        "echo-record",
        json!({"firstName": "Ada", "maxCount": 3, "tags": [1]}),
        "$.tags[0]: expected string, got 1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn variants_are_strings_or_single_key_objects() {
    let e = echo();
    round_trip(&e, "echo-variant", json!("point")).await;
    round_trip(&e, "echo-variant", json!({"circle": 2.5})).await;
    round_trip(&e, "echo-variant", json!({"rect": [1.0, 2.0]})).await;
    round_trip(
        &e,
        "echo-variant",
        json!({"named": {"first-name": "A", "max-count": 1, "nick": null, "tags": []}}),
    )
    .await;
    refused(
        &e,
        "echo-variant",
        json!("circle"),
        "$: case \"circle\" carries a payload: write {\"circle\": …}",
    )
    .await;
    refused(
        &e,
        "echo-variant",
        json!({"point": 1}),
        "$: case \"point\" has no payload: write \"point\"",
    )
    .await;
    refused(
        &e,
        "echo-variant",
        json!("hexagon"),
        "$: unknown case \"hexagon\" (expected one of \"point\", \"circle\", \"rect\", \"named\")",
    )
    .await;
    refused(
        &e,
        "echo-variant",
        json!({"circle": "big"}),
        "$.circle: expected f64, got string \"big\"",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn enums_and_flags_are_names() {
    let e = echo();
    round_trip(&e, "echo-enum", json!("light-blue")).await;
    normalises(&e, "echo-enum", json!("lightBlue"), json!("light-blue")).await;
    refused(
        &e,
        "echo-enum",
        json!("purple"),
        "$: unknown case \"purple\" (expected one of \"red\", \"green\", \"light-blue\")",
    )
    .await;
    round_trip(&e, "echo-flags", json!(["read", "exec-all"])).await;
    round_trip(&e, "echo-flags", json!([])).await;
    normalises(
        &e,
        "echo-flags",
        json!(["exec_all", "read", "read"]),
        json!(["read", "exec-all"]),
    )
    .await;
    refused(
        &e,
        "echo-flags",
        json!(["read", "fly"]),
        "$[1]: expected one of \"read\", \"write\", \"exec-all\", got string \"fly\"",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn options_are_null_or_the_value_and_results_are_ok_or_err_objects() {
    let e = echo();
    round_trip(&e, "echo-option", json!(null)).await;
    round_trip(&e, "echo-option", json!(5)).await;
    refused(
        &e,
        "echo-option",
        json!("5"),
        "$: expected u32, got string \"5\"",
    )
    .await;
    round_trip(&e, "echo-results", json!([{"ok": 1}, {"err": "no"}])).await;
    refused(
        &e,
        "echo-results",
        json!([{"ok": 1}, {"fine": 2}]),
        "$[1]: expected {\"ok\": …} or {\"err\": …}, got object {\"fine\":2}",
    )
    .await;
    refused(
        &e,
        "echo-results",
        json!([{"err": 3}]),
        "$[0].err: expected string, got 3",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_function_without_result_returns_null() {
    let e = echo();
    let run = e
        .call("demo:echo/api.nothing")
        .args([json!(1), json!("x")])
        .run()
        .await;
    assert_eq!(run.expect_ok(), &Value::Null);
    let run = e
        .call("demo:echo/api.nothing")
        .args([json!(1), json!(2)])
        .run()
        .await;
    assert_eq!(
        run.expect_failure(FailureClass::InvalidInput).message,
        "parameter `b`: $: expected string, got 2"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sample_value_of_every_parameter_type_is_accepted() {
    // `corral dev` prints these as ready-to-run inputs: they must fit.
    let e = echo();
    for activity in e.activity_types() {
        let args = activity
            .params
            .iter()
            .map(|(_, ty)| corral_core::sandbox::convert::sample(ty));
        let run = e.call(&activity.name).args(args).run().await;
        assert!(run.outcome.is_ok(), "{}: {:?}", activity.name, run.outcome);
    }
}
