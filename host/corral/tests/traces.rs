//! The README's keyed-API activity, traced: a workflow run by the Python
//! SDK with its OpenTelemetry `TracingInterceptor` calls
//! `demo:fetch/payments.charge` on `corral serve`, which exports its spans
//! over OTLP to a receiver in this test. corral's task span is a child of
//! the SDK's `StartActivity` span, its children cover the guest's run and
//! its request, whose `traceparent` names the request's own span; the
//! guest's log line is an event, and the secret's value is in none of it.

mod common;

use std::time::Duration;

use serde_json::Value;

use common::activities::unique;
use common::admin::path;
use common::example;
use common::http::recording_server;
use common::otlp::{Receiver, Span};
use common::processes::Corral;
use common::temporal::TemporalServer;

const KEY: &str = "sk_live_traced_0123456789";

#[test]
fn a_traced_workflow_s_activity_span_has_corral_s_task_as_its_child() {
    let receiver = Receiver::start();
    let (pay, arrived) = recording_server(|_| (200, vec![], "charged".into()));
    let server = TemporalServer::start();
    let queue = unique("traced");
    let secrets = tempfile::tempdir().unwrap();
    let key_file = secrets.path().join("pay.key");
    std::fs::write(&key_file, KEY).unwrap();
    let config = format!(
        r#"
[host]
shutdown_grace = "5s"
tracing = {{ otlp_endpoint = "http://127.0.0.1:{otlp}" }}

[[tenant]]
name = "acme"
temporal = {{ address = "http://{address}", namespace = "default", task_queue = "{queue}" }}
components = [{fetch:?}]
config = {{ api_base = "http://127.0.0.1:{pay}", currency = "EUR" }}
secrets = {{ PAY_KEY = {{ file = {file:?}, hosts = ["http://127.0.0.1:{pay}"] }} }}
capabilities = {{ http_hosts = [{{ host = "127.0.0.1:{pay}", methods = ["POST"], paths = ["/v1/charges"] }}] }}
"#,
        otlp = receiver.port,
        address = server.address(),
        fetch = path(&example("fetch")),
        file = path(&key_file),
    );
    // A quiet log: the export has a filter of its own.
    let mut corral = Corral::serve_with(&[("CORRAL_LOG", "warn")], &config);

    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/workflows/traced.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .args(["--address", &server.address(), "--activity-queue", &queue])
        .args(["--activity", "demo:fetch/payments.charge", "--arg", "1250"])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        corral.stderr()
    );
    let run: Value = serde_json::from_slice(&out.stdout).expect("the script prints JSON");
    assert_eq!(run["result"]["status"], 200, "{run}");
    let (head, _) = arrived.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        head.header("authorization"),
        Some(&*format!("Bearer {KEY}"))
    );

    // The SDK's span that scheduled the activity.
    let sdk: Vec<Value> = run["spans"].as_array().unwrap().clone();
    let start = sdk
        .iter()
        .find(|s| s["name"] == "StartActivity:demo:fetch/payments.charge")
        .unwrap_or_else(|| panic!("no StartActivity span: {sdk:#?}"));

    // corral's, as exported (they come in batches: wait for the task's,
    // which ends last, after its report).
    let spans = receiver.await_span(|s| s.name == "task");
    let one = |name: &str| -> &Span {
        let named: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
        assert_eq!(named.len(), 1, "{name}: {spans:#?}");
        named[0]
    };
    let task = one("task");
    assert_eq!(task.trace_id, start["trace_id"].as_str().unwrap());
    assert_eq!(task.parent_id, start["span_id"].as_str().unwrap());
    assert_eq!(task.attributes["tenant"], "acme");
    assert_eq!(
        task.attributes["activity_type"],
        "demo:fetch/payments.charge"
    );
    assert_eq!(task.attributes["attempt"], "1");
    assert_eq!(task.attributes["outcome"], "Completed");
    for child in ["permits", "instantiate", "guest"] {
        let span = one(child);
        assert_eq!(span.parent_id, task.span_id, "{child}");
        assert_eq!(span.trace_id, task.trace_id, "{child}");
    }
    let guest = one("guest");
    let http = one("http");
    assert_eq!(http.parent_id, guest.span_id);
    assert_eq!(http.attributes["status"], "200");
    assert_eq!(http.attributes["method"], "POST");
    // The request told the API which span it came from.
    let traceparent = head.header("traceparent").expect("a traceparent header");
    assert_eq!(
        traceparent,
        format!("00-{}-{}-01", http.trace_id, http.span_id)
    );
    // The guest's log line is an event of its run, with the placeholder.
    assert!(
        guest
            .events
            .iter()
            .any(|(message, _)| message == "charging 1250 EUR with corral-secret:PAY_KEY"),
        "{guest:#?}"
    );
    assert!(!format!("{spans:?}").contains(KEY));
    corral.terminate(Duration::from_secs(10));
}
