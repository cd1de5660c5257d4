//! `corral status`: the host's permits, and each tenant's tasks, outcomes,
//! CPU, warm instances and followed tags, as a table or `--json`.

use std::process::ExitCode;

use serde_json::{Value, json};

use corral::control::proto;

use super::admin::{ConnOnly, call};

pub async fn status(args: ConnOnly) -> ExitCode {
    let request = proto::StatusRequest {
        tenant: args.conn.tenant(),
    };
    let s = call!(args.conn, status, request);
    if args.conn.json {
        let tenants: Vec<Value> = s
            .tenants
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "max_concurrent": t.max_concurrent,
                    "in_use": t.in_use,
                    "in_flight": t.in_flight,
                    "cpu_weight": t.cpu_weight,
                    "cpu_max": t.cpu_max,
                    "cpu_seconds": t.cpu_seconds,
                    "cpu_wait_seconds": t.cpu_wait_seconds,
                    "cpu_throttled_seconds": t.cpu_throttled_seconds,
                    "reuse_max_tasks": t.reuse_max_tasks,
                    "reuse_idle_ms": t.reuse_idle_ms,
                    "reused_tasks": t.reused_tasks,
                    "outcomes": t.outcomes.iter().collect::<std::collections::BTreeMap<_, _>>(),
                    "activity_types": t.activity_types,
                    "active": t.active.iter().collect::<std::collections::BTreeMap<_, _>>(),
                    "active_signers": t.active_signers.iter().map(|(d, s)| (d, (!s.is_empty()).then_some(s))).collect::<std::collections::BTreeMap<_, _>>(),
                    "following": t.following.iter().map(|f| json!({
                        "reference": f.reference,
                        "deployment": f.deployment,
                        "wanted": f.wanted,
                        "active": f.active,
                        "last_error": f.last_error,
                        "held": f.held,
                    })).collect::<Vec<_>>(),
                    "canaries": t.canaries.iter().map(|c| json!({
                        "deployment": c.deployment,
                        "candidate": c.candidate,
                        "percent": c.percent,
                        "step": c.step,
                        "steps": c.steps,
                        "active_outcomes": c.active_outcomes.iter().collect::<std::collections::BTreeMap<_, _>>(),
                        "candidate_outcomes": c.candidate_outcomes.iter().collect::<std::collections::BTreeMap<_, _>>(),
                    })).collect::<Vec<_>>(),
                    "held": t.held.iter().map(|h| json!({
                        "deployment": h.deployment,
                        "digest": h.digest,
                        "reasons": h.reasons,
                    })).collect::<Vec<_>>(),
                    "recorded": t.recorded.iter().map(|r| json!({
                        "name": r.name,
                        "attempts": r.attempts,
                        "bytes": r.bytes,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!(
            "{}",
            json!({"host_max_concurrent": s.host_max_concurrent, "host_in_use": s.host_in_use, "tenants": tenants})
        );
        return ExitCode::SUCCESS;
    }
    println!(
        "host: {} of {} permits in use",
        s.host_in_use, s.host_max_concurrent
    );
    for t in &s.tenants {
        println!(
            "{}: {} of {} permits, {} running; outcomes: {}",
            t.name,
            t.in_use,
            t.max_concurrent,
            t.in_flight,
            outcomes_text(&t.outcomes)
        );
        println!("  serves: {}", t.activity_types.join(", "));
        println!(
            "  cpu: weight {}{}; used {:.3}s, waited {:.3}s for a core, throttled {:.3}s",
            t.cpu_weight,
            if t.cpu_max > 0.0 {
                format!(", at most {} cores", t.cpu_max)
            } else {
                String::new()
            },
            t.cpu_seconds,
            t.cpu_wait_seconds,
            t.cpu_throttled_seconds
        );
        if t.reuse_max_tasks > 0 {
            println!(
                "  reuse: up to {} tasks per instance, kept {:?} idle; {} tasks ran warm",
                t.reuse_max_tasks,
                std::time::Duration::from_millis(t.reuse_idle_ms),
                t.reused_tasks
            );
        }
        let active: std::collections::BTreeMap<_, _> = t.active.iter().collect();
        for (deployment, digest) in active {
            let signer = match t.active_signers.get(deployment) {
                Some(signer) if !signer.is_empty() => format!("signed by key {signer}"),
                _ => "unsigned".to_owned(),
            };
            println!("  {deployment}: active {digest} ({signer})");
        }
        for c in &t.canaries {
            println!(
                "  {}: canary {} at {}% (step {} of {}); candidate: {}; active: {}",
                c.deployment,
                c.candidate,
                c.percent,
                c.step + 1,
                c.steps,
                outcomes_text(&c.candidate_outcomes),
                outcomes_text(&c.active_outcomes)
            );
        }
        for h in &t.held {
            println!(
                "  {}: held {} for approval: {}",
                h.deployment,
                h.digest,
                h.reasons.join("; ")
            );
        }
        for r in &t.recorded {
            println!(
                "  {}: {} attempts recorded for shadow replay ({} bytes)",
                r.name, r.attempts, r.bytes
            );
        }
        for f in &t.following {
            let or_none = |d: &str| {
                if d.is_empty() {
                    "none".to_owned()
                } else {
                    d.to_owned()
                }
            };
            println!(
                "  follows {}: names {}, active {}{}",
                f.reference,
                or_none(&f.wanted),
                or_none(&f.active),
                if f.last_error.is_empty() {
                    String::new()
                } else {
                    format!("; last check failed: {}", f.last_error)
                }
            );
            if !f.held.is_empty() {
                println!("    {} held for approval", f.held);
            }
        }
    }
    ExitCode::SUCCESS
}

/// Finished tasks by outcome, `Completed=3 Trap=1` (by name), or `none yet`.
fn outcomes_text(outcomes: &std::collections::HashMap<String, u64>) -> String {
    let sorted: std::collections::BTreeMap<_, _> = outcomes.iter().collect();
    if sorted.is_empty() {
        return "none yet".to_owned();
    }
    let shown: Vec<String> = sorted.iter().map(|(k, v)| format!("{k}={v}")).collect();
    shown.join(" ")
}
