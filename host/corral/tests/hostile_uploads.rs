//! Attacks on the store through the admin API, against `corral serve`: a
//! tenant that opens uploads and never finishes them, one that stores its
//! quota's worth in labels and config, one that labels its own bytes as
//! what the host pulled for an operator, and bytes forged that way before
//! this host knew better. Each asserts the bound and that nothing was lost.

mod common;

use std::time::{Duration, Instant};

use common::activities::{json_of, text};
use common::admin::Host;
use common::example;
use common::processes::{FORGED_AT, forgery};
use common::registry::Registry;
use corral::control::proto::{self, admin_client::AdminClient, upload_request};

/// Uploads one tenant may have in flight (`control/api.rs`).
const PER_TENANT: usize = 2;

/// The bytes staged so far, under the host's data directory.
fn staged(host: &Host) -> Vec<u64> {
    std::fs::read_dir(host.data.path().join("staging"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok().map(|m| m.len()))
                .collect()
        })
        .unwrap_or_default()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within a minute");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn unfinished_uploads_stream_to_disk_and_a_tenant_holds_only_its_share() {
    const SIZE: u64 = 40 << 20;
    const SENT: usize = 20;
    let host = Host::new("");
    let corral = host.serve(["", ""]);
    let before = corral.status_kib("VmRSS");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let endpoint = format!("http://127.0.0.1:{}", host.admin());
    let token = host.tokens[0].token.clone();
    // Eight uploads of 40 MiB, each sending half its bytes and then holding
    // its stream open.
    let (refused, senders) = runtime.block_on(async {
        let mut senders = Vec::new();
        let mut calls = Vec::new();
        for i in 0..8 {
            let (send, receive) = tokio::sync::mpsc::channel(4);
            let header = proto::UploadRequest {
                part: Some(upload_request::Part::Header(proto::UploadHeader {
                    name: format!("big{i}"),
                    size: SIZE,
                    ..Default::default()
                })),
            };
            send.send(header).await.unwrap();
            let mut client = AdminClient::connect(endpoint.clone()).await.unwrap();
            let mut request =
                tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(receive));
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            calls.push(tokio::spawn(async move { client.upload(request).await }));
            let chunks = send.clone();
            tokio::spawn(async move {
                for _ in 0..SENT {
                    let chunk = proto::UploadRequest {
                        part: Some(upload_request::Part::Chunk(vec![7u8; 1 << 20])),
                    };
                    if chunks.send(chunk).await.is_err() {
                        return;
                    }
                }
            });
            senders.push(send);
        }
        // The ones over the tenant's share are refused at once; the ones
        // held are given up on at one deadline for all, which a loaded
        // machine's refusals are well within.
        let mut refused = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
        for call in calls {
            let call = tokio::time::timeout_at(deadline, call).await;
            if let Ok(Ok(Err(status))) = call {
                refused.push(status);
            }
        }
        (refused, senders)
    });
    assert_eq!(refused.len(), 8 - PER_TENANT, "{refused:?}");
    for status in &refused {
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert!(
            status.message().contains("already has 2 uploads in flight"),
            "{status:?}"
        );
    }
    // The two in flight have their halves on disk, not in the host's memory
    // (eight such grew it by 329 MiB).
    wait_for("the halves staged", || {
        let sizes = staged(&host);
        sizes.len() == PER_TENANT && sizes.iter().all(|&s| s >= (SENT as u64) << 20)
    });
    let grown = corral.status_kib("VmRSS").saturating_sub(before);
    eprintln!("the host grew by {grown} KiB with {PER_TENANT} half-sent uploads in flight");
    assert!(
        grown < (PER_TENANT as u64 * 4 + 8) << 10,
        "the host grew by {grown} KiB"
    );
    // Abandoned: nothing stored, nothing left staged, the host serves on.
    drop(senders);
    drop(runtime);
    wait_for("the staged halves removed", || staged(&host).is_empty());
    let listed = host.alpha(&["ls", "--json"]);
    assert!(!listed.to_string().contains("big"), "{listed}");
    let deployed = host.alpha(&[
        "deploy",
        &example("progress").display().to_string(),
        "--json",
    ]);
    assert_eq!(deployed["name"], "progress", "{deployed}");
}

