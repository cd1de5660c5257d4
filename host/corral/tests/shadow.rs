//! Shadow replay end to end: the real `corral` binary serving a real
//! Temporal dev server records a tenant's real attempts, and a new version
//! replays them before it serves; its outbound HTTP is answered from the
//! recording, which never holds the tenant's secret.

mod common;

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use common::activities::{json_of, text};
use common::admin::{Host, path};
use common::example;
use common::http::recording_server;

const HOLD: &str = "demo:versioned/api.hold";
const CHARGE: &str = "demo:fetch/payments.charge";
const GET: &str = "demo:fetch/api.get";
const KEY: &str = "sk_live_shadow_0123456789";

/// Every attempt the host keeps for `tenant` on disk.
fn recorded(host: &Host, tenant: &str) -> Vec<Value> {
    let file = host
        .data
        .path()
        .join("shadow")
        .join(format!("{}.json", hex::encode(tenant)));
    let bytes = std::fs::read(&file).unwrap_or_default();
    serde_json::from_slice(&bytes).unwrap_or_default()
}

#[test]
fn a_regression_no_signature_shows_is_caught_by_replaying_real_attempts_and_held() {
    let host = Host::new("");
    let rollout = format!(
        r#"rollout = {{ shadow = {{ types = ["{HOLD}"], sample = 10, min_agreement = 100 }} }}"#
    );
    let mut corral = host.serve([&rollout, ""]);
    let v1 = host.alpha(&["deploy", &path(&example("versioned")), "--json"]);
    assert_eq!(v1["active"], true, "{v1}");
    let v1_digest = v1["digest"].as_str().unwrap().to_owned();

    // Real traffic through Temporal: each attempt is recorded before its
    // result is reported.
    for ms in ["0", "20", "0"] {
        assert_eq!(host.run(0, HOLD, &[ms])["result"], "v1");
    }
    let operator = |args: &[&str]| host.cli(&host.operator.token, args);
    let status = json_of(&operator(&["status", "--json", "--tenant", "alpha"]));
    assert_eq!(
        status["tenants"][0]["recorded"][0]["name"], HOLD,
        "{status}"
    );
    assert_eq!(
        status["tenants"][0]["recorded"][0]["attempts"], 3,
        "{status}"
    );

    // The sample outlives a restart.
    assert_eq!(corral.terminate(Duration::from_secs(20)), Some(0));
    assert_eq!(recorded(&host, "alpha").len(), 3);
    let _corral = host.serve([&rollout, ""]);

    // v3 keeps every signature (the change report and the author's own
    // signature checks see nothing), but `hold(0)` traps: the replay of
    // the real attempts finds it, and the gate holds v3.
    let v3 = host.alpha(&["deploy", &path(&example("v3/versioned")), "--json"]);
    assert_eq!(v3["active"], false, "{v3}");
    assert_eq!(v3["changes"]["breaks_callers"], false, "{v3}");
    let replayed = &v3["changes"]["replayed"][0];
    assert_eq!(replayed["name"], HOLD, "{v3}");
    assert_eq!(replayed["replayed"], 3, "{v3}");
    assert_eq!(replayed["unsteady"], 0, "{v3}");
    assert_eq!(replayed["agreed"], 0, "{v3}");
    assert_eq!(replayed["new_failures"], 2, "{v3}");
    let differences: Vec<&str> = replayed["differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert!(
        differences[0].starts_with("attempt 1 of 3 (recorded ")
            && differences[0].ends_with("Completed when recorded, Panic now"),
        "{v3}"
    );
    assert!(
        differences[1].ends_with("Completed both times, another result"),
        "{v3}"
    );
    assert!(replayed["fuel_active"].as_u64().unwrap() > 0, "{v3}");
    // The cost, for the record (`--nocapture`): what an attempt takes to
    // store, and to replay on each version.
    let bytes = &status["tenants"][0]["recorded"][0]["bytes"];
    eprintln!(
        "shadow cost: {bytes} bytes for 3 recorded attempts of hold; per replayed attempt: {} µs, {} fuel on the active version, {} µs, {} fuel on the candidate",
        replayed["micros_active"],
        replayed["fuel_active"],
        replayed["micros_candidate"],
        replayed["fuel_candidate"]
    );
    let held = v3["held"][0].as_str().unwrap();
    assert!(
        held.starts_with(&format!(
            "shadow replay under 100% agreement: {HOLD} agreed on 0 of 3 recorded attempts (0%); attempt 1 of 3"
        )),
        "{v3}"
    );
    // v1 goes on serving, and the replay's own tasks were not recorded.
    assert_eq!(host.run(0, HOLD, &["0"])["result"], "v1");
    let status = json_of(&operator(&["status", "--json", "--tenant", "alpha"]));
    assert_eq!(
        status["tenants"][0]["active"]["versioned"],
        v1_digest.as_str()
    );
    assert_eq!(
        status["tenants"][0]["recorded"][0]["attempts"], 4,
        "{status}"
    );

    // Removed and deployed again, v3 is replayed again (on the attempts
    // recorded since too), held again, and `deploy` says so to a person.
    let v3_digest = v3["digest"].as_str().unwrap();
    host.alpha(&["rm", v3_digest, "--json"]);
    let said = host.cli(
        &host.tokens[0].token,
        &["deploy", &path(&example("v3/versioned"))],
    );
    let said = String::from_utf8_lossy(&said.stdout).into_owned();
    assert!(
        said.contains(&format!(
            "replayed: {HOLD}: 0 of 4 recorded attempts agreed (0 not compared)"
        )) && said.contains("Completed when recorded, Panic now"),
        "{said}"
    );
    assert!(said.contains("held"), "{said}");

    // With the active version removed, a new version is compared with the
    // recording alone, and the report says so (no `against`).
    host.alpha(&["rm", "--force", &v1_digest, "--json"]);
    let v2 = host.alpha(&["deploy", &path(&example("v2/versioned")), "--json"]);
    assert_eq!(v2["active"], false, "{v2}");
    assert_eq!(v2["changes"].get("against"), None, "{v2}");
    let replayed = &v2["changes"]["replayed"][0];
    assert_eq!(
        (
            &replayed["replayed"],
            &replayed["agreed"],
            &replayed["unsteady"]
        ),
        (&json!(4), &json!(0), &json!(0)),
        "{v2}"
    );
    assert!(
        replayed["differences"][0]
            .as_str()
            .unwrap()
            .ends_with("Completed both times, another result"),
        "{v2}"
    );
}

