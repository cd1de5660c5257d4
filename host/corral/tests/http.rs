//! Outbound HTTP (`wasi:http`): granted per tenant and per destination.
//! A guest reaches a granted loopback server; any other destination is
//! denied before a connection is made; a tenant without grants loads a
//! component that imports `wasi:http`, and every request it makes is denied.

mod common;

use std::io::Write;

use serde_json::json;

use common::activities::{execute, execute_completed, text};
use common::admin::{Host, path};
use common::http::loopback_server;
use common::{example, host};
use corral_core::sandbox::FailureClass;

/// A loopback HTTP server answering every request with its own path.
fn echo_server() -> u16 {
    loopback_server(|head, _, mut stream| {
        let path = head.target();
        let body = format!("you asked for {path}");
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_reaches_granted_hosts_only() {
    let port = echo_server();
    let other = echo_server();
    let host = host()
        .http_host(&format!("127.0.0.1:{port}"))
        .build()
        .unwrap();
    let fetch = host.load_file(example("fetch")).unwrap();
    let get = |url: String| fetch.call("demo:fetch/api.get").arg(json!(url)).run();

    let ok = get(format!("http://127.0.0.1:{port}/granted?x=1")).await;
    assert_eq!(
        *ok.expect_ok(),
        json!({"status": 200, "body": "you asked for /granted?x=1"})
    );
    // Same address, another port: denied, and nothing reaches that server.
    for url in [
        format!("http://127.0.0.1:{other}/"),
        format!("http://localhost:{port}/"),
        "https://example.com/".to_owned(),
    ] {
        let denied = get(url.clone()).await;
        let failure = denied.expect_failure(FailureClass::Application);
        assert_eq!(failure.kind, "Denied", "{url}: {failure}");
        assert!(!failure.retryable);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_sends_at_most_its_limit_of_requests() {
    let port = echo_server();
    let url = format!("http://127.0.0.1:{port}/");
    let run = |limit: u32| {
        let host = host()
            .http_host(&format!("127.0.0.1:{port}"))
            .max_http_requests(limit)
            .build()
            .unwrap();
        let fetch = host.load_file(example("fetch")).unwrap();
        let url = url.clone();
        async move { fetch.call("demo:fetch/api.get").arg(json!(url)).run().await }
    };
    run(1).await.expect_ok();
    // The limit spent: the request fails in the guest, as the host's
    // `connection-limit-reached`.
    let spent = run(0).await;
    let failure = spent.expect_failure(FailureClass::Application);
    assert_eq!(failure.kind, "Http", "{failure}");
    assert!(
        failure.message.contains("ConnectionLimitReached"),
        "{failure}"
    );
}

/// A loopback server whose every response body never ends: it writes 64 KiB
/// chunks until the client goes away, then sends how many bytes it wrote.
fn endless_server() -> (u16, std::sync::mpsc::Receiver<u64>) {
    let (written, total) = std::sync::mpsc::channel();
    let port = loopback_server(move |_, _, mut stream| {
        let chunk = vec![b'x'; 64 << 10];
        let mut sent = 0u64;
        if stream
            .write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n")
            .is_ok()
        {
            while stream.write_all(&chunk).is_ok() {
                sent += chunk.len() as u64;
            }
        }
        let _ = written.send(sent);
    });
    (port, total)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_response_body_that_never_ends_is_cut_off_at_the_tasks_byte_limit() {
    const LIMIT: u64 = 1 << 20;
    let (port, written) = endless_server();
    let host = host()
        .http_host(&format!("127.0.0.1:{port}"))
        .max_http_bytes(LIMIT)
        .build()
        .unwrap();
    let fetch = host.load_file(example("fetch")).unwrap();
    let run = fetch
        .call("demo:fetch/api.get")
        .arg(json!(format!("http://127.0.0.1:{port}/")))
        .run()
        .await;
    // Without the limit the guest reads on until its memory limit or its
    // deadline ends it.
    let failure = run.expect_failure(FailureClass::Application);
    assert_eq!(failure.kind, "Http", "{failure}");
    assert!(
        failure
            .message
            .contains(&format!("response body size exceeds limit: {LIMIT} bytes")),
        "{failure}"
    );
    // The host let the connection go: the server's writes stopped after the
    // limit plus what loopback socket buffers hold.
    let sent = tokio::task::spawn_blocking(move || written.recv().unwrap())
        .await
        .unwrap();
    assert!(sent < LIMIT + (32 << 20), "the server wrote {sent} bytes");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_without_grants_loads_an_http_component_whose_requests_are_denied() {
    let port = echo_server();
    let host = host().build().unwrap();
    let fetch = host.load_file(example("fetch")).unwrap();
    let run = fetch
        .call("demo:fetch/api.get")
        .arg(json!(format!("http://127.0.0.1:{port}/")))
        .run()
        .await;
    let failure = run.expect_failure(FailureClass::Application);
    assert_eq!(failure.kind, "Denied", "{failure}");
}

#[test]
fn served_tenants_get_their_own_grants() {
    let port = echo_server();
    let host = Host::new("");
    let grant = format!(r#"capabilities = {{ http_hosts = ["127.0.0.1:{port}"] }}"#);
    let corral = host.serve([&grant, ""]);
    let fetch = path(&example("fetch"));

    // alpha is granted the server: deployed, and it reaches it through
    // Temporal and through the admin API's Run.
    let out = host.cli(&host.tokens[0].token, &["deploy", &fetch]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("outbound HTTP: granted: 127.0.0.1:{port}")),
        "{}",
        text(&out)
    );
    let url = format!(r#""http://127.0.0.1:{port}/via-temporal""#);
    let done = execute_completed(
        &host.server,
        &corral,
        &host.queues[0],
        "demo:fetch/api.get",
        &[&url],
    );
    assert_eq!(done["body"], "you asked for /via-temporal", "{done}");
    let url = format!(r#""http://127.0.0.1:{}/elsewhere""#, echo_server());
    let (_, denied) = execute(
        &host.server,
        &host.queues[0],
        "demo:fetch/api.get",
        &[&url],
        &["--retry-maximum-attempts", "1"],
    );
    assert_eq!(denied["status"], "FAILED", "{denied}");
    assert!(denied.to_string().contains("Denied"), "{denied}");

    // beta is not granted outbound HTTP: the component deploys (language
    // runtimes import wasi:http whether or not they use it), and every
    // request it makes is denied.
    let out = host.cli(&host.tokens[1].token, &["deploy", &fetch, "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let deployed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        deployed["outbound_http"], "none granted: every request will be denied",
        "{deployed}"
    );
    let url = format!(r#""http://127.0.0.1:{port}/from-beta""#);
    let (_, denied) = execute(
        &host.server,
        &host.queues[1],
        "demo:fetch/api.get",
        &[&url],
        &["--retry-maximum-attempts", "1"],
    );
    assert_eq!(denied["status"], "FAILED", "{denied}");
    assert!(denied.to_string().contains("Denied"), "{denied}");
}

#[test]
fn corral_run_without_a_grant_denies_every_request() {
    let port = echo_server();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
        .args([
            "run",
            &path(&example("fetch")),
            "demo:fetch/api.get",
            &format!(r#""http://127.0.0.1:{port}/""#),
            "--json",
        ])
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    let failure: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(failure["kind"], "Denied", "{said}");
}

#[test]
fn inspect_says_what_outbound_http_a_component_may_get() {
    let inspect = |name: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(["inspect", &path(&example(name))])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let fetch = inspect("fetch");
    assert!(
        fetch.contains("outbound HTTP: imports wasi:http") && fetch.contains("none by default"),
        "{fetch}"
    );
    assert!(!inspect("greeter").contains("outbound HTTP"));
}