#[test]
fn labels_and_config_are_bounded_counted_and_never_the_hosts() {
    let host = Host::new("");
    let _corral = host.serve(["", ""]);
    let progress = example("progress").display().to_string();
    let refused = |extra: &[&str], says: &str| {
        let mut args = vec!["deploy", progress.as_str()];
        args.extend(extra);
        let out = host.cli(&host.tokens[0].token, &args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", text(&out));
        assert!(
            text(&out).contains(says),
            "{extra:?}: no `{says}` in {}",
            text(&out)
        );
    };
    let forged = format!("oci.manifest=sha256:{}", "f".repeat(64));
    refused(
        &["--label", &forged],
        "labels under `oci.` and `corral.` are the host's",
    );
    refused(&["--label", "corral.trusted=yes"], "are the host's");
    let labels: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
    let mut many = Vec::new();
    for label in &labels {
        many.extend(["--label", label.as_str()]);
    }
    refused(&many, "labels: 33 given, at most 32");
    let long = format!("big={}", "x".repeat(5000));
    refused(
        &["--config", &long],
        "its value is 5000 bytes, at most 4096",
    );
    // Within the bounds: stored, with its labels.
    let ok = format!("team={}", "t".repeat(1000));
    let labelled = host.alpha(&["deploy", &progress, "--label", &ok, "--json"]);
    assert_eq!(
        labelled["labels"]["team"].as_str().map(str::len),
        Some(1000)
    );
}

/// A tenant names another tenant made of a forged log line: refused, and
/// the name is escaped and cut in the answer and in the host's log.
#[test]
fn a_tenant_name_a_caller_chose_cannot_forge_a_line_in_the_hosts_log() {
    let host = Host::new("");
    let corral = host.serve(["", ""]);
    let forged = forgery("beta", 4000);
    let echo = example("echo").display().to_string();
    let out = host.cli(
        &host.tokens[0].token,
        &["deploy", &echo, "--tenant", &forged],
    );
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("cannot act on tenant `beta\\n2026"), "{said}");
    assert!(said.len() < 1024, "{} bytes: {said}", said.len());
    corral.await_logged("upload refused", 1);
    corral.assert_not_forged(1000);
}

/// An alias whose target is a forged log line (a tenant's own text, sent
/// past no check but its length): refused, and quoted escaped in the
/// answer as in the host's log. Before, the answer quoted it raw: its
/// newline and terminal escape reached the CLI's output.
#[test]
fn an_alias_target_a_tenant_chose_is_escaped_in_its_refusal() {
    let host = Host::new("");
    let corral = host.serve(["", ""]);
    let forged = forgery("gone", 10);
    let echo = example("echo").display().to_string();
    let out = host.cli(
        &host.tokens[0].token,
        &["deploy", &echo, "--alias", &format!("Short={forged}")],
    );
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("names `gone\\n2026"), "{said}");
    assert!(!said.contains('\u{1b}'), "an escape in the answer: {said}");
    assert!(
        !said.lines().any(|line| line.starts_with(FORGED_AT)),
        "a forged line in the answer: {said}"
    );
    corral.await_logged("upload refused", 1);
    // The text is short (an alias's target is at most 128 bytes): whole,
    // but escaped.
    corral.assert_not_forged(11);
}

