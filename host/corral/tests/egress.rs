//! Egress rules, secrets and `wasi:config`, attacked from a real guest
//! (`examples/fetch`) against loopback servers that record what arrived:
//! a grant's methods and paths, a name that resolves to a loopback address,
//! a redirect to a host that is not granted, a secret's placeholder sent to
//! the wrong host or echoed back, and settings read through `wasi:config`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use common::egress::{grant, request, secret_file};
use common::http::recording_server;
use common::{example, host};
use corral_core::sandbox::{FailureClass, Secrets};

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
