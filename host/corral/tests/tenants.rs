//! Tenants on one host end to end: tokens, separate directories, metrics,
//! fairness for host slots, and the admin API over TLS.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::activities::{execute, json_of, outcome, start, text, timestamp, wait_for};
use common::admin::{Host, path};
use common::example;
use common::processes::Corral;

#[test]
fn tokens_reach_only_their_tenant_and_the_operator_reaches_all() {
    let host = Host::new("");
    let _corral = host.serve(["", ""]);
    let [alpha, beta] = &host.tokens;
    let out = host.cli(
        &beta.token,
        &["deploy", &path(&example("progress")), "--json"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let beta_digest = json_of(&out)["digest"]
        .as_str()
        .expect("a digest")
        .to_owned();

    let refused = |token: &str, args: &[&str], code: &str| {
        let out = host.cli(token, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(stderr.contains(code), "{args:?}: {stderr}");
        stderr
    };
    let no_token = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["ls"])
        .env(
            "CORRAL_ENDPOINT",
            format!("http://127.0.0.1:{}", host.admin()),
        )
        .env_remove("CORRAL_TOKEN")
        .output()
        .unwrap();
    assert_eq!(no_token.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_token.stderr).contains("no token"));
    refused("corral_not-a-real-token", &["ls"], "Unauthenticated");
    let e = refused(
        &alpha.token,
        &["ls", "--tenant", "beta"],
        "PermissionDenied",
    );
    assert!(
        e.contains("tenant `alpha` cannot act on tenant `beta`"),
        "{e}"
    );
    // Beta's version is not even visible by digest from alpha.
    refused(&alpha.token, &["describe", &beta_digest], "NotFound");
    refused(&alpha.token, &["rm", &beta_digest, "--force"], "NotFound");
    refused(&alpha.token, &["activate", &beta_digest], "NotFound");
    let e = refused(&host.operator.token, &["ls"], "InvalidArgument");
    assert!(e.contains("--tenant"), "{e}");

    // The operator reaches both, and sees host-wide status.
    let out = host.cli(&host.operator.token, &["ls", "--tenant", "beta", "--json"]);
    assert!(
        json_of(&out)
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["digest"] == beta_digest.as_str()),
        "{}",
        text(&out)
    );
    let status = json_of(&host.cli(&host.operator.token, &["status", "--json"]));
    let names: Vec<&str> = status["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha", "beta"]);
    let own = host.alpha(&["status", "--json"]);
    assert_eq!(own["tenants"].as_array().unwrap().len(), 1, "{own}");

    // Removing the active version needs --force.
    let e = refused(
        &alpha.token,
        &["rm", &beta_digest[..15], "--tenant", "alpha"],
        "",
    );
    assert!(e.contains("NotFound"), "{e}");
    let own_digest = host.alpha(&["ls", "--json"])[0]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let e = refused(&alpha.token, &["rm", &own_digest], "FailedPrecondition");
    assert!(e.contains("activate another version first"), "{e}");
}