/// A component whose import's name is a forged log line: refused as
/// invalid, and the compiler's words, which quote the name, are escaped
/// and cut in the answer and in the host's log.
#[test]
fn a_components_own_names_in_its_refusal_cannot_forge_a_line_in_the_hosts_log() {
    let host = Host::new("");
    let corral = host.serve(["", ""]);
    // The name as a WAT string: its newline and escape written as escapes.
    let name: String = forgery("bad", 6000)
        .chars()
        .map(|c| match c {
            '\n' => "\\n".to_owned(),
            '\u{1b}' => "\\1b".to_owned(),
            c => c.to_string(),
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("forged.wasm");
    let bytes = wat::parse_str(format!("(component (import \"{name}\" (func)))")).unwrap();
    std::fs::write(&file, bytes).unwrap();
    let out = host.cli(
        &host.tokens[0].token,
        &["deploy", &file.display().to_string()],
    );
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("invalid component"), "{said}");
    assert!(said.contains("bad\\n2026"), "{said}");
    corral.await_logged("upload refused", 1);
    corral.assert_not_forged(2500);
}

/// A client that skips `corral deploy`'s own check and sends a deployment
/// `reuse` out of bounds straight to the admin API: refused by name,
/// nothing stored.
#[test]
fn a_reuse_out_of_bounds_sent_past_the_cli_is_refused_and_stores_nothing() {
    let host = Host::new("");
    let _corral = host.serve(["", ""]);
    for (reuse, says) in [
        (
            (1, 60_000),
            "max_tasks: must be a whole number from 2 to 1000000, got 1",
        ),
        ((5, 0), "idle: must be more than 0 and at most 1h"),
        (
            (5, 7_200_000),
            "idle: must be more than 0 and at most 1h, got 7200s",
        ),
    ] {
        let status = raw_upload(
            &host,
            proto::UploadHeader {
                name: "warm".into(),
                reuse: Some(proto::Reuse {
                    max_tasks: reuse.0,
                    idle_ms: reuse.1,
                }),
                ..Default::default()
            },
        );
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains("the deployment's reuse: ")
                && status.message().contains(says),
            "{reuse:?}: {status:?}"
        );
    }
    let listed = host.alpha(&["ls", "--json"]);
    assert!(!listed.to_string().contains("\"warm\""), "{listed}");
}

#[test]
fn a_canary_out_of_bounds_sent_past_the_cli_is_refused_briefly_and_stores_nothing() {
    let host = Host::new("");
    let _corral = host.serve(["", ""]);
    let canary = |steps: Vec<u32>, every_ms: u64, margin: u32, min_tasks: u32| proto::Canary {
        steps_percent: steps,
        every_ms,
        margin_percent: margin,
        min_tasks,
    };
    for (ramp, says) in [
        (
            canary(vec![50, 10], 60_000, 5, 20),
            "steps: 1 to 10 percentages from 1 to 99, each over the one before; got [50, 10]",
        ),
        (canary(vec![100], 60_000, 5, 20), "got [100]"),
        // A million steps: refused in a message of a few hundred bytes.
        (
            canary((0..1_000_000).collect(), 60_000, 5, 20),
            "(1000000 steps)",
        ),
        (canary(vec![10], 0, 5, 20), "every: from 1s to 24h, got 0ns"),
        (
            canary(vec![10], 60_000, 101, 20),
            "margin: percentage points from 0 to 100, got 101",
        ),
        (
            canary(vec![10], 60_000, 5, 0),
            "min_tasks: from 1 to 1000000, got 0",
        ),
    ] {
        let status = raw_upload(
            &host,
            proto::UploadHeader {
                name: "ramped".into(),
                canary: Some(ramp),
                ..Default::default()
            },
        );
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().starts_with("the canary's ") && status.message().contains(says),
            "{status:?}"
        );
        assert!(
            status.message().len() < 512,
            "{} bytes",
            status.message().len()
        );
    }
    let listed = host.alpha(&["ls", "--json"]);
    assert!(!listed.to_string().contains("\"ramped\""), "{listed}");
}

/// Uploads `progress` with `header` through a raw gRPC client, as tenant
/// alpha (skipping every check the CLI makes); the refusal expected.
fn raw_upload(host: &Host, header: proto::UploadHeader) -> tonic::Status {
    let bytes = std::fs::read(example("progress")).unwrap();
    let mut messages = vec![proto::UploadRequest {
        part: Some(upload_request::Part::Header(proto::UploadHeader {
            size: bytes.len() as u64,
            ..header
        })),
    }];
    messages.extend(bytes.chunks(1 << 20).map(|chunk| proto::UploadRequest {
        part: Some(upload_request::Part::Chunk(chunk.to_vec())),
    }));
    let endpoint = format!("http://127.0.0.1:{}", host.admin());
    let token = host.tokens[0].token.clone();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let answer = runtime.block_on(async {
        let mut client = AdminClient::connect(endpoint).await.unwrap();
        let mut request = tonic::Request::new(tokio_stream::iter(messages));
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        client.upload(request).await
    });
    match answer {
        Ok(stored) => panic!("accepted: {stored:?}"),
        Err(status) => status,
    }
}

