//! End to end against a real Temporal dev server and the real `corral`
//! binary, driven by the `temporal` CLI's Standalone Activities.

mod common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::activities::*;
use common::example;
use common::processes::{Corral, forgery};
use common::temporal::TemporalServer;

const LIMITS: &str =
    r#"memory = "64MiB", timeout = "20s", max_concurrent = 8, cancel_grace = "1s""#;

/// A config serving the example components on `queue` with `limits`.
fn config(server: &TemporalServer, queue: &str, limits: &str) -> String {
    let components: Vec<String> = ["greeter", "progress", "misbehave"]
        .iter()
        .map(|name| format!("{:?}", example(name).display().to_string()))
        .collect();
    format!(
        r#"
[host]
max_concurrent = 16
shutdown_grace = "5s"

[[tenant]]
name = "acme"
temporal = {{ address = "http://{address}", namespace = "default", task_queue = "{queue}" }}
limits = {{ {limits} }}
components = [{components}]
aliases = {{ Greet = "demo:greeter/api.greet" }}
"#,
        address = server.address(),
        components = components.join(", "),
    )
}

#[test]
fn typed_activities_run_by_full_name_and_by_alias() {
    let server = TemporalServer::start();
    let queue = unique("q");
    let corral = Corral::serve(&config(&server, &queue, LIMITS));
    let greeting = execute_completed(
        &server,
        &corral,
        &queue,
        "demo:greeter/api.greet",
        &[
            r#"{"name":"Ada","title":"Countess","language":"french"}"#,
            r#""formal""#,
        ],
    );
    assert_eq!(
        greeting,
        json!({"message": "Bonjour, Countess Ada!", "calls-in-instance": 1, "attempt": 1})
    );

    let greeting = execute(
        &server,
        &queue,
        "Greet",
        &[
            r#"{"name":"Bo","language":"german"}"#,
            r#"{"custom":"Moin"}"#,
        ],
        &[],
    )
    .1;
    assert_eq!(greeting["result"]["message"], "Moin, Bo!");
}

