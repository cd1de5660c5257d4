//! The control plane end to end: the real `corral` binary serving a real
//! Temporal dev server, deployed to through its own CLI (and, for cut-off
//! uploads, a raw gRPC client).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use common::activities::{execute, json_of, outcome, start, text, wait_for};
use common::admin::{Host, path};
use common::example;

fn v2_file() -> PathBuf {
    example("v2/versioned")
}

#[test]
fn deploys_swap_versions_while_serving_roll_back_and_survive_a_restart() {
    let host = Host::new("");
    let mut corral = host.serve(["", ""]);
    let hold = "demo:versioned/api.hold";

    let v1 = host.alpha(&[
        "deploy",
        &path(&example("versioned")),
        "--label",
        "git=abc",
        "--json",
    ]);
    assert_eq!(v1["active"], true, "{v1}");
    assert_eq!(v1["name"], "versioned");
    assert_eq!(v1["labels"], json!({"git": "abc"}));
    assert_eq!(
        v1["changes"],
        Value::Null,
        "a first version changes nothing"
    );
    let v1_digest = v1["digest"].as_str().unwrap().to_owned();
    assert_eq!(host.run(0, hold, &["0"])["result"], "v1");

    // A long task on v1, running before v2 is deployed...
    let long = start(&host.server, &host.queues[0], hold, &["4000"], &[]);
    let running = wait_for(&host.server, &long, Duration::from_secs(20), |i| {
        i.get("lastStartedTime").is_some()
    });
    assert!(running.get("lastStartedTime").is_some(), "{running}");

    let v2 = host.alpha(&["deploy", &path(&v2_file()), "--json"]);
    assert_eq!(v2["active"], true, "{v2}");
    assert_eq!(v2["name"], "versioned");
    // The deploy says what v2 changes against v1: one new activity type.
    let changes = &v2["changes"];
    assert_eq!(changes["against"], v1_digest.as_str(), "{v2}");
    assert_eq!(
        changes["added"],
        json!([{"name": "demo:versioned/extra.added", "signature": "func() -> string"}])
    );
    assert_eq!(changes["breaks_callers"], false, "{v2}");
    // ...the next task runs v2, and v2's new activity type is served at once...
    assert_eq!(host.run(0, hold, &["0"])["result"], "v2");
    assert_eq!(
        host.run(0, "demo:versioned/extra.added", &[])["result"],
        "v2"
    );
    // ...while the long one finishes on the version it started with.
    assert_eq!(
        outcome(&host.server, &long)["result"],
        "v1",
        "{}",
        corral.stderr()
    );

    // Deploying the same bytes again is the same version; with `--reuse`,
    // its tasks run warm (on a host whose config has no tenant reusing).
    let again = host.alpha(&["deploy", &path(&v2_file()), "--reuse", "5,60s", "--json"]);
    assert_eq!(again["already_stored"], true);
    assert_eq!(again["digest"], v2["digest"]);
    assert_eq!(again["changes"], Value::Null, "the active version again");
    for _ in 0..2 {
        assert_eq!(host.run(0, hold, &["0"])["result"], "v2");
    }
    let status = json_of(&host.cli(&host.operator.token, &["status", "--json"]));
    assert_eq!(status["tenants"][0]["name"], "alpha", "{status}");
    assert_eq!(status["tenants"][0]["reused_tasks"], 1, "{status}");

    // Roll back by digest prefix.
    let back = host.alpha(&["activate", &v1_digest[7..19], "--json"]);
    assert_eq!(back["digest"], v1_digest.as_str());
    assert_eq!(back["previous_digest"], v2["digest"]);
    assert_eq!(host.run(0, hold, &["0"])["result"], "v1");
    // (UnknownActivity is retryable: a deploy may be on its way. Once is enough here.)
    let gone = execute(
        &host.server,
        &host.queues[0],
        "demo:versioned/extra.added",
        &[],
        &["--retry-maximum-attempts", "1"],
    )
    .1;
    assert_eq!(
        gone["failure"]["applicationFailureInfo"]["type"], "UnknownActivity",
        "{gone}"
    );

    let listed = host.alpha(&["ls", "--json"]);
    let versions: Vec<(String, bool)> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == "versioned")
        .map(|c| {
            (
                c["digest"].as_str().unwrap().to_owned(),
                c["active"] == true,
            )
        })
        .collect();
    assert_eq!(versions.len(), 2, "{listed}");
    assert!(versions.contains(&(v1_digest.clone(), true)));
    let described = host.alpha(&["describe", &v1_digest, "--json"]);
    assert_eq!(
        described["activity_types"],
        json!([{"name": hold, "signature": "func(ms: u32) -> string"}])
    );
    assert!(
        described["imports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i.as_str().unwrap().starts_with("corral:activity/context"))
    );

    // A restart serves exactly what was active, compiling nothing.
    assert_eq!(corral.terminate(Duration::from_secs(20)), Some(0));
    let corral = host.serve(["", ""]);
    assert_eq!(
        host.run(0, hold, &["0"])["result"],
        "v1",
        "{}",
        corral.stderr()
    );
    let metrics = host.scrape();
    assert!(
        metrics.contains("corral_component_loads_total{source=\"cache\"}"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("source=\"compiled\""),
        "a restart recompiled: {metrics}\n{}",
        corral.stderr()
    );
    assert!(
        !corral.stderr().contains("from_cache=false"),
        "{}",
        corral.stderr()
    );
    let listed = host.alpha(&["ls", "--json"]);
    assert_eq!(
        listed.as_array().unwrap().len(),
        3,
        "greeter and two versions: {listed}"
    );
}

#[test]
fn bad_uploads_are_rejected_precisely_and_store_nothing() {
    let host = Host::new(r#"max_upload = "1MiB""#);
    let corral = host.serve(["", ""]);
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        path(&p)
    };
    let greeter = std::fs::read(example("greeter")).unwrap();
    let cases = [
        (
            write("random.wasm", b"\x13\x37 definitely not wasm"),
            "InvalidArgument",
            "not a WebAssembly binary",
        ),
        (
            write("core.wasm", &wat::parse_str("(module)").unwrap()),
            "InvalidArgument",
            "core WebAssembly module, not a component",
        ),
        (
            write("truncated.wasm", &greeter[..greeter.len() / 2]),
            "InvalidArgument",
            "invalid component",
        ),
        (
            write("big.wasm", &vec![0u8; 2 << 20]),
            "ResourceExhausted",
            "at most 1 MiB (host.max_upload)",
        ),
    ];
    let stored = || {
        std::fs::read_dir(host.data.path().join("components"))
            .unwrap()
            .count()
    };
    let before = stored();
    for (file, code, message) in &cases {
        let out = host.cli(&host.tokens[0].token, &["deploy", file]);
        assert_eq!(out.status.code(), Some(2), "{file}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(code), "{file}: {stderr}");
        assert!(stderr.contains(message), "{file}: {stderr}");
    }

    // Streams that end short of the announced size, or break mid-way.
    let endpoint = format!("http://127.0.0.1:{}", host.admin());
    let receiving = |name: &str| {
        corral
            .stderr()
            .lines()
            .any(|l| l.contains("receiving an upload") && l.contains(name))
    };
    let short = cut_off_uploads(&endpoint, &host.tokens[0].token, &greeter, receiving);
    assert_eq!(short.code(), tonic::Code::InvalidArgument, "{short:?}");
    assert!(short.message().contains("cut off"), "{short:?}");
    // The host counts the abandoned upload once it notices the reset.
    let rejected = "corral_uploads_total{tenant=\"alpha\",result=\"rejected\"} 6";
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !host.scrape().contains(rejected) {
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned upload was never counted:\n{}",
            host.scrape()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    assert_eq!(stored(), before, "a rejected upload stored bytes");
    let listed = host.alpha(&["ls", "--json"]);
    assert_eq!(
        listed.as_array().unwrap().len(),
        1,
        "only the seeded greeter: {listed}"
    );
    let metrics = host.scrape();
    assert!(
        metrics.contains("corral_uploads_total{tenant=\"alpha\",result=\"rejected\"} 6"),
        "{metrics}"
    );
}

/// Uploads half of `bytes` after announcing all of them: once ending the
/// stream cleanly, once dropping the connection mid-stream.
fn cut_off_uploads(
    endpoint: &str,
    token: &str,
    bytes: &[u8],
    receiving: impl Fn(&str) -> bool,
) -> tonic::Status {
    use corral::control::proto::{
        UploadHeader, UploadRequest, admin_client::AdminClient, upload_request::Part,
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let header = UploadRequest {
            part: Some(Part::Header(UploadHeader {
                name: "greeter".into(),
                size: bytes.len() as u64,
                ..UploadHeader::default()
            })),
        };
        let half = UploadRequest {
            part: Some(Part::Chunk(bytes[..bytes.len() / 2].to_vec())),
        };
        fn request<T>(token: &str, messages: T) -> tonic::Request<T> {
            let mut r = tonic::Request::new(messages);
            r.metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            r
        }
        let token = token.to_owned();
        let mut client = AdminClient::connect(endpoint.to_owned()).await.unwrap();
        let short = client
            .upload(request(
                &token,
                tokio_stream::iter(vec![header.clone(), half.clone()]),
            ))
            .await
            .expect_err("a short upload is refused");

        // The second stream never ends; the client goes away mid-upload,
        // once the host says it is receiving it.
        let abandoned = UploadRequest {
            part: Some(Part::Header(UploadHeader {
                name: "abandoned".into(),
                size: bytes.len() as u64,
                ..UploadHeader::default()
            })),
        };
        let mut client = AdminClient::connect(endpoint.to_owned()).await.unwrap();
        let endless = tokio_stream::StreamExt::chain(
            tokio_stream::iter(vec![abandoned, half]),
            tokio_stream::pending(),
        );
        let call = tokio::spawn(async move { client.upload(request(&token, endless)).await });
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !receiving("abandoned") {
            assert!(
                std::time::Instant::now() < deadline,
                "the upload never began"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        call.abort();
        short
    })
}

#[test]
fn with_json_logs_every_line_corral_serve_writes_is_a_json_event() {
    let host = Host::new(r#"log_format = "json""#);
    let mut corral = host.serve(["", ""]);
    host.alpha(&["status", "--json"]);
    assert_eq!(corral.terminate(Duration::from_secs(20)), Some(0));
    let stderr = corral.stderr();
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    for needle in [
        "corral: ready",
        "admin API on",
        "SIGTERM, shutting down",
        "stopped;",
    ] {
        assert!(stderr.contains(needle), "no `{needle}` in:\n{stderr}");
    }
    for line in lines {
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_ok(),
            "not a JSON event: {line}"
        );
    }
}
