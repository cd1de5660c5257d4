//! `deploy/`, against the real binary: the Kubernetes manifests are valid
//! (Kubernetes' own schemas, strict; KEDA's `temporal` scaler's documented
//! fields) and name only what a host of their configuration serves (ports,
//! probe paths, volumes, the autoscaler's metric), and the Grafana
//! dashboard's every query names metrics and labels a host with traffic of
//! every kind exposes. The checks themselves are shown to fail on a broken
//! copy.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use common::activities::{execute_completed, text, unique};
use common::admin::{Host, path};
use common::processes::{Corral, free_port, scrape};
use common::temporal::TemporalServer;
use common::{example, hostile_guest, repo};

fn python(script: &str, args: &[&str]) -> Output {
    Command::new("python3")
        .arg(repo().join("tests/deploy").join(script))
        .args(args)
        .output()
        .expect("python3 runs")
}

/// `GET path` on `port`: the status line's code.
fn status_of(port: u16, path: &str) -> u16 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: corral\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A copy of `deploy/kubernetes` with `from` replaced by `to` in `file`.
fn broken_copy(dir: &Path, file: &str, from: &str, to: &str) -> PathBuf {
    let copy = dir.join(format!("broken-{}", unique("k8s")));
    std::fs::create_dir(&copy).unwrap();
    for entry in std::fs::read_dir(repo().join("deploy/kubernetes")).unwrap() {
        let entry = entry.unwrap();
        let mut text = std::fs::read_to_string(entry.path()).unwrap();
        if entry.file_name() == file {
            assert!(text.contains(from), "{file} has no `{from}`");
            text = text.replacen(from, to, 1);
        }
        std::fs::write(copy.join(entry.file_name()), text).unwrap();
    }
    copy
}

#[test]
fn the_manifests_are_valid_and_name_only_what_a_host_of_their_configuration_serves() {
    let manifests = repo().join("deploy/kubernetes");
    let out = python("manifests.py", &[&path(&manifests)]);
    assert!(out.status.success(), "manifests.py: {}", text(&out));
    let facts: Value = serde_json::from_slice(&out.stdout).unwrap();

    // The checks fail where they should: an unknown field, a grace period
    // too short for the drain, a metrics port the configuration does not
    // listen on.
    let scratch = tempfile::tempdir().unwrap();
    for (file, from, to, says) in [
        (
            "deployment.yaml",
            "containerPort: 9464",
            "containerPorts: 9464",
            "containerPorts",
        ),
        (
            "deployment.yaml",
            "terminationGracePeriodSeconds: 60",
            "terminationGracePeriodSeconds: 20",
            "terminationGracePeriodSeconds 20",
        ),
        (
            "configmap.yaml",
            "0.0.0.0:9464",
            "0.0.0.0:9000",
            "metrics_listen",
        ),
    ] {
        let broken = broken_copy(scratch.path(), file, from, to);
        let out = python("manifests.py", &[&path(&broken)]);
        assert!(!out.status.success(), "{file} with `{to}` passed");
        assert!(
            text(&out).contains(says),
            "{file} with `{to}`: {}",
            text(&out)
        );
    }

    // A host of that very configuration, but for where this test runs it:
    // loopback ports, temporary directories, a certificate of its own, a
    // dev server, and a component to serve.
    let server = TemporalServer::start();
    let queue = unique("k8s");
    let mut config: toml::Table = facts["config"].as_str().unwrap().parse().unwrap();
    let (admin, metrics) = (free_port(), free_port());
    let dirs = tempfile::tempdir().unwrap();
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "1"])
        .args([
            "-keyout",
            "tls.key",
            "-out",
            "tls.crt",
            "-subj",
            "/CN=127.0.0.1",
        ])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .current_dir(dirs.path())
        .output()
        .expect("openssl runs (tests/setup.sh installs it)");
    assert!(out.status.success(), "openssl: {}", text(&out));
    let host = config["host"].as_table_mut().unwrap();
    // The manifests' ports are what the configuration listens on.
    assert_eq!(
        host["metrics_listen"].as_str().unwrap(),
        format!("0.0.0.0:{}", facts["ports"]["metrics"])
    );
    assert_eq!(
        host["admin_listen"].as_str().unwrap(),
        format!("0.0.0.0:{}", facts["ports"]["admin"])
    );
    host.insert("admin_listen".into(), format!("127.0.0.1:{admin}").into());
    host.insert(
        "metrics_listen".into(),
        format!("127.0.0.1:{metrics}").into(),
    );
    let mut tls = toml::Table::new();
    tls.insert("cert".into(), path(&dirs.path().join("tls.crt")).into());
    tls.insert("key".into(), path(&dirs.path().join("tls.key")).into());
    host.insert("admin_tls".into(), tls.into());
    for key in ["data_dir", "cache_dir"] {
        let dir = dirs.path().join(key);
        host.insert(key.into(), path(&dir).into());
    }
    let tenant = config["tenant"].as_array_mut().unwrap()[0]
        .as_table_mut()
        .unwrap();
    let temporal = tenant["temporal"].as_table_mut().unwrap();
    temporal.insert(
        "address".into(),
        format!("http://{}", server.address()).into(),
    );
    temporal.insert("task_queue".into(), queue.clone().into());
    tenant.insert(
        "components".into(),
        toml::Value::Array(vec![path(&example("echo")).into()]),
    );
    let corral = Corral::serve(&config.to_string());

    // Its probes, at the manifests' paths, on the metrics port.
    for (probe, at) in facts["probes"].as_object().unwrap() {
        let at = at.as_str().unwrap();
        assert_eq!(status_of(metrics, at), 200, "{probe} {at}");
    }
    // The autoscaler's metric, with its labels.
    let scraped = scrape(metrics);
    for metric in facts["metrics"].as_array().unwrap() {
        let labels: Vec<String> = metric["labels"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", v.as_str().unwrap()))
            .collect();
        let series = format!(
            "{}{{{}}}",
            metric["name"].as_str().unwrap(),
            labels.join(",")
        );
        assert!(scraped.contains(&series), "no {series} in:\n{scraped}");
    }
    // The admin API answers TLS on its port.
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{admin}")])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("BEGIN CERTIFICATE"),
        "{}",
        text(&out)
    );
    // And it serves its tenant's task queue.
    let echoed = execute_completed(
        &server,
        &corral,
        &queue,
        "demo:echo/api.echo-string",
        &["\"k8s\""],
    );
    assert_eq!(echoed, serde_json::json!("k8s"));
}