#[test]
fn failures_are_classified_and_retried_per_their_flag() {
    let server = TemporalServer::start();
    let queue = unique("q");
    let corral = Corral::serve(&config(&server, &queue, LIMITS));

    // A non-retryable application failure: FAILED at attempt 1, with the
    // guest's kind, flag and details.
    let (id, out) = execute(
        &server,
        &queue,
        "demo:misbehave/api.fail",
        &[r#""Declined""#, "false"],
        &FAST_RETRY,
    );
    assert_eq!(out["status"], "FAILED", "{out}");
    let info = &out["failure"]["applicationFailureInfo"];
    assert_eq!(info["type"], "Declined");
    assert_eq!(info["nonRetryable"], true);
    assert_eq!(info["details"], json!([{"why": "asked to"}]));
    assert_eq!(describe(&server, &id)["attempt"], 1);

    // The guest chooses its failure's kind and message: the engine gets
    // them whole, the host's log escaped (no line forged, no terminal
    // escape) and bounded.
    let forged = forgery("Declined", 5000);
    let (_, out) = execute(
        &server,
        &queue,
        "demo:misbehave/api.fail",
        &[&json!(forged).to_string(), "false"],
        &FAST_RETRY,
    );
    assert_eq!(out["failure"]["applicationFailureInfo"]["type"], forged);
    corral.await_logged("Declined\\n2026", 2);
    corral.assert_not_forged(2500);

    // Retryable until attempt 3, then success: the guest sees the attempt.
    let (id, out) = execute(
        &server,
        &queue,
        "demo:progress/api.succeed-on-attempt",
        &["3"],
        &FAST_RETRY,
    );
    assert_eq!(out["result"], 3, "{out}");
    assert_eq!(describe(&server, &id)["attempt"], 3);

    // A trap is not retried; a memory bomb is ResourceExhausted.
    let (id, out) = execute(
        &server,
        &queue,
        "demo:misbehave/api.wild-read",
        &[],
        &FAST_RETRY,
    );
    assert_eq!(
        out["failure"]["applicationFailureInfo"]["type"], "Trap",
        "{out}"
    );
    assert_eq!(
        out["failure"]["applicationFailureInfo"]["nonRetryable"],
        true
    );
    assert_eq!(describe(&server, &id)["attempt"], 1);
    let (_, out) = execute(
        &server,
        &queue,
        "demo:misbehave/api.allocate",
        &["500"],
        &FAST_RETRY,
    );
    assert_eq!(
        out["failure"]["applicationFailureInfo"]["type"], "ResourceExhausted",
        "{out}"
    );
    let message = out["failure"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("linear memory limit of 64 MiB exceeded"),
        "{message}"
    );
}

#[test]
fn a_host_deadline_is_retried_and_heartbeats_reach_the_next_attempt() {
    let server = TemporalServer::start();
    let queue = unique("q");
    let limits = r#"memory = "64MiB", timeout = "3s", max_concurrent = 8, cancel_grace = "1s""#;
    let corral = Corral::serve(&config(&server, &queue, limits));

    // Counting to 20 in 200 ms steps takes 4 s: the first attempt times out
    // at 3 s; the second resumes from its last heartbeat and finishes. (Its
    // last heartbeat the server has may be 0.8 s old, the SDK's throttle:
    // counting to 25, the second attempt had 2.8 s of its 3 s to go.)
    let id = start(
        &server,
        &queue,
        "demo:progress/api.count-to",
        &["20", "200"],
        &[
            "--heartbeat-timeout",
            "1s",
            "--retry-initial-interval",
            "100ms",
        ],
    );
    let running = wait_for(&server, &id, Duration::from_secs(30), |i| {
        i["heartbeatDetails"].is_array()
    });
    assert!(
        running["heartbeatDetails"][0]["done"]
            .as_u64()
            .is_some_and(|d| d >= 1),
        "visible while running: {running}"
    );
    let out = outcome(&server, &id);
    assert_eq!(out["status"], "COMPLETED", "{out}");
    assert_eq!(out["result"], 20);
    let info = describe(&server, &id);
    assert_eq!(info["attempt"], 2, "the timeout was retried: {info}");
    // The guest logs where it resumed: the previous attempt's last
    // heartbeat reached it through `info().last-heartbeat`.
    assert!(
        corral.stderr().contains("resuming at"),
        "{}",
        corral.stderr()
    );

    // A guest that never returns times out the same way, retryably.
    let (id, out) = execute(
        &server,
        &queue,
        "demo:misbehave/api.spin",
        &[],
        &[
            "--retry-maximum-attempts",
            "2",
            "--retry-initial-interval",
            "100ms",
        ],
    );
    assert_eq!(
        out["failure"]["applicationFailureInfo"]["type"], "Timeout",
        "{out}"
    );
    // proto3 JSON omits `false`.
    assert_ne!(
        out["failure"]["applicationFailureInfo"]["nonRetryable"],
        true
    );
    assert_eq!(describe(&server, &id)["attempt"], 2);
}

#[test]
fn cancelled_activities_end_canceled_cooperative_or_not() {
    let server = TemporalServer::start();
    let queue = unique("q");
    let _corral = Corral::serve(&config(&server, &queue, LIMITS));
    let cooperative = start(
        &server,
        &queue,
        "demo:progress/api.count-to",
        &["1000", "50"],
        &["--heartbeat-timeout", "2s"],
    );
    let stuck = start(&server, &queue, "demo:misbehave/api.spin", &[], &[]);
    for id in [&cooperative, &stuck] {
        wait_for(&server, id, Duration::from_secs(30), |i| {
            i["runState"] == "PENDING_ACTIVITY_STATE_STARTED"
        });
        let out = server.cli(&["activity", "cancel", "--activity-id", id]);
        assert!(out.status.success(), "{}", text(&out));
    }
    for id in [&cooperative, &stuck] {
        let info = wait_for(&server, id, Duration::from_secs(15), |i| {
            i["status"] != "ACTIVITY_EXECUTION_STATUS_RUNNING"
        });
        assert_eq!(
            info["status"], "ACTIVITY_EXECUTION_STATUS_CANCELED",
            "{id}: {info}"
        );
    }
}

#[test]
fn a_tenant_limit_of_n_runs_at_most_n_at_once_and_finishes_all() {
    let server = TemporalServer::start();
    let queue = unique("q");
    let limits = r#"memory = "64MiB", timeout = "20s", max_concurrent = 2"#;
    let _corral = Corral::serve(&config(&server, &queue, limits));
    let ids: Vec<String> = (0..6)
        .map(|_| start(&server, &queue, "demo:misbehave/api.sleep", &["1500"], &[]))
        .collect();
    let infos = all_completed(&server, &ids);
    // The server's own record of when each attempt started and completed:
    // at no instant were more than two running.
    let mut events: Vec<(f64, i32)> = Vec::new();
    for info in &infos {
        let started = timestamp(&info["lastStartedTime"]);
        let completed = timestamp(&info["lastAttemptCompleteTime"]);
        assert!(started < completed, "{info}");
        events.extend([(started, 1), (completed, -1)]);
    }
    // At equal instants, a completion frees its slot before a start takes it.
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut running, mut most) = (0, 0);
    for (_, delta) in events {
        running += delta;
        most = most.max(running);
    }
    assert_eq!(
        most, 2,
        "a limit of 2 with 6 queued runs exactly 2 at once: {infos:?}"
    );
}

