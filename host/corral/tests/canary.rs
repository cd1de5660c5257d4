//! Canaries end to end: the real `corral` binary serving a real Temporal dev
//! server, a candidate deployed with `--canary` taking its share of the
//! tasks, promoted on schedule, or rolled back by itself when it fails more
//! than the active version, with nothing in flight lost.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use common::activities::{execute, json_of, outcome, start, text, wait_for};
use common::admin::{Host, path};
use common::example;

const HOLD: &str = "demo:versioned/api.hold";

/// What `hold(0)` answered, run `n` times one after another.
fn answers(host: &Host, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let (_, done) = execute(
                &host.server,
                &host.queues[0],
                HOLD,
                &["0"],
                &["--retry-maximum-attempts", "1"],
            );
            match done["result"].as_str() {
                Some(version) => version.to_owned(),
                None => format!("failed: {}", done["failure"]["message"]),
            }
        })
        .collect()
}

fn tally(answers: &[String]) -> BTreeMap<&str, usize> {
    let mut counts = BTreeMap::new();
    for a in answers {
        *counts
            .entry(if a.starts_with("failed") { "failed" } else { a })
            .or_default() += 1;
    }
    counts
}

#[test]
fn a_canary_takes_its_share_of_the_tasks_and_is_promoted_on_schedule() {
    let host = Host::new("");
    let corral = host.serve(["", ""]);
    host.alpha(&["deploy", &path(&example("versioned")), "--json"]);

    let v2 = host.alpha(&[
        "deploy",
        &path(&example("v2/versioned")),
        "--canary",
        "50/3s",
        // Three, so that its two tasks below hold it as a canary however
        // long they take: past its step's 3 s it is promoted at its third.
        "--canary-min-tasks",
        "3",
        "--json",
    ]);
    assert_eq!(v2["active"], false, "{v2}");
    assert_eq!(v2["canary_percent"], 50, "{v2}");
    // Exactly half of the tasks, alternating.
    assert_eq!(
        tally(&answers(&host, 4)),
        BTreeMap::from([("v1", 2), ("v2", 2)])
    );
    let status = json_of(&host.cli(&host.tokens[0].token, &["status", "--json"]));
    let canary = &status["tenants"][0]["canaries"][0];
    assert_eq!(canary["deployment"], "versioned", "{status}");
    assert_eq!(canary["candidate"], v2["digest"], "{status}");
    assert_eq!(canary["candidate_outcomes"]["Completed"], 2, "{status}");
    assert_eq!(canary["active_outcomes"]["Completed"], 2, "{status}");
    let shown = host.cli(&host.tokens[0].token, &["status"]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains(&format!(
            "  versioned: canary {} at 50% (step 1 of 1); candidate: Completed=2; active: Completed=2\n",
            v2["digest"].as_str().unwrap()
        )),
        "{shown}"
    );
    assert!(
        shown.contains("running; outcomes: Completed=4\n"),
        "{shown}"
    );
    let scrape = host.scrape();
    assert!(
        scrape.contains(
            "corral_canary_tasks_total{tenant=\"alpha\",deployment=\"versioned\",side=\"candidate\",outcome=\"Completed\"} 2"
        ),
        "{scrape}"
    );

    // Its third task, after its one step has run its time: the candidate
    // serves every task.
    assert_eq!(
        tally(&answers(&host, 2)),
        BTreeMap::from([("v1", 1), ("v2", 1)])
    );
    corral.await_logged("canary promoted", 1);
    assert_eq!(tally(&answers(&host, 3)), BTreeMap::from([("v2", 3)]));
    let listed = host.alpha(&["ls", "--json"]);
    let active: Vec<&Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == "versioned" && c["active"] == true)
        .collect();
    assert_eq!(active.len(), 1, "{listed}");
    assert_eq!(active[0]["digest"], v2["digest"], "{listed}");
    let status = json_of(&host.cli(&host.tokens[0].token, &["status", "--json"]));
    assert_eq!(
        status["tenants"][0]["canaries"],
        serde_json::json!([]),
        "{status}"
    );
}

