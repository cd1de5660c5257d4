//! Warm instances (`reuse`): a tenant's next task runs in the instance its
//! last one left, and nothing but the guest's own memory passes from one
//! task to the next. Each test fails if the bound it names is removed.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_core::sandbox::{
    FailureClass, LoadedComponent, Outcome, PreparedTenant, Reuse, Sandbox, SandboxConfig, Task,
    Tenant,
};
use serde_json::{Value, json};

use common::{example, host, hostile_guest, load};

const COUNTER: &str = "demo:misbehave/api.counter";

fn reuse(max_tasks: i64) -> Reuse {
    Reuse::new(max_tasks, Duration::from_secs(60)).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reusing_tenants_tasks_run_in_one_instance_up_to_max_tasks() {
    let host = host().reuse(reuse(3)).build().unwrap();
    let m = load(&host, "misbehave");
    let mut seen = Vec::new();
    for _ in 0..5 {
        let run = m.call(COUNTER).run().await;
        seen.push((run.expect_ok().clone(), run.warm));
    }
    assert_eq!(
        seen,
        [
            (json!(1), None),
            (json!(2), Some(1)),
            (json!(3), Some(2)),
            // Retired after its third task: a new instance.
            (json!(1), None),
            (json!(2), Some(1)),
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn each_task_in_a_warm_instance_has_its_own_output() {
    let host = host().reuse(reuse(10)).build().unwrap();
    let m = load(&host, "misbehave");
    let print = |text: &str| m.call("demo:misbehave/api.print").args([json!(text)]).run();
    let first = print("first").await;
    let second = print("second").await;
    assert_eq!(second.warm, Some(1), "the second task ran warm");
    let lines = |run: &corral_core::testing::TestRun| -> Vec<String> {
        run.output.iter().map(|(_, line)| line.clone()).collect()
    };
    // The guest's libc kept its stdout and stderr streams from the first
    // task; in the second they write to the second task's output.
    assert_eq!(lines(&first), ["first", "first"]);
    assert_eq!(lines(&second), ["second", "second"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_is_retired_after_a_trap() {
    let host = host().reuse(reuse(10)).build().unwrap();
    let m = load(&host, "misbehave");
    m.call(COUNTER).run().await.expect_ok();
    assert_eq!(m.call(COUNTER).run().await.expect_ok(), &json!(2));
    let panicked = m
        .call("demo:misbehave/api.panic")
        .args([json!("boom")])
        .run()
        .await;
    panicked.expect_failure(FailureClass::Panic);
    assert_eq!(panicked.warm, Some(2), "the panic ran in the warm instance");
    let after = m.call(COUNTER).run().await;
    assert_eq!(
        (after.expect_ok(), after.warm),
        (&json!(1), None),
        "a new instance after the trap"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_over_its_output_budget_is_retired() {
    let host = host().reuse(reuse(10)).max_stdio(4096).build().unwrap();
    let m = load(&host, "misbehave");
    let flood = m
        .call("demo:misbehave/api.flood")
        .args([json!(1000)])
        .run()
        .await;
    flood.expect_ok();
    assert!(flood.dropped_output > 0, "the flood went over the budget");
    let after = m.call(COUNTER).run().await;
    assert_eq!((after.expect_ok(), after.warm), (&json!(1), None));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_that_keeps_a_handle_is_not_kept() {
    let host = host().reuse(reuse(10)).build().unwrap();
    let hostile = host.load_file(hostile_guest("hostile")).unwrap();
    for _ in 0..2 {
        let run = hostile.call("demo:hostile/api.keep-handle").run().await;
        // A warm instance would hold the first task's pollable: 2.
        assert_eq!((run.expect_ok(), run.warm), (&json!(1), None));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_memory_limit_covers_what_a_warm_instance_keeps() {
    // `remember` keeps 4 MiB more in the instance each time.
    let host = host().reuse(reuse(100)).memory(32 << 20).build().unwrap();
    let m = load(&host, "misbehave");
    let mut kept = 0;
    let failure = loop {
        let run = m
            .call("demo:misbehave/api.remember")
            .args([json!("x"), json!(1)])
            .run()
            .await;
        match run.outcome {
            Ok(_) => kept += 1,
            Err(failure) => break failure,
        }
        assert!(kept < 10, "{kept} x 4 MiB kept under a 32 MiB limit");
    };
    assert_eq!(failure.class, FailureClass::ResourceExhausted, "{failure}");
    assert!(kept >= 4, "only {kept} fit");
}

/// A sandbox, one loaded `misbehave`, and tenants of it.
struct Shared {
    sandbox: Arc<Sandbox>,
    component: Arc<LoadedComponent>,
}

impl Shared {
    fn new(max_warm: u32) -> Shared {
        let sandbox = Sandbox::new(SandboxConfig {
            max_instances: 8,
            max_warm,
            ..SandboxConfig::default()
        })
        .unwrap();
        let component = sandbox.load_file(&example("misbehave")).unwrap();
        Shared { sandbox, component }
    }

    fn tenant(&self, name: &str, reuse: Option<Reuse>) -> PreparedTenant {
        self.sandbox
            .prepare(Tenant {
                name: name.to_owned(),
                reuse,
                ..Tenant::default()
            })
            .unwrap()
    }

    async fn counter(&self, tenant: &PreparedTenant) -> Value {
        let outcome: Outcome = self
            .sandbox
            .execute(&self.component, tenant, Task::new(COUNTER, vec![]))
            .await;
        outcome.unwrap()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_instance_never_passes_to_another_tenant_or_version() {
    let shared = Shared::new(8);
    let a = shared.tenant("a", Some(reuse(100)));
    let b = shared.tenant("b", Some(reuse(100)));
    let fresh = shared.tenant("fresh", None);
    let mut counts = Vec::new();
    for _ in 0..3 {
        for tenant in [&a, &b, &fresh] {
            counts.push(shared.counter(tenant).await);
        }
    }
    assert_eq!(counts, [1, 1, 1, 2, 2, 1, 3, 3, 1].map(|n| json!(n)));
    assert_eq!(shared.sandbox.warm_instances(), 2);
    // Another version of `a` (a new config, grants or secrets) starts cold.
    let a2 = a.clone();
    assert_eq!(shared.counter(&a2).await, json!(1));
    assert_eq!(shared.counter(&a).await, json!(4));
    drop((a, a2, b));
    assert_eq!(
        shared.sandbox.warm_instances(),
        0,
        "dropped with its tenant"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_instances_are_retired_and_the_host_keeps_at_most_max_warm() {
    let shared = Shared::new(1);
    let a = shared.tenant("a", Some(reuse(100)));
    let b = shared.tenant("b", Some(reuse(100)));
    assert_eq!(shared.counter(&a).await, json!(1));
    // The host keeps one warm instance, `a`'s: `b`'s is not kept.
    assert_eq!(shared.counter(&b).await, json!(1));
    assert_eq!(shared.counter(&b).await, json!(1));
    assert_eq!(shared.counter(&a).await, json!(2));
    assert_eq!(shared.sandbox.warm_instances(), 1);
    // Not yet idle for a minute: kept.
    assert_eq!(shared.sandbox.retire_idle_instances(Instant::now()), 0);
    let later = Instant::now() + Duration::from_secs(60);
    assert_eq!(shared.sandbox.retire_idle_instances(later), 1);
    assert_eq!(shared.sandbox.warm_instances(), 0);
    assert_eq!(shared.counter(&a).await, json!(1));
}

/// The point of reuse: an interpreter's start-up is paid once per
/// instance, not per task. Python's and JavaScript's runtimes keep only
/// their output streams between tasks, so their instances are kept.
#[tokio::test(flavor = "multi_thread")]
async fn python_and_javascript_guests_run_warm() {
    let host = host().reuse(reuse(10)).build().unwrap();
    for (guest, activity, arg, expected) in [
        ("python-shout", "shout-checked", json!("hi"), json!("HI")),
        (
            "js-greeter",
            "demo:js-greeter/api.shout",
            json!("hi"),
            json!("HI"),
        ),
    ] {
        let component = load(&host, guest);
        let mut warm = Vec::new();
        for _ in 0..3 {
            let run = component.call(activity).args([arg.clone()]).run().await;
            assert_eq!(run.expect_ok(), &expected, "{guest}");
            warm.push(run.warm);
        }
        assert_eq!(warm, [None, Some(1), Some(2)], "{guest}");
    }
}

/// A guest keeps deadlines and timestamps from its monotonic clock between
/// tasks: in a warm instance that clock goes on, never back.
#[tokio::test(flavor = "multi_thread")]
async fn a_warm_instances_monotonic_clock_never_runs_backwards() {
    let host = host().reuse(reuse(10)).build().unwrap();
    let hostile = host.load_file(hostile_guest("hostile")).unwrap();
    let clock = |rounds: u64| {
        hostile
            .call("demo:hostile/api.monotonic")
            .args([json!(rounds)])
            .run()
    };
    // Read after some computing, so the clock is well past its start.
    let first = clock(20_000_000).await;
    let second = clock(0).await;
    assert_eq!(second.warm, Some(1));
    let (first, second) = (first.expect_ok(), second.expect_ok());
    assert!(
        second.as_u64() > first.as_u64(),
        "the clock read {first} ns, then {second} ns in the next task"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_warm_slots_even_out_between_tenants_that_reuse() {
    let shared = Shared::new(2);
    let a = shared.tenant("a", Some(reuse(100)));
    let b = shared.tenant("b", Some(reuse(100)));
    // Two of `a`'s tasks at once (each waits on the clock, so both are
    // in flight together): two instances, and the host is full.
    let sleep = || Task::new("demo:misbehave/api.sleep", vec![json!(20)]);
    let (first, second) = tokio::join!(
        shared.sandbox.execute(&shared.component, &a, sleep()),
        shared.sandbox.execute(&shared.component, &a, sleep()),
    );
    first.unwrap();
    second.unwrap();
    assert_eq!(shared.sandbox.warm_instances(), 2);
    // `b`'s instance takes the place of `a`'s oldest: both tenants run warm.
    assert_eq!(shared.counter(&b).await, json!(1));
    assert_eq!(shared.sandbox.warm_instances(), 2);
    assert_eq!(shared.counter(&b).await, json!(2));
    // `a` kept its other instance.
    assert_eq!(shared.counter(&a).await, json!(1));
    assert_eq!(shared.counter(&a).await, json!(2));
    assert_eq!(shared.sandbox.warm_instances(), 2);
    // Even now (one each): a third tenant takes neither's.
    let c = shared.tenant("c", Some(reuse(100)));
    assert_eq!(shared.counter(&c).await, json!(1));
    assert_eq!(shared.counter(&c).await, json!(1));
    assert_eq!(shared.counter(&b).await, json!(3));
}
