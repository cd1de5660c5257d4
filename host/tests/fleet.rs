//! A fleet of three `corral serve` hosts on one Temporal task queue, each
//! following `acme/versioned:stable` in a real registry, while a Python-SDK
//! workflow calls the activity continuously: moving the tag rolls every
//! host forward, also with one host killed mid-roll-out, with no activity
//! failed or lost, and everything scheduled once every live host has
//! activated the new version runs it.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::activities::{text, unique};
use common::example;
use common::processes::{Corral, TemporalServer};
use common::registry::Registry;
use serde_json::Value;

fn push(registry: &Registry, file: &std::path::Path, reference: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["push", file.to_str().unwrap(), reference])
        .args(["--insecure-registry", &registry.host()])
        .output()
        .expect("corral runs");
    assert!(out.status.success(), "push: {}", text(&out));
}

#[test]
fn three_hosts_following_a_tag_roll_forward_under_load_one_killed_losing_nothing() {
    let server = TemporalServer::start();
    let registry = Registry::start();
    let stable = format!("oci://{}/acme/versioned:stable", registry.host());
    push(&registry, &example("versioned"), &stable);
    let queue = unique("fleet");
    let config = format!(
        r#"
[host]
max_concurrent = 8
shutdown_grace = "5s"
insecure_registries = [{registry:?}]
follow_interval = "1s"

[[tenant]]
name = "fleet"
temporal = {{ address = "http://{address}", namespace = "default", task_queue = "{queue}" }}
limits = {{ memory = "64MiB", timeout = "30s", max_concurrent = 4 }}
follow = [{stable:?}]
"#,
        registry = registry.host(),
        address = server.address(),
    );
    let hosts: Vec<Corral> = (0..3).map(|_| Corral::serve(&config)).collect();

    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/workflows/rollout.py");
    let mut workflow = Command::new("python3")
        .arg(script)
        .args(["--address", &server.address(), "--activity-queue", &queue])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 runs");
    let (tx, lines) = mpsc::channel();
    let stdout = workflow.stdout.take().expect("stdout is piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let expect_line = |want: &str| {
        let line = lines
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("the workflow never said `{want}`"));
        assert_eq!(line, want);
    };
    expect_line("started");

    push(&registry, &example("v2/versioned"), &stable);
    // One host dies mid-roll-out, its tasks in flight: Temporal retries
    // them on the others.
    let killed = Command::new("kill")
        .args(["-KILL", &hosts[2].pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let activated = format!("following {stable}: activated");
    let deadline = Instant::now() + Duration::from_secs(60);
    for host in &hosts[..2] {
        while host.stderr().matches(&activated).count() < 2 {
            assert!(
                Instant::now() < deadline,
                "not rolled out:\n{}",
                host.stderr()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let mut stdin = workflow.stdin.take().expect("stdin is piped");
    writeln!(stdin, "mark").unwrap();
    expect_line("marked");
    writeln!(stdin, "stop").unwrap();
    let result: Value = serde_json::from_str(
        &lines
            .recv_timeout(Duration::from_secs(120))
            .expect("the workflow's result"),
    )
    .expect("JSON");
    assert!(workflow.wait().unwrap().success());

    assert_eq!(result["failures"], serde_json::json!([]), "{result}");
    let results = result["results"].as_array().unwrap();
    let mark = result["mark"].as_u64().unwrap() as usize;
    assert!(results.iter().all(|r| r == "v1" || r == "v2"), "{result}");
    assert!(results[..mark].contains(&Value::from("v1")), "{result}");
    assert!(results.len() >= mark + 8, "{result}");
    assert!(results[mark..].iter().all(|r| r == "v2"), "{result}");
    eprintln!(
        "{} activities, {} before the mark; none failed",
        results.len(),
        mark
    );
}