#[test]
fn a_canary_that_fails_more_is_rolled_back_by_itself_and_nothing_in_flight_is_lost() {
    let host = Host::new("");
    let corral = host.serve(["", ""]);
    host.alpha(&["deploy", &path(&example("versioned")), "--json"]);

    // v3 has v1's types (no gate or diff can tell them apart) but a
    // regression: hold(0) panics.
    let v3 = host.alpha(&[
        "deploy",
        &path(&example("v3/versioned")),
        "--canary",
        "50/1h",
        "--canary-margin",
        "10",
        "--canary-min-tasks",
        "2",
        "--json",
    ]);
    assert_eq!(v3["canary_percent"], 50, "{v3}");
    assert_eq!(v3["changes"]["changed"], serde_json::json!([]), "{v3}");

    // Two long tasks, one on each side (the split alternates), still
    // running when the candidate is judged on its two short tasks. (10 s:
    // one that ended first, on a slow machine, was judged with the first
    // panic, and the second short task ran v1.)
    let mut long = Vec::new();
    for _ in 0..2 {
        let id = start(&host.server, &host.queues[0], HOLD, &["10000"], &[]);
        let running = wait_for(&host.server, &id, Duration::from_secs(20), |i| {
            i.get("lastStartedTime").is_some()
        });
        assert!(running.get("lastStartedTime").is_some(), "{running}");
        long.push(id);
    }
    // Then short ones: every candidate task panics, every active one runs.
    let short = answers(&host, 4);
    assert_eq!(
        tally(&short),
        BTreeMap::from([("failed", 2), ("v1", 2)]),
        "{short:?}"
    );
    corral.await_logged("canary rolled back", 1);

    // Every task after it runs the active version...
    assert_eq!(tally(&answers(&host, 3)), BTreeMap::from([("v1", 3)]));
    // ...and the candidate's task in flight finished on the candidate.
    let mut finished: Vec<String> = long
        .iter()
        .map(|id| {
            let done = outcome(&host.server, id);
            done["result"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    finished.sort();
    assert_eq!(finished, ["v1", "v3"], "{}", corral.stderr());

    // It is held with the reason, counted, and serves no share any more.
    let status = json_of(&host.cli(&host.operator.token, &["status", "--json"]));
    let tenant = &status["tenants"][0];
    assert_eq!(tenant["canaries"], serde_json::json!([]), "{status}");
    assert_eq!(tenant["held"][0]["digest"], v3["digest"], "{status}");
    let reason = tenant["held"][0]["reasons"][0].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("rolled back by its canary: Panic: 2 of "),
        "{status}"
    );
    assert!(
        reason.ends_with("(0%) on the active version, over the margin of 10 points"),
        "{status}"
    );
    let scrape = host.scrape();
    assert!(
        scrape.contains("corral_canary_rollbacks_total{tenant=\"alpha\"} 1"),
        "{scrape}"
    );
    let digest = v3["digest"].as_str().unwrap();
    let again = host.cli(&host.tokens[0].token, &["activate", digest]);
    assert!(!again.status.success(), "{}", text(&again));
    // Removed and deployed again, the same bytes are held again.
    host.alpha(&["rm", digest, "--json"]);
    let redeployed = host.alpha(&["deploy", &path(&example("v3/versioned")), "--json"]);
    assert_eq!(redeployed["active"], false, "{redeployed}");
    assert_eq!(redeployed["held"][0], reason, "{redeployed}");
    assert_eq!(tally(&answers(&host, 2)), BTreeMap::from([("v1", 2)]));
}

#[test]
fn the_tenant_s_ramp_is_its_only_one_and_an_activation_ramps_too() {
    let host = Host::new("");
    let _corral = host.serve([
        r#"rollout = { canary = { steps = [50], every = "1h" } }"#,
        "",
    ]);
    let alpha = |args: &[&str]| host.cli(&host.tokens[0].token, args);
    let v2_file = path(&example("v2/versioned"));
    // A deployment's first version has nothing to share with: active.
    let v1 = host.alpha(&["deploy", &path(&example("versioned")), "--json"]);
    assert_eq!(v1["active"], true, "{v1}");

    // The operator's ramp is the tenant's only one.
    let own = alpha(&["deploy", &v2_file, "--canary", "99/1s"]);
    assert!(!own.status.success(), "{}", text(&own));
    assert!(
        String::from_utf8_lossy(&own.stderr).contains(
            "FailedPrecondition: tenant `alpha`'s rollout sets how its new versions ramp up (rollout.canary): a deploy cannot set its own canary"
        ),
        "{}",
        text(&own)
    );
    // A ramp out of bounds is named before anything is sent.
    let bad = alpha(&["deploy", &v2_file, "--canary", "50,10/1m"]);
    assert!(!bad.status.success(), "{}", text(&bad));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains(
            "steps: 1 to 10 percentages from 1 to 99, each over the one before; got [50, 10]"
        ),
        "{}",
        text(&bad)
    );

    // Stored inactive, then activated: the tenant's ramp applies there too.
    let v2 = host.alpha(&["deploy", &v2_file, "--inactive", "--json"]);
    assert_eq!(
        (&v2["active"], &v2["canary_percent"]),
        (&Value::Bool(false), &Value::from(0))
    );
    let activated = alpha(&["activate", v2["digest"].as_str().unwrap()]);
    assert!(activated.status.success(), "{}", text(&activated));
    assert!(
        String::from_utf8_lossy(&activated.stdout)
            .contains("is a canary taking 50% of its deployment's tasks"),
        "{}",
        text(&activated)
    );
    assert_eq!(
        tally(&answers(&host, 4)),
        BTreeMap::from([("v1", 2), ("v2", 2)])
    );
}
