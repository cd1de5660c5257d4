//! CPU between tenants against the real binary on a real Temporal dev
//! server: a tenant's `cpu_max` holds (the host's own counters and the
//! server's own timestamps say so), and the admin API shows each tenant's
//! weight, cap and CPU. How the cores are shared under load is measured by
//! `cargo bench -p corral --bench fairness`, not asserted on time.

mod common;

use std::process::Command;

use serde_json::Value;

use common::activities::{describe, execute, text, timestamp, unique};
use common::admin::{path, token};
use common::hostile_guest;
use common::processes::{Corral, TemporalServer, free_port, sample, scrape};

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