#[test]
fn each_tenant_reads_only_its_own_directory_and_metrics_count_outcomes() {
    let host = Host::new("");
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    std::fs::write(dirs[0].path().join("note.txt"), "alpha's note").unwrap();
    std::fs::write(dirs[1].path().join("note.txt"), "beta's note").unwrap();
    let grant = |d: &tempfile::TempDir| {
        format!(
            r#"capabilities = {{ dirs = [{{ host = {:?}, guest = "/data", mode = "ro" }}] }}"#,
            d.path().display().to_string()
        )
    };
    let (a, b) = (grant(&dirs[0]), grant(&dirs[1]));
    let _corral = host.serve([&a, &b]);
    for (i, token) in host.tokens.iter().enumerate() {
        let out = host.cli(&token.token, &["deploy", &path(&example("files"))]);
        assert!(out.status.success(), "{}", text(&out));
        let out = host.cli(&token.token, &["deploy", &path(&example("misbehave"))]);
        assert!(out.status.success(), "{}", text(&out));
        let note = host.run(i, "demo:files/api.read", &[r#""/data/note.txt""#]);
        let own = ["alpha's note", "beta's note"][i];
        assert_eq!(note["result"], own, "{note}");
    }
    // Through the admin API's Run too, with the same sandbox.
    let out = host.cli(
        &host.tokens[1].token,
        &["invoke", "demo:files/api.read", r#""/data/note.txt""#],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#""beta's note""#,
        "{}",
        text(&out)
    );
    // Routed by the session, as an engine's task: an unknown type is the
    // engine's UnknownActivity failure, naming what the tenant serves.
    let out = host.cli(&host.tokens[1].token, &["invoke", "demo:files/api.nope"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("UnknownActivity")
            && said.contains("tenant `beta` serves no activity type `demo:files/api.nope`")
            && said.contains("demo:files/api.read"),
        "{}",
        text(&out)
    );

    // A mixed run on alpha: completions and failures of three classes.
    let fast = ["--retry-maximum-attempts", "1"];
    let q = &host.queues[0];
    execute(
        &host.server,
        q,
        "demo:misbehave/api.panic",
        &[r#""oops""#],
        &fast,
    );
    execute(&host.server, q, "demo:misbehave/api.wild-read", &[], &fast);
    execute(
        &host.server,
        q,
        "demo:misbehave/api.fail",
        &[r#""Declined""#, "false"],
        &fast,
    );
    execute(
        &host.server,
        q,
        "demo:misbehave/api.fail",
        &[r#""Declined""#, "false"],
        &fast,
    );
    let metrics = host.scrape();
    for (ty, outcome, n) in [
        ("demo:files/api.read", "Completed", 1),
        ("demo:misbehave/api.panic", "Panic", 1),
        ("demo:misbehave/api.wild-read", "Trap", 1),
        ("demo:misbehave/api.fail", "Application", 2),
    ] {
        let line = format!(
            "corral_tasks_total{{tenant=\"alpha\",activity_type=\"{ty}\",outcome=\"{outcome}\"}} {n}"
        );
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    assert!(metrics.contains("corral_task_duration_seconds_count{tenant=\"alpha\",activity_type=\"demo:misbehave/api.fail\"} 2"));
    assert!(metrics.contains("corral_instantiate_seconds_count{tenant=\"alpha\"}"));
    assert!(metrics.contains("corral_permits_limit{scope=\"tenant\",tenant=\"beta\"} 4"));
    let status = host.alpha(&["status", "--json"]);
    assert_eq!(
        status["tenants"][0]["outcomes"]["Application"], 2,
        "{status}"
    );
    assert_eq!(status["tenants"][0]["outcomes"]["Completed"], 1, "{status}");
}

#[test]
fn a_flooding_tenant_does_not_starve_another_of_host_slots() {
    // The host has 2 slots; each tenant may use both.
    let host = Host::new("");
    let config = host
        .config(["", ""])
        .replace("max_concurrent = 8", "max_concurrent = 2")
        .replace("max_concurrent = 4", "max_concurrent = 2");
    let _corral = Corral::serve(&config);
    for token in &host.tokens {
        let out = host.cli(&token.token, &["deploy", &path(&example("versioned"))]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let hold = "demo:versioned/api.hold";
    let flood: Vec<String> = (0..20)
        .map(|_| start(&host.server, &host.queues[0], hold, &["1000"], &[]))
        .collect();
    // Alpha saturates the host with 10x beta's work queued...
    let started = wait_for(&host.server, &flood[0], Duration::from_secs(30), |i| {
        i["runState"] == "PENDING_ACTIVITY_STATE_STARTED"
            || i["status"] == "ACTIVITY_EXECUTION_STATUS_COMPLETED"
    });
    assert_ne!(
        started["runState"], "PENDING_ACTIVITY_STATE_SCHEDULED",
        "{started}"
    );
    let mut served = Vec::new();
    for _ in 0..2 {
        // Bounded, so a starved tenant fails the test instead of hanging it.
        let bound = ["--schedule-to-close-timeout", "60s"];
        let (id, out) = execute(&host.server, &host.queues[1], hold, &["0"], &bound);
        assert_eq!(out["result"], "v1", "{out}");
        served.push(id);
    }
    for id in &flood {
        assert_eq!(outcome(&host.server, id)["result"], "v1");
    }
    // ...and, by the server's own clock, beta was served while alpha's
    // flood was still queued, not after it drained.
    let done = |id: &String| {
        timestamp(&wait_for(&host.server, id, Duration::ZERO, |_| true)["lastAttemptCompleteTime"])
    };
    let flood_done = flood.iter().map(done).fold(0.0, f64::max);
    for id in &served {
        let beta_done = done(id);
        assert!(
            beta_done < flood_done,
            "beta waited for alpha's flood: done at {beta_done}, the flood at {flood_done}"
        );
    }
}

/// A CA and a certificate for 127.0.0.1 signed by it, made with `openssl`.
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl runs (tests/setup.sh installs it)");
        assert!(out.status.success(), "openssl {args:?}: {}", text(&out));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=corral test CA",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "admin.key",
        "-out",
        "admin.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "admin.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "admin.pem",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("admin.pem"),
        dir.join("admin.key"),
    )
}

#[test]
fn the_admin_api_speaks_tls_when_configured() {
    let certs = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(certs.path());
    let host = Host::new(&format!(
        "admin_tls = {{ cert = {:?}, key = {:?} }}",
        path(&cert),
        path(&key)
    ));
    let corral = host.serve(["", ""]);
    assert!(
        corral
            .stderr()
            .contains(&format!("admin API on https://127.0.0.1:{}", host.admin()))
    );
    let https = format!("https://127.0.0.1:{}", host.admin());
    let ls = |extra: &[&str]| {
        let mut args = vec!["ls", "--json", "--endpoint", &https];
        args.extend_from_slice(extra);
        host.cli(&host.tokens[0].token, &args)
    };
    let out = ls(&["--ca-cert", &path(&ca)]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(json_of(&out)[0]["name"], "greeter");
    // Without trusting the CA the client refuses the server; plain HTTP gets nowhere.
    assert_eq!(ls(&[]).status.code(), Some(2));
    let plain = host.cli(&host.tokens[0].token, &["ls"]);
    assert_eq!(plain.status.code(), Some(2), "{}", text(&plain));
}

#[test]
fn a_tls_handshake_that_never_ends_is_cut_off_at_its_deadline() {
    const HANDSHAKE: Duration = Duration::from_secs(10);
    const SLACK: Duration = Duration::from_secs(8);
    let certs = tempfile::tempdir().unwrap();
    let (_, cert, key) = certificates(certs.path());
    let host = Host::new(&format!(
        "admin_tls = {{ cert = {:?}, key = {:?} }}",
        path(&cert),
        path(&key)
    ));
    let _corral = host.serve(["", ""]);
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", host.admin())).unwrap();
    // The first bytes of a ClientHello record, then nothing.
    stream.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).unwrap();
    let started = Instant::now();
    stream
        .set_read_timeout(Some(HANDSHAKE + SLACK + SLACK))
        .unwrap();
    let mut byte = [0u8; 1];
    let read = stream.read(&mut byte);
    let took = started.elapsed();
    assert!(
        matches!(read, Ok(0))
            || read
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the host answered a handshake that never ended: {read:?} after {took:?}"
    );
    // Well before the 60 s idle limit that would end it otherwise.
    assert!(took < HANDSHAKE + SLACK, "closed after {took:?}");
}

#[test]
fn a_tenant_with_reuse_runs_warm_through_temporal_and_its_neighbour_does_not() {
    let host = Host::new("");
    let corral = host.serve(["reuse = { max_tasks = 10, idle = \"60s\" }", ""]);
    let greet = |queue: &str| {
        let (_, out) = execute(
            &host.server,
            queue,
            "demo:greeter/api.greet",
            &[r#"{"name":"Ada","language":"english"}"#, r#""casual""#],
            &[],
        );
        assert_eq!(out["status"], "COMPLETED", "{out}\n{}", corral.stderr());
        out["result"]["calls-in-instance"].clone()
    };
    let mut calls = Vec::new();
    for _ in 0..3 {
        calls.push((greet(&host.queues[0]), greet(&host.queues[1])));
    }
    // Alpha's tasks ran in one instance, beta's each in a new one.
    let n = |a: u64, b: u64| (serde_json::json!(a), serde_json::json!(b));
    assert_eq!(calls, [n(1, 1), n(2, 1), n(3, 1)]);

    let status = json_of(&host.cli(&host.operator.token, &["status", "--json"]));
    let tenant = |name: &str| {
        status["tenants"]
            .as_array()
            .and_then(|all| all.iter().find(|t| t["name"] == name))
            .unwrap_or_else(|| panic!("no {name} in {status}"))
            .clone()
    };
    let (alpha, beta) = (tenant("alpha"), tenant("beta"));
    assert_eq!(
        (&alpha["reuse_max_tasks"], &alpha["reuse_idle_ms"]),
        (&serde_json::json!(10), &serde_json::json!(60_000)),
        "{status}"
    );
    assert_eq!(alpha["reused_tasks"], 2, "{status}");
    assert_eq!(
        (&beta["reuse_max_tasks"], &beta["reused_tasks"]),
        (&serde_json::json!(0), &serde_json::json!(0)),
        "{status}"
    );
    let scraped = common::processes::scrape(host.metrics());
    assert_eq!(
        common::processes::sample(&scraped, r#"corral_instances_reused_total{tenant="alpha"}"#),
        Some(2.0),
        "{scraped}"
    );
    let text_status = host.cli(&host.operator.token, &["status"]);
    assert!(
        text(&text_status)
            .contains("reuse: up to 10 tasks per instance, kept 60s idle; 2 tasks ran warm"),
        "{}",
        text(&text_status)
    );

    // A deployment's own reuse replaces its tenant's: beta's greeter now
    // reuses, alpha's no longer does.
    let greeter = path(&example("greeter"));
    let [alpha_token, beta_token] = &host.tokens;
    for (token, reuse, stored) in [
        (
            beta_token,
            "10,60s",
            serde_json::json!({"max_tasks": 10, "idle_ms": 60_000}),
        ),
        (
            alpha_token,
            "off",
            serde_json::json!({"max_tasks": 0, "idle_ms": 0}),
        ),
    ] {
        let out = host.cli(
            &token.token,
            &["deploy", &greeter, "--reuse", reuse, "--json"],
        );
        assert!(out.status.success(), "{}", text(&out));
        let deployed = json_of(&out);
        assert_eq!(deployed["reuse"], stored, "{}", text(&out));
        let digest = deployed["digest"].as_str().unwrap_or_default().to_owned();
        let described = host.cli(&token.token, &["describe", &digest]);
        let says = if reuse == "off" {
            "reuse:    off (a new instance for every task)"
        } else {
            "reuse:    up to 10 tasks per instance, kept 60s idle"
        };
        assert!(text(&described).contains(says), "{}", text(&described));
    }
    let mut calls = Vec::new();
    for _ in 0..2 {
        calls.push((greet(&host.queues[0]), greet(&host.queues[1])));
    }
    assert_eq!(calls, [n(1, 1), n(1, 2)]);
    let refused = host.cli(&beta_token.token, &["deploy", &greeter, "--reuse", "1,60s"]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(
        text(&refused).contains("max_tasks: must be a whole number from 2 to 1000000, got 1"),
        "{}",
        text(&refused)
    );
}
