//! Egress rules, secrets and `wasi:config`, attacked from a real guest
//! (`examples/fetch`) against loopback servers that record what arrived:
//! a grant's methods and paths, a name that resolves to a loopback address,
//! a redirect to a host that is not granted, a secret's placeholder sent to
//! the wrong host or echoed back, and settings read through `wasi:config`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use common::http::recording_server;
use common::{example, host};
use corral_core::sandbox::{FailureClass, HttpGrant, SecretSource, SecretSpec, Secrets};

fn grant(host: &str) -> HttpGrant {
    host.parse().unwrap()
}

fn request(method: &str, url: &str, headers: &[(&str, &str)], follow: bool) -> Value {
    json!({
        "method": method,
        "url": url,
        "headers": headers.iter().map(|(n, v)| json!([n, v])).collect::<Vec<_>>(),
        "body": null,
        "follow-redirects": follow,
    })
}

/// Nothing more arrived at a server (its requests are sent before the
/// response, so a finished task's requests are all in).
fn nothing_more(arrived: &std::sync::mpsc::Receiver<(common::http::Head, String)>) {
    assert!(
        arrived.recv_timeout(Duration::from_millis(50)).is_err(),
        "a request reached the server"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn methods_and_paths_are_enforced_before_anything_is_sent() {
    let (port, arrived) = recording_server(|_| (200, vec![], "ok".into()));
    let rule = grant(&format!("127.0.0.1:{port}"))
        .with_methods(["POST"])
        .unwrap()
        .with_paths(["/v1/charges"])
        .unwrap();
    let host = host().http_grant(rule).build().unwrap();
    let fetch = host.load_file(example("fetch")).unwrap();
    let send = |method: &str, path: &str| {
        let url = format!("http://127.0.0.1:{port}{path}");
        fetch
            .call("demo:fetch/api.send")
            .arg(request(method, &url, &[], false))
            .run()
    };

    let ok = send("POST", "/v1/charges/ch_1?expand=x").await;
    assert_eq!(ok.expect_ok()["status"], 200);
    let (head, _) = arrived.recv().unwrap();
    assert_eq!(head.line, "POST /v1/charges/ch_1?expand=x HTTP/1.1");

    for (method, path) in [
        ("GET", "/v1/charges"),
        ("POST", "/v1/refunds"),
        ("POST", "/v1/chargesX"),
        ("POST", "/v1/charges/../refunds"),
        ("POST", "/v1/charges/%2e%2e/refunds"),
    ] {
        let denied = send(method, path).await;
        let failure = denied.expect_failure(FailureClass::Application);
        assert_eq!(failure.kind, "Denied", "{method} {path}: {failure}");
        // The failure names the rule that refused it.
        assert!(
            failure
                .message
                .contains("outside the method and path rules of grant"),
            "{failure}"
        );
        assert!(failure.message.contains("methods POST paths /v1/charges"));
        nothing_more(&arrived);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_name_that_resolves_to_loopback_is_refused_unless_the_grant_names_the_address() {
    let (port, arrived) = recording_server(|_| (200, vec![], "ok".into()));
    let url = format!("http://localhost:{port}/");
    // Granted by name only: `localhost` resolves to a loopback address,
    // which the grant does not name.
    let by_name = host()
        .http_grant(grant(&format!("localhost:{port}")))
        .build()
        .unwrap();
    let fetch = by_name.load_file(example("fetch")).unwrap();
    let refused = fetch.call("demo:fetch/api.get").arg(json!(url)).run().await;
    let failure = refused.expect_failure(FailureClass::Application);
    assert_eq!(failure.kind, "Prohibited", "{failure}");
    assert!(
        failure
            .message
            .contains("a loopback address, which its grant does not name"),
        "{failure}"
    );
    nothing_more(&arrived);

    // Named: the same request goes out.
    let named = host()
        .http_grant(
            grant(&format!("localhost:{port}"))
                .with_addresses(["127.0.0.0/8", "::1"])
                .unwrap(),
        )
        .build()
        .unwrap();
    let fetch = named.load_file(example("fetch")).unwrap();
    let ok = fetch.call("demo:fetch/api.get").arg(json!(url)).run().await;
    assert_eq!(ok.expect_ok()["status"], 200);
    assert!(arrived.recv().is_ok());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redirect_is_followed_only_to_a_granted_target() {
    let (other, other_arrived) = recording_server(|_| (200, vec![], "other".into()));
    let (port, arrived) = recording_server(move |head| {
        let to = match head.target() {
            "/away" => format!("http://127.0.0.1:{other}/stolen"),
            _ => "/final".to_owned(),
        };
        match head.target() {
            "/final" => (200, vec![], "final".into()),
            _ => (302, vec![("location".into(), to)], String::new()),
        }
    });
    let host = host()
        .http_grant(grant(&format!("127.0.0.1:{port}")))
        .build()
        .unwrap();
    let fetch = host.load_file(example("fetch")).unwrap();
    let send = |path: &str, follow: bool| {
        let url = format!("http://127.0.0.1:{port}{path}");
        fetch
            .call("demo:fetch/api.send")
            .arg(request("GET", &url, &[], follow))
            .run()
    };

    // corral itself never follows: the guest sees the redirect.
    let seen = send("/away", false).await;
    assert_eq!(seen.expect_ok()["status"], 302);
    assert_eq!(
        seen.expect_ok()["location"],
        format!("http://127.0.0.1:{other}/stolen")
    );
    // A guest that follows it makes a request of its own, checked like any.
    let followed = send("/away", true).await;
    let failure = followed.expect_failure(FailureClass::Application);
    assert_eq!(failure.kind, "Denied", "{failure}");
    nothing_more(&other_arrived);
    // A redirect within the grant is followed.
    let within = send("/start", true).await;
    assert_eq!(within.expect_ok()["body"], "final");
    let paths: Vec<String> = arrived
        .try_iter()
        .map(|(h, _)| h.target().to_owned())
        .collect();
    assert_eq!(paths, ["/away", "/away", "/start", "/final"]);
}

/// A secret in a file, sent only to `hosts`.
fn secret_file(dir: &tempfile::TempDir, name: &str, value: &str, hosts: &[String]) -> SecretSpec {
    let path = dir.path().join(name);
    std::fs::write(&path, value).unwrap();
    SecretSpec {
        name: name.into(),
        source: SecretSource::File(path),
        hosts: hosts.iter().map(|h| h.parse().unwrap()).collect(),
        in_query: false,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_secret_reaches_only_its_host_and_never_comes_back_in_clear() {
    const KEY: &str = "sk_live_51HcorralTestKey";
    // The payment API echoes what it was sent, as careless servers do.
    let (pay, pay_arrived) = recording_server(|head| {
        let auth = head.header("authorization").unwrap_or("").to_owned();
        (200, vec![], format!("charged with {auth}"))
    });
    let (other, other_arrived) = recording_server(|_| (200, vec![], "ok".into()));
    let dir = tempfile::tempdir().unwrap();
    let secrets = Secrets::load(vec![secret_file(
        &dir,
        "PAY_KEY",
        KEY,
        &[format!("http://127.0.0.1:{pay}")],
    )])
    .unwrap();
    let tenant = |base: u16| {
        host()
            .http_grant(
                grant(&format!("127.0.0.1:{pay}"))
                    .with_methods(["POST"])
                    .unwrap()
                    .with_paths(["/v1/charges"])
                    .unwrap(),
            )
            .http_grant(grant(&format!("127.0.0.1:{other}")))
            .config("api_base", &format!("http://127.0.0.1:{base}"))
            .config("currency", "EUR")
            .secrets(Arc::new(
                Secrets::load(secrets.specs().cloned().collect()).unwrap(),
            ))
            .build()
            .unwrap()
    };

    let host = tenant(pay);
    let fetch = host.load_file(example("fetch")).unwrap();
    let charged = fetch
        .call("demo:fetch/payments.charge")
        .arg(json!(1250))
        .run()
        .await;
    let answer = charged.expect_ok();
    let (head, body) = pay_arrived.recv().unwrap();
    // The real key went to the secret's host...
    assert_eq!(
        head.header("authorization"),
        Some(&*format!("Bearer {KEY}"))
    );
    assert_eq!(head.line, "POST /v1/charges HTTP/1.1");
    assert_eq!(body, r#"{"amount":1250,"currency":"EUR"}"#);
    // ...the guest only ever had the placeholder, and what the server
    // echoed comes back redacted.
    assert_eq!(answer["body"], "charged with Bearer [secret PAY_KEY]");
    let logged: Vec<&str> = charged.logs.iter().map(|l| l.message.as_str()).collect();
    assert_eq!(logged, ["charging 1250 EUR with corral-secret:PAY_KEY"]);

    // The same activity pointed at another granted host: the placeholder
    // may not go there, so nothing is sent.
    let host = tenant(other);
    let fetch = host.load_file(example("fetch")).unwrap();
    let refused = fetch
        .call("demo:fetch/payments.charge")
        .arg(json!(1250))
        .run()
        .await;
    let failure = refused.expect_failure(FailureClass::Application);
    assert_eq!(failure.kind, "Denied", "{failure}");
    assert!(
        failure.message.contains(
            "carries the placeholder of secret `PAY_KEY`, which may not be sent to this host"
        ),
        "{failure}"
    );
    nothing_more(&other_arrived);
    for text in [failure.to_string(), format!("{:?}", refused.logs)] {
        assert!(!text.contains(KEY), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_reads_its_settings_and_secret_placeholders_through_wasi_config() {
    let (port, arrived) = recording_server(|_| (200, vec![], "ok".into()));
    let host = host()
        .http_host(&format!("127.0.0.1:{port}"))
        .config("api_base", &format!("http://127.0.0.1:{port}/"))
        .build()
        .unwrap();
    let fetch = host.load_file(example("fetch")).unwrap();
    // `currency` is not set: the guest's own error, naming the key.
    let missing = fetch
        .call("demo:fetch/payments.charge")
        .arg(json!(1))
        .run()
        .await;
    let failure = missing.expect_failure(FailureClass::Application);
    assert_eq!(failure.kind, "Config");
    assert!(failure.message.contains("`currency` is not configured"));
    nothing_more(&arrived);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_secret_whose_host_names_no_scheme_is_never_sent_in_clear() {
    const KEY: &str = "sk_live_51HcorralTestKey";
    let (pay, arrived) = recording_server(|_| (200, vec![], "ok".into()));
    let dir = tempfile::tempdir().unwrap();
    // `127.0.0.1:PORT`, not `http://…`: HTTPS only.
    let secrets = Secrets::load(vec![secret_file(
        &dir,
        "PAY_KEY",
        KEY,
        &[format!("127.0.0.1:{pay}")],
    )])
    .unwrap();
    let host = host()
        .http_host(&format!("127.0.0.1:{pay}"))
        .config("api_base", &format!("http://127.0.0.1:{pay}"))
        .config("currency", "EUR")
        .secrets(Arc::new(secrets))
        .build()
        .unwrap();
    let fetch = host.load_file(example("fetch")).unwrap();
    let refused = fetch
        .call("demo:fetch/payments.charge")
        .arg(json!(1250))
        .run()
        .await;
    let failure = refused.expect_failure(FailureClass::Application);
    assert!(
        failure
            .message
            .contains("which may not be sent to this host"),
        "{failure}"
    );
    nothing_more(&arrived);
}

/// Everything corral writes through `tracing` while `test` runs on this
/// thread: its log (`corral serve`'s filter, even at `debug` for corral's
/// own targets) and every span it exports with its fields (the export's
/// filter). wasmtime's own crates are held at `error`, as `corral serve`
/// holds them: at `trace` they log every argument a guest passes.
/// Returned once `until` is among it (or after 10 s without it).
fn traced(test: impl Future<Output = ()>, until: &str) -> String {
    use std::sync::Mutex;
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    let sink = Sink::default();
    let (log, export) = (sink.clone(), sink.clone());
    let log_filter = format!("{},corral=debug", corral::log::SERVER_LOG);
    let subscriber = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || log.clone())
                .with_filter(tracing_subscriber::EnvFilter::new(log_filter)),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
                .with_ansi(false)
                .with_writer(move || export.clone())
                .with_filter(corral::telemetry::exported()),
        );
    let _default = tracing::subscriber::set_default(subscriber);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(test);
    // An `http` span is written when it closes, and it closes when the
    // task's request is dropped: on the host's runtime, possibly just after
    // the outcome came back. Wait for that line (a few seconds at most).
    let written = || String::from_utf8_lossy(&sink.0.lock().unwrap()).into_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !written().contains(until) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    written()
}

#[test]
fn a_secret_a_guest_learned_is_never_written_in_clear_in_the_log_or_a_span() {
    // A guest that learned the key (an API echoed it) puts it in a path,
    // as written and percent-encoded, and in a query: under the grant's
    // path rule (an `http` span's url) and outside it (a refusal in the
    // host's log).
    const KEY: &str = "sk_live_51Hcorral:TestKey";
    let (pay, _arrived) = recording_server(|_| (200, vec![], "ok".into()));
    let dir = tempfile::tempdir().unwrap();
    let secrets = Secrets::load(vec![secret_file(
        &dir,
        "PAY_KEY",
        KEY,
        &[format!("http://127.0.0.1:{pay}")],
    )])
    .unwrap();
    let host = host()
        .http_grant(
            grant(&format!("127.0.0.1:{pay}"))
                .with_paths(["/v1"])
                .unwrap(),
        )
        .secrets(Arc::new(secrets))
        .build()
        .unwrap();
    let fetch = host.load_file(example("fetch")).unwrap();
    let encoded = KEY.replace(':', "%3A");
    let urls = [
        format!("http://127.0.0.1:{pay}/v1/{KEY}"),
        format!("http://127.0.0.1:{pay}/v1/{encoded}"),
        format!("http://127.0.0.1:{pay}/elsewhere/{KEY}"),
        format!("http://127.0.0.1:{pay}/elsewhere/{encoded}"),
        format!("http://127.0.0.1:{pay}/v1/q?k={KEY}"),
    ];
    let written = traced(
        async {
            for url in &urls {
                let _ = fetch
                    .call("demo:fetch/api.send")
                    .arg(request("GET", url, &[], false))
                    .run()
                    .await;
            }
        },
        "url=GET",
    );
    assert!(written.contains("outbound HTTP refused"), "{written}");
    assert!(written.contains("url=GET"), "{written}");
    assert!(written.contains("[secret PAY_KEY]"), "{written}");
    for clear in [KEY, encoded.as_str(), "51Hcorral"] {
        assert!(!written.contains(clear), "{clear} in:\n{written}");
    }
}
