//! A fleet of three `corral serve` hosts on one Temporal task queue, each
//! following `acme/versioned:stable` in a real registry, while a Python-SDK
//! workflow calls the activity continuously: moving the tag rolls every
//! host forward (a v1 task in flight finishes on v1) and back (one host
//! killed mid-roll-back), a registry outage leaves the hosts serving what
//! they have and they pick the tag up when it returns; no activity fails
//! or is lost, and what is scheduled after each step runs its version.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::activities::{outcome, start, unique, wait_for};
use common::example;
use common::processes::Corral;
use common::registry::Registry;
use common::temporal::TemporalServer;
use serde_json::Value;

const HOLD: &str = "demo:versioned/api.hold";

#[test]
fn three_hosts_following_a_tag_roll_forward_and_back_through_a_kill_and_an_outage_losing_nothing() {
    let server = TemporalServer::start();
    let mut registry = Registry::start();
    let stable = format!("oci://{}/acme/versioned:stable", registry.host());
    registry.push(&example("versioned"), &stable);
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
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/workflows/rollout.py");
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
    let mut stdin = workflow.stdin.take().expect("stdin is piped");
    let mut mark = || {
        writeln!(stdin, "mark").unwrap();
        expect_line("marked");
    };
    expect_line("started");

    // Roll forward, with a v1 task in flight across the switch.
    let long = start(&server, &queue, HOLD, &["6000"], &[]);
    wait_for(&server, &long, Duration::from_secs(30), |i| {
        i["runState"] == "PENDING_ACTIVITY_STATE_STARTED"
    });
    registry.push(&example("v2/versioned"), &stable);
    let activated = format!("following {stable}: activated");
    await_logged(&hosts, &activated, 2);
    mark(); // 0: every host serves v2
    let long = outcome(&server, &long);
    assert_eq!(long["result"], "v1", "the task in flight: {long}");

    // Roll back, one host killed mid-roll-out with its tasks in flight
    // (Temporal retries them on the others).
    mark(); // 1: still v2
    registry.push(&example("versioned"), &stable);
    let killed = Command::new("kill")
        .args(["-KILL", &hosts[2].pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let live = &hosts[..2];
    await_logged(live, &activated, 3);
    mark(); // 2: every live host serves v1 again

    // The registry goes away: hosts keep serving and say so; when it is
    // back, they pick up where the tag went meanwhile.
    registry.stop();
    await_logged(
        live,
        &format!("following {stable}: cannot reach the registry"),
        1,
    );
    mark(); // 3: v1, without a registry
    mark(); // 4: still v1, eight activities later
    registry.restart();
    registry.push(&example("v2/versioned"), &stable);
    await_logged(live, &activated, 4);
    mark(); // 5: v2 again
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
    let marks: Vec<usize> = result["marks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(marks.len(), 6, "{result}");
    assert!(results.iter().all(|r| r == "v1" || r == "v2"), "{result}");
    let all = |range: std::ops::Range<usize>, version: &str| {
        assert!(
            results[range.clone()].iter().all(|r| r == version),
            "{range:?} should all be {version}: {result}"
        );
    };
    assert!(results[..marks[0]].contains(&Value::from("v1")), "{result}");
    all(marks[0]..marks[1], "v2");
    all(marks[2]..marks[4], "v1");
    all(marks[5]..results.len(), "v2");
    eprintln!(
        "{} activities across the roll-out, roll-back and registry outage; none failed",
        results.len()
    );
}

/// Waits until every host in `hosts` has logged `line` `times` times.
fn await_logged(hosts: &[Corral], line: &str, times: usize) {
    for host in hosts {
        host.await_logged(line, times);
    }
}
