//! A keyed API called end to end through `corral serve` and a real Temporal
//! dev server: the tenant's `config`, a deployment's own `--config` over
//! it, a secret from a file substituted only on its way to its host,
//! rotated by SIGHUP without a restart, and its value absent from every
//! line corral wrote and from what the workflow got back.

mod common;

use serde_json::Value;

use common::admin::{Host, path};
use common::example;
use common::http::recording_server;

/// SIGHUP, as an operator sends it after rotating a secret.
fn hangup(corral: &common::processes::Corral) {
    let sent = std::process::Command::new("kill")
        .args(["-HUP", &corral.pid().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

const FIRST: &str = "sk_live_first_0123456789";
const SECOND: &str = "sk_live_second_9876543210";

#[test]
fn a_keyed_api_gets_the_key_the_guest_and_the_logs_never_see() {
    // The API echoes the authorization it got, as careless servers do.
    let (pay, arrived) = recording_server(|head| {
        let auth = head.header("authorization").unwrap_or("").to_owned();
        (200, vec![], format!("charged with {auth}"))
    });
    let secrets = tempfile::tempdir().unwrap();
    let key_file = secrets.path().join("pay.key");
    std::fs::write(&key_file, format!("{FIRST}\n")).unwrap();
    let host = Host::new(r#"secret_refresh = "1h""#);
    let alpha = format!(
        r#"config = {{ api_base = "http://127.0.0.1:{pay}", currency = "EUR" }}
secrets = {{ PAY_KEY = {{ file = {file:?}, hosts = ["http://127.0.0.1:{pay}"] }} }}
capabilities = {{ http_hosts = [{{ host = "127.0.0.1:{pay}", methods = ["POST"], paths = ["/v1/charges"] }}] }}"#,
        file = path(&key_file),
    );
    let mut corral = host.serve([&alpha, ""]);
    let fetch = path(&example("fetch"));
    host.alpha(&["deploy", &fetch, "--json"]);
    let charge = |amount: &str| -> Value {
        let out = host.run(0, "demo:fetch/payments.charge", &[amount]);
        assert_eq!(out["status"], "COMPLETED", "{out}\n{}", corral.stderr());
        out["result"].clone()
    };

    // The tenant's config and the first key.
    let answer = charge("100");
    let (head, body) = arrived.recv().unwrap();
    assert_eq!(
        head.header("authorization"),
        Some(&*format!("Bearer {FIRST}"))
    );
    assert_eq!(body, r#"{"amount":100,"currency":"EUR"}"#);
    assert_eq!(answer["body"], "charged with Bearer [secret PAY_KEY]");

    // The same bytes deployed with a setting of their own: it wins over
    // the tenant's, and describe shows it.
    let deployed = host.alpha(&["deploy", &fetch, "--config", "currency=USD", "--json"]);
    assert_eq!(
        deployed["config"],
        serde_json::json!({"currency": "USD"}),
        "{deployed}"
    );
    charge("200");
    let (_, body) = arrived.recv().unwrap();
    assert_eq!(body, r#"{"amount":200,"currency":"USD"}"#);

    // Rotated in its file; SIGHUP re-reads it, no restart.
    std::fs::write(&key_file, SECOND).unwrap();
    hangup(&corral);
    corral.await_logged("secrets re-read (SIGHUP)", 1);
    let answer = charge("300");
    let (head, _) = arrived.recv().unwrap();
    assert_eq!(
        head.header("authorization"),
        Some(&*format!("Bearer {SECOND}"))
    );
    assert_eq!(answer["body"], "charged with Bearer [secret PAY_KEY]");

    // A rotation to a value corral cannot use keeps the last good one and
    // says which secret, never what it holds.
    std::fs::write(&key_file, "x7y8z9q").unwrap();
    hangup(&corral);
    corral.await_logged("secrets re-read (SIGHUP)", 2);
    charge("400");
    let (head, _) = arrived.recv().unwrap();
    assert_eq!(
        head.header("authorization"),
        Some(&*format!("Bearer {SECOND}"))
    );

    let digest = deployed["digest"].as_str().unwrap().to_owned();
    let described = host.alpha(&["describe", &digest, "--json"]);
    corral.terminate(std::time::Duration::from_secs(10));
    let logs = format!("{}\n{}", corral.stdout(), corral.stderr());
    assert!(
        logs.contains("charging 100 EUR with corral-secret:PAY_KEY"),
        "the guest's log line is in corral's log:\n{logs}"
    );
    assert!(logs.contains("secret `PAY_KEY`"), "{logs}");
    for value in [FIRST, SECOND, "x7y8z9q"] {
        assert!(!logs.contains(value), "`{value}` in corral's log:\n{logs}");
        assert!(!described.to_string().contains(value), "{described}");
    }
}
