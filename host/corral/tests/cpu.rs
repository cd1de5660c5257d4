//! CPU between tenants against the real binary on a real Temporal dev
//! server: a tenant's `cpu_max` holds (the host's own counters and the
//! server's own timestamps say so), and the admin API shows each tenant's
//! weight, cap and CPU; and a guest's time is spent on the guests' own
//! threads, not the host's (the threads' own CPU clocks say so). How the
//! cores are shared under load is measured by `cargo bench -p corral
//! --bench fairness`, not asserted on time.

mod common;

use std::process::Command;

use serde_json::Value;

use common::activities::{describe, execute, text, timestamp, unique};
use common::admin::{path, token};
use common::hostile_guest;
use common::processes::{Corral, free_port, sample, scrape};
use common::temporal::TemporalServer;

/// A quarter of a core: 25 ms of CPU in every 100 ms window.
const CAP: f64 = 0.25;
/// About 0.7 s of CPU here (xorshift rounds in the guest).
const ROUNDS: &str = "400000000";

#[test]
fn a_tenant_capped_at_a_quarter_core_never_runs_faster_than_its_cap() {
    let server = TemporalServer::start();
    let queue = unique("capped");
    let (admin, metrics) = (free_port(), free_port());
    let data = tempfile::tempdir().unwrap();
    let operator = token();
    let corral = Corral::serve(&format!(
        r#"
[host]
admin_listen = "127.0.0.1:{admin}"
metrics_listen = "127.0.0.1:{metrics}"
data_dir = {data:?}
operator_token_sha256 = "{hash}"

[[tenant]]
name = "capped"
cpu_weight = 300
cpu_max = {CAP}
temporal = {{ address = "http://{address}", task_queue = "{queue}" }}
limits = {{ timeout = "120s" }}
components = [{hostile:?}]
"#,
        data = path(data.path()),
        hash = operator.sha256,
        address = server.address(),
        hostile = path(&hostile_guest("hostile")),
    ));

    let (id, out) = execute(&server, &queue, "demo:hostile/api.burn", &[ROUNDS], &[]);
    assert_eq!(out["status"], "COMPLETED", "{out}\n{}", corral.stderr());

    // The host counted the task's CPU, and time its cap held it back.
    let scraped = scrape(metrics);
    let cpu = sample(
        &scraped,
        r#"corral_tenant_cpu_seconds_total{tenant="capped",activity_type="demo:hostile/api.burn"}"#,
    )
    .unwrap_or_else(|| panic!("no CPU counted:\n{scraped}"));
    let throttled = sample(
        &scraped,
        r#"corral_tenant_cpu_throttled_seconds_total{tenant="capped"}"#,
    )
    .unwrap_or(0.0);
    assert!(cpu >= 0.2, "{cpu} s of CPU counted for the burn");
    assert!(
        throttled > 0.0,
        "the cap never held the task back:\n{scraped}"
    );

    // By the server's clock, the attempt ran at least as long as its CPU
    // takes at a quarter core: 25 ms per 100 ms window, and (giving the
    // slices that end past a window's budget 5 ms more) at most 30 ms, after
    // a first window it may use whole. Uncapped, it runs in about its CPU.
    let info = describe(&server, &id);
    let ran = timestamp(&info["lastAttemptCompleteTime"]) - timestamp(&info["lastStartedTime"]);
    let least = (cpu / 0.030 - 1.0) * 0.1;
    assert!(
        ran >= least,
        "{cpu:.3} s of CPU ran in {ran:.2} s: faster than a cap of {CAP} cores allows ({least:.2} s)"
    );

    // The admin API's view of the tenant.
    let status = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["status", "--json"])
        .env("CORRAL_ENDPOINT", format!("http://127.0.0.1:{admin}"))
        .env("CORRAL_TOKEN", &operator.token)
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", text(&status));
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    let tenant = &status["tenants"][0];
    assert_eq!(tenant["name"], "capped", "{status}");
    assert_eq!(tenant["cpu_weight"], 300, "{status}");
    assert_eq!(tenant["cpu_max"], CAP, "{status}");
    let seconds = tenant["cpu_seconds"].as_f64().unwrap_or(0.0);
    assert!((seconds - cpu).abs() < 1e-6, "{status} against {cpu}");
    assert!(
        tenant["cpu_throttled_seconds"].as_f64().unwrap_or(0.0) > 0.0,
        "{status}"
    );
}

/// A guest's CPU is spent on the guests' threads: the host's own threads
/// give a task at most its first time slice (a fuel interval, with its
/// conversion and instantiation), and everything after goes on a
/// `corral-guest` thread, below the host's priority. Counted from the
/// kernel's own count of each thread's time on a CPU, not by time.
#[test]
fn a_guests_cpu_is_spent_on_the_guests_threads_not_the_hosts() {
    let server = TemporalServer::start();
    let queue = unique("burner");
    let metrics = free_port();
    let data = tempfile::tempdir().unwrap();
    let corral = Corral::serve(&format!(
        r#"
[host]
metrics_listen = "127.0.0.1:{metrics}"
data_dir = {data:?}

[[tenant]]
name = "burner"
temporal = {{ address = "http://{address}", task_queue = "{queue}" }}
limits = {{ timeout = "120s" }}
components = [{hostile:?}]
"#,
        data = path(data.path()),
        address = server.address(),
        hostile = path(&hostile_guest("hostile")),
    ));
    let burn = "demo:hostile/api.burn";
    let series =
        format!(r#"corral_tenant_cpu_seconds_total{{tenant="burner",activity_type="{burn}"}}"#);
    // One short task first: whatever the first task of a component does
    // once is not in what is counted.
    let (_, out) = execute(&server, &queue, burn, &["1000"], &[]);
    assert_eq!(out["status"], "COMPLETED", "{out}\n{}", corral.stderr());
    let counted_before = sample(&scrape(metrics), &series).unwrap_or(0.0);

    let pid = corral.pid();
    let before = threads_cpu(pid);
    let (_, out) = execute(&server, &queue, burn, &[ROUNDS], &[]);
    assert_eq!(out["status"], "COMPLETED", "{out}\n{}", corral.stderr());
    let after = threads_cpu(pid);
    let counted = sample(&scrape(metrics), &series).unwrap_or(0.0) - counted_before;

    // Each thread's CPU since the first look (a thread started since, from
    // nothing); a thread that ended since is not counted.
    let (mut guests, mut hosts) = (0.0, 0.0);
    for (tid, (name, cpu)) in &after {
        let used = cpu - before.get(tid).map_or(0.0, |(_, cpu)| *cpu);
        if name == "corral-guest" {
            guests += used;
        } else {
            hosts += used;
        }
    }
    assert!(counted >= 0.2, "{counted} s of CPU counted for the burn");
    assert!(
        guests >= 0.9 * counted,
        "the guest threads used {guests:.3} s of the task's {counted:.3} s"
    );
    assert!(
        hosts <= 0.1 * counted,
        "the host's own threads used {hosts:.3} s while the task used {counted:.3} s"
    );
}

/// Each thread of a process: its name, and its time on a CPU so far in
/// seconds (the kernel's `schedstat`, in nanoseconds).
fn threads_cpu(pid: u32) -> std::collections::BTreeMap<u64, (String, f64)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|entry| {
            let task = entry.ok()?.path();
            let tid = task.file_name()?.to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(task.join("comm")).ok()?;
            let schedstat = std::fs::read_to_string(task.join("schedstat")).ok()?;
            let nanos: f64 = schedstat.split_whitespace().next()?.parse().ok()?;
            Some((tid, (name.trim().to_owned(), nanos / 1e9)))
        })
        .collect()
}