#[test]
fn a_replay_answers_from_the_recording_which_holds_no_secret_and_sends_nothing() {
    // The API echoes the authorization it got, as careless servers do, and
    // counts its requests: a replay that went out would get another answer.
    let count = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = count.clone();
    let (pay, arrived) = recording_server(move |head| {
        let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let auth = head.header("authorization").unwrap_or("").to_owned();
        (200, vec![], format!("charge {n} with {auth}"))
    });
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("pay.key");
    std::fs::write(&key_file, KEY).unwrap();
    let host = Host::new("");
    let alpha = format!(
        r#"config = {{ api_base = "http://127.0.0.1:{pay}", currency = "EUR" }}
secrets = {{ PAY_KEY = {{ file = {file:?}, hosts = ["http://127.0.0.1:{pay}"] }} }}
capabilities = {{ http_hosts = [{{ host = "127.0.0.1:{pay}", methods = ["POST"], paths = ["/v1/charges"] }}] }}
rollout = {{ shadow = {{ types = ["{CHARGE}", "{GET}"], min_agreement = 100 }} }}"#,
        file = path(&key_file),
    );
    let corral = host.serve([&alpha, ""]);
    let fetch = std::fs::read(example("fetch")).unwrap();
    let deployed = host.alpha(&["deploy", &path(&example("fetch")), "--json"]);
    assert_eq!(deployed["active"], true, "{deployed}");
    // An attempt whose arguments hold the key (a workflow that had it) is
    // never recorded: its GET is refused by the grant, and kept nowhere.
    let leaky = format!("\"http://127.0.0.1:{pay}/v1/charges?k={KEY}\"");
    let out = host.run(0, GET, &[&leaky]);
    assert_eq!(out["status"], "FAILED", "{out}");
    for amount in ["100", "250"] {
        let out = host.run(0, CHARGE, &[amount]);
        assert_eq!(out["status"], "COMPLETED", "{out}\n{}", corral.stderr());
        let (head, _) = arrived.recv().unwrap();
        assert_eq!(
            head.header("authorization"),
            Some(&*format!("Bearer {KEY}"))
        );
    }

    // What the host wrote (within the second it writes a changed sample
    // in): the requests as the guest made them, the answers with the key
    // redacted, in the file and in every body.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while recorded(&host, "alpha").len() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let file = std::fs::read_dir(host.data.path().join("shadow"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect::<String>();
    assert!(!file.contains(KEY), "{file}");
    let attempts = recorded(&host, "alpha");
    assert_eq!(attempts.len(), 2, "{file}");
    for attempt in &attempts {
        let exchange = &attempt["exchanges"][0];
        assert_eq!(exchange["method"], "POST");
        let body = base64::engine::general_purpose::STANDARD
            .decode(exchange["body"].as_str().unwrap())
            .unwrap();
        let body = String::from_utf8(body).unwrap();
        assert!(body.ends_with("with Bearer [secret PAY_KEY]"), "{body}");
    }

    // The same code rebuilt (another digest: a custom section more)
    // replays both attempts, agrees on both, and sends nothing: the API
    // would have answered another count.
    let mut rebuilt = fetch;
    rebuilt.extend_from_slice(&[0, 8, 7]);
    rebuilt.extend_from_slice(b"rebuilt");
    let dir = tempfile::tempdir().unwrap();
    let rebuilt_file = dir.path().join("fetch.wasm");
    std::fs::write(&rebuilt_file, &rebuilt).unwrap();
    let before = count.load(std::sync::atomic::Ordering::SeqCst);
    let out = host.cli(
        &host.tokens[0].token,
        &["deploy", &path(&rebuilt_file), "--json"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let candidate = json_of(&out);
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), before);
    assert!(arrived.try_recv().is_err(), "the replay sent a request");
    let replayed = &candidate["changes"]["replayed"][0];
    assert_eq!(
        (
            &replayed["name"],
            &replayed["replayed"],
            &replayed["agreed"],
            &replayed["differences"]
        ),
        (&json!(CHARGE), &json!(2), &json!(2), &json!([])),
        "{candidate}"
    );
    let stored: Value = json_of(&host.cli(
        &host.operator.token,
        &["status", "--json", "--tenant", "alpha"],
    ));
    eprintln!(
        "shadow cost: {} bytes for 2 recorded attempts of charge (one HTTP exchange each); per replayed attempt: {} µs on the active version, {} µs on the candidate",
        stored["tenants"][0]["recorded"][0]["bytes"],
        replayed["micros_active"],
        replayed["micros_candidate"]
    );
    assert_eq!(candidate["active"], true, "{candidate}");
    assert_eq!(candidate["held"], json!([]), "{candidate}");
    let logs = corral.stderr();
    assert!(!logs.contains(KEY), "{logs}");
    // Nothing the host keeps (the index, components, compiled code, the
    // recordings) is readable by another user of the machine.
    assert_owner_only(host.data.path());
}

/// Every file and directory under `dir` (and `dir`) has no group or other
/// permission.
fn assert_owner_only(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "{} is {mode:o}", dir.display());
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            assert_owner_only(&path);
        } else {
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{} is {mode:o}", path.display());
        }
    }
}