#[test]
fn a_type_with_its_own_limit_runs_one_at_a_time_and_holds_no_other_back() {
    let server = TemporalServer::start();
    let queue = unique("q");
    let limits =
        r#"timeout = "20s", max_concurrent = 4, per_type = { "demo:misbehave/api.sleep" = 1 }"#;
    let corral = Corral::serve(&config(&server, &queue, limits));
    let sleeps: Vec<String> = (0..3)
        .map(|_| start(&server, &queue, "demo:misbehave/api.sleep", &["3000"], &[]))
        .collect();
    let (greet, out) = execute(
        &server,
        &queue,
        "Greet",
        &[r#"{"name":"Ada","language":"english"}"#, r#""casual""#],
        &[],
    );
    assert_eq!(out["status"], "COMPLETED", "{out}\n{}", corral.stderr());
    let infos = all_completed(&server, &sleeps);
    // Another type is not held back: by the server's own clock, Greet was
    // done before the second sleep (which waited for the first) was. (3 s
    // sleeps: Greet starts after three CLI runs, which took 2 s of a 1 s
    // sleep's margin on a loaded machine.)
    let greet_done = timestamp(&describe(&server, &greet)["lastAttemptCompleteTime"]);
    let mut sleeps_done: Vec<f64> = infos
        .iter()
        .map(|i| timestamp(&i["lastAttemptCompleteTime"]))
        .collect();
    sleeps_done.sort_by(f64::total_cmp);
    assert!(
        greet_done < sleeps_done[1],
        "Greet waited for the sleeps: done at {greet_done}, sleeps at {sleeps_done:?}"
    );
    // All three were delivered at once (the tenant allows four), but they
    // ran one after another: the last cannot finish before nine seconds of
    // sleeping have passed since the first was delivered.
    let first_delivered = infos
        .iter()
        .map(|i| timestamp(&i["lastStartedTime"]))
        .fold(f64::INFINITY, f64::min);
    let last_done = infos
        .iter()
        .map(|i| timestamp(&i["lastAttemptCompleteTime"]))
        .fold(0.0, f64::max);
    assert!(
        last_done - first_delivered >= 8.95,
        "{:.3}s: {infos:?}",
        last_done - first_delivered
    );
}

/// Waits (up to a minute) until every activity has completed; their
/// descriptions.
fn all_completed(server: &TemporalServer, ids: &[String]) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let infos: Vec<Value> = ids.iter().map(|id| describe(server, id)).collect();
        if infos
            .iter()
            .all(|i| i["status"] == "ACTIVITY_EXECUTION_STATUS_COMPLETED")
        {
            return infos;
        }
        assert!(Instant::now() < deadline, "not all finished: {infos:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn sigterm_lets_running_activities_finish_and_report_then_exits_zero() {
    let server = TemporalServer::start();
    let queue = unique("q");
    let mut corral = Corral::serve(&config(&server, &queue, LIMITS));
    let ids: Vec<String> = (0..2)
        .map(|_| start(&server, &queue, "demo:misbehave/api.sleep", &["4000"], &[]))
        .collect();
    // Both seen running (4 s: long enough to be seen one after the other,
    // short enough to end inside the 5 s shutdown_grace).
    for id in &ids {
        wait_for(&server, id, Duration::from_secs(30), |i| {
            i["runState"] == "PENDING_ACTIVITY_STATE_STARTED"
        });
    }
    let code = corral.terminate(Duration::from_secs(20));
    assert_eq!(code, Some(0), "{}", corral.stderr());
    for id in &ids {
        assert_eq!(
            describe(&server, id)["status"],
            "ACTIVITY_EXECUTION_STATUS_COMPLETED",
            "{}",
            corral.stderr()
        );
    }
    assert!(
        corral.stderr().contains("every accepted task was reported"),
        "{}",
        corral.stderr()
    );
}

#[test]
fn a_python_sdk_workflow_calls_three_corral_activities() {
    let server = TemporalServer::start();
    let queue = unique("q");
    let corral = Corral::serve(&config(&server, &queue, LIMITS));
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/workflows/three_activities.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .args(["--address", &server.address(), "--activity-queue", &queue])
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{}\n{}", text(&out), corral.stderr());
    let result: Value = serde_json::from_slice(&out.stdout).expect("the workflow result is JSON");
    assert_eq!(
        result,
        json!({"greeting": "Good day, Ada!", "everyone": ["Salut, Ada!", "Hallo, Bo!"], "counted": 3})
    );
}

#[test]
fn a_result_is_recorded_across_a_temporal_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("temporal.db");
    let port = common::processes::free_port();
    let mut server = TemporalServer::start_on(port, &db);
    let queue = unique("q");
    let corral = Corral::serve(&config(&server, &queue, LIMITS));
    // Six seconds of work; the server goes away and comes back meanwhile.
    let id = start(
        &server,
        &queue,
        "demo:progress/api.count-to",
        &["30", "200"],
        &[],
    );
    wait_for(&server, &id, Duration::from_secs(30), |i| {
        i["runState"] == "PENDING_ACTIVITY_STATE_STARTED"
    });
    server.stop();
    drop(server);
    let server = TemporalServer::start_on(port, &db);
    let info = wait_for(&server, &id, Duration::from_secs(60), |i| {
        i["status"] != "ACTIVITY_EXECUTION_STATUS_RUNNING"
    });
    assert_eq!(
        info["status"],
        "ACTIVITY_EXECUTION_STATUS_COMPLETED",
        "{info}\n{}",
        corral.stderr()
    );
    assert_eq!(outcome(&server, &id)["result"], 30);
}