#[test]
fn every_dashboard_query_names_metrics_and_labels_a_host_with_traffic_exposes() {
    let dashboard = repo().join("deploy/grafana/corral.json");
    // Alpha: warm instances, a CPU cap, a tag it follows that never
    // resolves, a canary that never rolls back. Beta: a roll-out that
    // holds breaking versions and a canary that rolls back.
    let host = Host::new("insecure_registries = [\"127.0.0.1:9\"]\nfollow_interval = \"1s\"");
    let _corral = host.serve([
        r#"reuse = { max_tasks = 100, idle = "60s" }
cpu_max = 0.05
registries = ["127.0.0.1:9"]
follow = ["oci://127.0.0.1:9/acme/never:1"]
rollout = { canary = { steps = [50], every = "1h", margin = 100, min_tasks = 1 } }"#,
        r#"rollout = { hold = ["breaking"], canary = { steps = [99], every = "1h", margin = 0, min_tasks = 1 } }"#,
    ]);
    let hold = "demo:versioned/api.hold";
    let versioned = |v: &str| path(&example(v));
    let beta = |args: &[&str]| {
        let out = host.cli(&host.tokens[1].token, args);
        assert!(
            out.status.success() || out.status.code() == Some(2),
            "{}",
            text(&out)
        );
        out
    };
    host.alpha(&["deploy", &versioned("versioned"), "--json"]);
    host.alpha(&["deploy", &path(&example("misbehave")), "--json"]);
    host.alpha(&["deploy", &path(&hostile_guest("hostile")), "--json"]);
    // Tasks: completed ones in a warm instance, failed ones, CPU past the
    // cap.
    for _ in 0..3 {
        assert_eq!(host.run(0, hold, &["0"])["result"], "v1");
    }
    host.run(0, "demo:misbehave/api.panic", &["\"on purpose\""]);
    host.run(0, "demo:hostile/api.burn", &["50000000"]);
    // A canary of v2 on alpha, with tasks on both sides.
    host.alpha(&["deploy", &versioned("v2/versioned"), "--json"]);
    for _ in 0..6 {
        host.run(0, hold, &["0"]);
    }
    let mut scrapes = vec![host.scrape()];
    // Beta: v1 serves, v3 (the same signatures) ramps as a canary, rolls
    // back at its first trap and is held.
    beta(&["deploy", &versioned("versioned"), "--json"]);
    beta(&["deploy", &versioned("v3/versioned"), "--json"]);
    scrapes.push(host.scrape());
    for _ in 0..20 {
        host.run(1, hold, &["0"]);
        let now = host.scrape();
        let rolled_back = now.contains("corral_canary_rollbacks_total{tenant=\"beta\"} 1");
        scrapes.push(now);
        if rolled_back {
            break;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<String> = scrapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let file = dir.path().join(format!("scrape-{i}.txt"));
            std::fs::write(&file, s).unwrap();
            path(&file)
        })
        .collect();
    let mut args = vec![path(&dashboard)];
    args.extend(files.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = python("dashboard.py", &args);
    assert!(out.status.success(), "dashboard.py: {}", text(&out));

    // And it fails on a dashboard naming what no host exposes.
    let mut broken: Value =
        serde_json::from_str(&std::fs::read_to_string(&dashboard).unwrap()).unwrap();
    broken["panels"][1]["targets"][0]["expr"] =
        "sum by (tenant, colour) (rate(corral_tasks_total[5m]))".into();
    let broken_file = dir.path().join("broken.json");
    std::fs::write(&broken_file, broken.to_string()).unwrap();
    let mut args = vec![path(&broken_file)];
    args.extend(files);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = python("dashboard.py", &args);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("no label `colour`"), "{}", text(&out));
}
