//! The control plane end to end: the real `corral` binary serving a real
//! Temporal dev server, deployed to and inspected through its own CLI (and,
//! for cut-off uploads, a raw gRPC client).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};

use common::activities::{execute, json_of, outcome, start, text, unique, wait_for};
use common::example;
use common::processes::{Corral, TemporalServer, free_port};

/// A token and its hash, from `corral token --json`.
struct Token {
    token: String,
    sha256: String,
}

fn token() -> Token {
    let out = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["token", "--json"])
        .output()
        .expect("corral token runs");
    let v = json_of(&out);
    let token = v["token"].as_str().expect("a token").to_owned();
    let sha256 = v["sha256"].as_str().expect("a hash").to_owned();
    assert_eq!(sha256.len(), 64);
    Token { token, sha256 }
}

/// One host with two tenants (`alpha`, `beta`) on their own queues, an
/// admin API, a metrics endpoint and a data directory that outlives it.
struct Host {
    server: TemporalServer,
    data: tempfile::TempDir,
    admin: u16,
    metrics: u16,
    queues: [String; 2],
    tokens: [Token; 2],
    operator: Token,
    extra: String,
}

impl Host {
    fn new(extra_host: &str) -> Host {
        Host {
            server: TemporalServer::start(),
            data: tempfile::tempdir().expect("tempdir"),
            admin: free_port(),
            metrics: free_port(),
            queues: [unique("alpha"), unique("beta")],
            tokens: [token(), token()],
            operator: token(),
            extra: extra_host.to_owned(),
        }
    }

    fn config(&self, tenant_extra: [&str; 2]) -> String {
        let greeter = format!("{:?}", example("greeter").display().to_string());
        let mut text = format!(
            r#"
[host]
max_concurrent = 8
shutdown_grace = "5s"
admin_listen = "127.0.0.1:{admin}"
metrics_listen = "127.0.0.1:{metrics}"
data_dir = {data:?}
operator_token_sha256 = "{operator}"
{extra}
"#,
            admin = self.admin,
            metrics = self.metrics,
            data = self.data.path().display().to_string(),
            operator = self.operator.sha256,
            extra = self.extra,
        );
        for (i, name) in ["alpha", "beta"].iter().enumerate() {
            text.push_str(&format!(
                r#"
[[tenant]]
name = "{name}"
token_sha256 = "{hash}"
temporal = {{ address = "http://{address}", namespace = "default", task_queue = "{queue}" }}
limits = {{ memory = "64MiB", timeout = "30s", max_concurrent = 4 }}
components = [{greeter}]
{tenant_extra}
"#,
                hash = self.tokens[i].sha256,
                address = self.server.address(),
                queue = self.queues[i],
                tenant_extra = tenant_extra[i],
            ));
        }
        text
    }

    fn serve(&self, tenant_extra: [&str; 2]) -> Corral {
        Corral::serve(&self.config(tenant_extra))
    }

    /// `corral <args>` against this host with `token`.
    fn cli(&self, token: &str, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(args)
            .env(
                "CORRAL_ENDPOINT",
                format!("http://127.0.0.1:{}", self.admin),
            )
            .env("CORRAL_TOKEN", token)
            .output()
            .expect("corral runs")
    }

    /// As tenant `alpha`, expecting success; the JSON output.
    fn alpha(&self, args: &[&str]) -> Value {
        let out = self.cli(&self.tokens[0].token, args);
        assert!(out.status.success(), "corral {args:?}: {}", text(&out));
        json_of(&out)
    }

    fn run(&self, queue: usize, ty: &str, inputs: &[&str]) -> Value {
        execute(&self.server, &self.queues[queue], ty, inputs, &[]).1
    }

    fn scrape(&self) -> String {
        let out = Command::new("python3")
            .args([
                "-c",
                "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())",
                &format!("http://127.0.0.1:{}/metrics", self.metrics),
            ])
            .output()
            .expect("python3 runs");
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

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

    // Deploying the same bytes again is the same version.
    let again = host.alpha(&["deploy", &path(&v2_file()), "--json"]);
    assert_eq!(again["already_stored"], true);
    assert_eq!(again["digest"], v2["digest"]);

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

/// A component that imports outbound HTTP.
const HTTP_COMPONENT: &str = r#"(component
  (import "wasi:http/outgoing-handler@0.2.0" (instance))
)"#;

#[test]
fn bad_uploads_are_rejected_precisely_and_store_nothing() {
    let host = Host::new(r#"max_upload = "1MiB""#);
    let _corral = host.serve(["", ""]);
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
        (
            write("http.wasm", &wat::parse_str(HTTP_COMPONENT).unwrap()),
            "InvalidArgument",
            "tenant `alpha` is not granted (or this host does not provide): `wasi:http/outgoing-handler@0.2.0`",
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
    let endpoint = format!("http://127.0.0.1:{}", host.admin);
    let (short, broken) = cut_off_uploads(&endpoint, &host.tokens[0].token, &greeter);
    assert_eq!(short.code(), tonic::Code::InvalidArgument, "{short:?}");
    assert!(short.message().contains("cut off"), "{short:?}");
    assert!(
        broken.is_none() || broken.as_ref().is_some_and(|s| s.code() != tonic::Code::Ok),
        "{broken:?}"
    );

    assert_eq!(stored(), before, "a rejected upload stored bytes");
    let listed = host.alpha(&["ls", "--json"]);
    assert_eq!(
        listed.as_array().unwrap().len(),
        1,
        "only the seeded greeter: {listed}"
    );
    let metrics = host.scrape();
    assert!(
        metrics.contains("corral_uploads_total{tenant=\"alpha\",result=\"rejected\"} 7"),
        "{metrics}"
    );
}

/// Uploads half of `bytes` after announcing all of them: once ending the
/// stream cleanly, once dropping the connection mid-stream.
fn cut_off_uploads(
    endpoint: &str,
    token: &str,
    bytes: &[u8],
) -> (tonic::Status, Option<tonic::Status>) {
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

        // The second stream never ends; the client goes away mid-upload.
        let mut client = AdminClient::connect(endpoint.to_owned()).await.unwrap();
        let endless = tokio_stream::StreamExt::chain(
            tokio_stream::iter(vec![header, half]),
            tokio_stream::pending(),
        );
        let call = tokio::spawn(async move { client.upload(request(&token, endless)).await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        call.abort();
        let broken = match call.await {
            Ok(Err(status)) => Some(status),
            _ => None,
        };
        // Give the host a moment to notice the reset.
        tokio::time::sleep(Duration::from_millis(500)).await;
        (short, broken)
    })
}

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
            format!("http://127.0.0.1:{}", host.admin),
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
    std::thread::sleep(Duration::from_millis(1500));
    for _ in 0..2 {
        // Bounded, so a starved tenant fails the test instead of hanging it.
        let bound = ["--schedule-to-close-timeout", "60s"];
        let out = execute(&host.server, &host.queues[1], hold, &["0"], &bound).1;
        assert_eq!(out["result"], "v1", "{out}");
    }
    // ...and beta finished while alpha's flood is still queued.
    let unfinished = flood
        .iter()
        .filter(|id| {
            let info = wait_for(&host.server, id, Duration::ZERO, |_| true);
            info["status"] != "ACTIVITY_EXECUTION_STATUS_COMPLETED"
        })
        .count();
    assert!(unfinished > 0, "alpha's flood had already finished");
    for id in &flood {
        assert_eq!(outcome(&host.server, id)["result"], "v1");
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
            .contains(&format!("admin API on https://127.0.0.1:{}", host.admin))
    );
    let https = format!("https://127.0.0.1:{}", host.admin);
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
