//! Driving activities through a real Temporal server with the `temporal`
//! CLI's Standalone Activities: execute, start, describe, await.

use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::processes::Corral;
use super::temporal::TemporalServer;

pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

pub fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

pub fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(output)))
}

/// The `temporal activity` arguments to run `ty` with one input per
/// argument.
pub fn activity_args(
    id: &str,
    queue: &str,
    ty: &str,
    inputs: &[&str],
    extra: &[&str],
) -> Vec<String> {
    let mut args: Vec<String> = [
        "--activity-id",
        id,
        "--type",
        ty,
        "--task-queue",
        queue,
        "-o",
        "json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if !extra.contains(&"--start-to-close-timeout") {
        args.extend(["--start-to-close-timeout".into(), "60s".into()]);
    }
    for input in inputs {
        args.extend(["--input".into(), input.to_string()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// `temporal activity execute`: waits for the outcome, returns its JSON
/// (`status`, `result` or `failure`).
pub fn execute(
    server: &TemporalServer,
    queue: &str,
    ty: &str,
    inputs: &[&str],
    extra: &[&str],
) -> (String, Value) {
    let id = unique("act");
    let mut args = vec!["activity".to_owned(), "execute".to_owned()];
    args.extend(activity_args(&id, queue, ty, inputs, extra));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = server.cli(&args);
    if busy(&out) {
        // Started, but the server turned the wait for its result away.
        return (id.clone(), outcome(server, &id));
    }
    (id, json_of(&out))
}

/// The server turned a long poll away as busy ("Workflow is busy", a
/// transient resource-exhausted answer from a loaded dev server). Any
/// client asks again; the activity itself is unaffected.
fn busy(output: &Output) -> bool {
    !output.status.success() && String::from_utf8_lossy(&output.stderr).contains("is busy")
}

/// Runs `ask`, and again a bounded number of times while the server
/// answers that it is [`busy`].
fn patiently(ask: impl Fn() -> Output) -> Output {
    let mut out = ask();
    for _ in 0..20 {
        if !busy(&out) {
            break;
        }
        out = ask();
    }
    out
}

/// [`execute`], asserting that the activity completed (quoting corral's
/// log if not); returns its result.
pub fn execute_completed(
    server: &TemporalServer,
    corral: &Corral,
    queue: &str,
    ty: &str,
    inputs: &[&str],
) -> Value {
    let (_, out) = execute(server, queue, ty, inputs, &[]);
    assert_eq!(out["status"], "COMPLETED", "{out}\n{}", corral.stderr());
    out["result"].clone()
}

/// corral's resident memory (KiB) once a quick task of the hostile guest
/// on `queue` has completed (the component compiled, a slot used): the
/// baseline of a memory bound.
pub fn resident_after_a_hostile_task(server: &TemporalServer, corral: &Corral, queue: &str) -> u64 {
    execute_completed(
        server,
        corral,
        queue,
        "demo:hostile/api.random-once",
        &["16"],
    );
    corral.status_kib("VmRSS")
}

/// `temporal activity start`: returns at once with the activity id.
pub fn start(
    server: &TemporalServer,
    queue: &str,
    ty: &str,
    inputs: &[&str],
    extra: &[&str],
) -> String {
    let id = unique("act");
    let mut args = vec!["activity".to_owned(), "start".to_owned()];
    args.extend(activity_args(&id, queue, ty, inputs, extra));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = server.cli(&args);
    assert!(out.status.success(), "{}", text(&out));
    id
}

/// `temporal activity describe`. Asks again, a bounded number of times,
/// when the server is [`busy`] (the dev server answers so while it is
/// writing the activity's own state, as at a heartbeat).
pub fn describe(server: &TemporalServer, id: &str) -> Value {
    let out =
        patiently(|| server.cli(&["activity", "describe", "--activity-id", id, "-o", "json"]));
    assert!(out.status.success(), "{}", text(&out));
    json_of(&out)["info"].clone()
}

/// Waits for the activity's outcome (`temporal activity result`).
/// Asks again, a bounded number of times, when the server is [`busy`].
pub fn outcome(server: &TemporalServer, id: &str) -> Value {
    json_of(&patiently(|| {
        server.cli(&["activity", "result", "--activity-id", id, "-o", "json"])
    }))
}

/// Polls `describe` until `done` holds; fails the test after `patience`.
pub fn wait_for(
    server: &TemporalServer,
    id: &str,
    patience: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + patience;
    loop {
        let info = describe(server, id);
        if done(&info) {
            return info;
        }
        assert!(
            Instant::now() < deadline,
            "`{id}` not there within {patience:?}: {info}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub const FAST_RETRY: [&str; 4] = [
    "--retry-initial-interval",
    "100ms",
    "--retry-maximum-interval",
    "200ms",
];

/// Seconds since the epoch of an RFC 3339 UTC timestamp such as
/// `2026-11-29T17:10:55.779671971Z`.
pub fn timestamp(value: &Value) -> f64 {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("not a timestamp: {value}"));
    let (date, time) = text
        .trim_end_matches('Z')
        .split_once('T')
        .expect("RFC 3339");
    let d: Vec<i64> = date.split('-').map(|p| p.parse().expect("date")).collect();
    let t: Vec<f64> = time.split(':').map(|p| p.parse().expect("time")).collect();
    // Days from civil (Howard Hinnant's algorithm).
    let (y, m, day) = (if d[1] <= 2 { d[0] - 1 } else { d[0] }, d[1], d[2]);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days as f64 * 86_400.0 + t[0] * 3600.0 + t[1] * 60.0 + t[2]
}
