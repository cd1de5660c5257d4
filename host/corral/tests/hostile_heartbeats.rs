//! A guest's heartbeat details against `corral serve` on a real Temporal
//! dev server: what the host keeps of them, for as long as the task runs,
//! is bounded by their text, not by the JSON values in it.

mod common;

use std::time::Duration;

use common::activities::{outcome, resident_after_a_hostile_task, start, unique, wait_for};
use common::admin::path;
use common::hostile_guest;
use common::processes::{Corral, free_port};
use common::temporal::TemporalServer;

/// Tasks in flight at once, each holding its details.
const TASKS: u64 = 4;
/// Each task's details: under the dev server's 2 MB limit on a payload,
/// and about 786,000 JSON values (`[0,0,…]`).
const DETAILS: u64 = 3 << 19;

/// Four tasks each heartbeat 1.5 MiB of `[0,0,…]` and then sleep: the host
/// keeps each task's latest details (to repeat at every beat) while it
/// runs. Kept as the values they parse to, that was about 36 times their
/// text (72 MiB a task); kept as text, their size.
#[test]
fn heartbeat_details_cost_the_host_their_text_not_the_values_in_it() {
    let server = TemporalServer::start();
    let queue = unique("beats");
    let metrics = free_port();
    let corral = Corral::serve(&format!(
        r#"
[host]
max_concurrent = {TASKS}
metrics_listen = "127.0.0.1:{metrics}"

[[tenant]]
name = "beats"
temporal = {{ address = "http://{address}", task_queue = "{queue}" }}
limits = {{ max_concurrent = {TASKS}, timeout = "60s" }}
components = [{hostile:?}]
"#,
        address = server.address(),
        hostile = path(&hostile_guest("hostile")),
    ));
    let before = resident_after_a_hostile_task(&server, &corral, &queue);

    let details = DETAILS.to_string();
    let tasks: Vec<String> = (0..TASKS)
        .map(|_| {
            start(
                &server,
                &queue,
                "demo:hostile/api.heartbeat-values",
                &[&details, "10000"],
                // Kept alive by the host's beats, which repeat the
                // details, while the guest sleeps.
                &["--retry-maximum-attempts", "1", "--heartbeat-timeout", "4s"],
            )
        })
        .collect();
    // Every task has heartbeated, and sleeps while the host holds its
    // details.
    corral.await_logged("heartbeated", TASKS as usize);
    let during = corral.status_kib("VmRSS");
    let grown = during.saturating_sub(before);
    eprintln!("resident: {before} KiB before, {during} KiB with {TASKS} tasks' details held");
    // Each task's text four times (the host's copy, the SDK's payload, a
    // request being encoded and compressed) and 16 MiB for everything
    // else: 40 MiB. (Measured: 21 MiB; 230 MiB with the values kept.)
    let bound = TASKS * 4 * (DETAILS >> 10) + 16 * 1024;
    assert!(
        grown <= bound,
        "{TASKS} tasks' details of {DETAILS} bytes each grew the host by {grown} KiB, over {bound} KiB"
    );

    // The details reached the engine whole, and every task ends.
    let running = wait_for(&server, &tasks[0], Duration::from_secs(30), |i| {
        i["heartbeatDetails"][0].is_array()
    });
    let values = running["heartbeatDetails"][0].as_array().map(Vec::len);
    assert_eq!(values, Some(((DETAILS - 1) / 2) as usize));
    for id in &tasks {
        let out = outcome(&server, id);
        assert_eq!(out["status"], "COMPLETED", "{out}\n{}", corral.stderr());
    }
}