#[test]
fn bytes_labelled_as_the_hosts_pull_before_are_not_trusted_at_restart() {
    // The registry holds `progress`; an operator pins it by digest.
    let registry = Registry::start();
    let reference = format!("oci://{}/acme/progress:1", registry.host());
    let manifest = registry.push(&example("progress"), &reference);
    let pinned = format!("oci://{}/acme/progress@{manifest}", registry.host());
    // A data directory from before, where the tenant's upload of other
    // bytes (the greeter) claimed to be that pull.
    let host = Host::new(&format!("insecure_registries = [{:?}]", registry.host()));
    let greeter = std::fs::read(example("greeter")).unwrap();
    let digest = corral::control::catalog::digest_of(&greeter);
    let hex = digest.trim_start_matches("sha256:");
    std::fs::create_dir_all(host.data.path().join("components")).unwrap();
    std::fs::write(
        host.data.path().join(format!("components/{hex}.wasm")),
        &greeter,
    )
    .unwrap();
    let index = serde_json::json!({
        "format": 1,
        "tenants": {"alpha": {
            "versions": [{
                "name": "progress", "digest": digest, "size": greeter.len(),
                "uploaded_at_ms": 0, "from_config": true,
                "labels": {"oci.reference": pinned, "oci.manifest": manifest},
            }],
            "active": {"progress": digest},
        }},
    });
    std::fs::write(host.data.path().join("index.json"), index.to_string()).unwrap();
    // Alpha's configured component is the pinned reference (not the
    // greeter every test tenant has).
    let greeter_line = format!(
        "components = [{:?}]",
        example("greeter").display().to_string()
    );
    let config =
        host.config(["", ""])
            .replacen(&greeter_line, &format!("components = [{pinned:?}]"), 1);
    let corral = common::processes::Corral::serve(&config);
    // The host pulled the real bytes, and serves them.
    corral.await_logged(&format!("pulled {pinned}"), 1);
    assert!(
        !corral.stderr().contains("stored before"),
        "{}",
        corral.stderr()
    );
    let out = host.cli(&host.tokens[0].token, &["ls", "--json"]);
    let listed = json_of(&out);
    let active: Vec<&serde_json::Value> = listed
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["name"] == "progress" && v["active"] == true)
        .collect();
    assert_eq!(active.len(), 1, "{listed}");
    assert_ne!(
        active[0]["digest"],
        digest.as_str(),
        "the forged bytes serve: {listed}"
    );
    assert_eq!(
        host.run(0, "demo:progress/api.count-to", &["2", "1"])["result"],
        2
    );
}

/// A component exporting `n` activity types, each with a long name.
fn many_activity_types(n: usize) -> Vec<u8> {
    let letters = |mut i: usize| {
        let mut word = String::new();
        loop {
            word.push(char::from(b'a' + u8::try_from(i % 26).unwrap()));
            i /= 26;
            if i == 0 {
                return word;
            }
        }
    };
    let exports: String = (0..n)
        .map(|i| {
            format!(
                "(export \"an-activity-type-with-a-name-long-enough-to-fill-a-line-{}\" (func $f))\n",
                letters(i)
            )
        })
        .collect();
    wat::parse_str(format!(
        r#"(component
            (core module $m (func (export "f") (result i32) i32.const 7))
            (core instance $i (instantiate $m))
            (func $f (result u32) (canon lift (core func $i "f")))
            (instance $api {exports})
            (export "demo:many/api" (instance $api))
        )"#
    ))
    .unwrap()
}

/// A tenant whose component exports hundreds of activity types: the line
/// corral announces its tenant's types on at start stays short, naming a
/// few and counting the rest (`corral ls` lists them all).
#[test]
fn hundreds_of_a_tenants_activity_types_are_announced_on_a_bounded_line() {
    let host = Host::new("");
    let corral = host.serve(["", ""]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("many.wasm");
    std::fs::write(&file, many_activity_types(300)).unwrap();
    let out = host.cli(
        &host.tokens[0].token,
        &["deploy", &file.display().to_string()],
    );
    assert!(out.status.success(), "{}", text(&out));
    drop(corral);
    // Served again from the store: announced at start.
    let corral = host.serve(["", ""]);
    let log = corral.stderr();
    let line = log
        .lines()
        .find(|l| l.contains("tenant `alpha` serves"))
        .unwrap_or_else(|| panic!("no announcement:\n{log}"));
    assert!(line.len() < 4096, "{} bytes: {line}", line.len());
    assert!(line.contains("demo:many/api.an-activity-type"), "{line}");
    assert!(line.contains(" more"), "{line}");
}
