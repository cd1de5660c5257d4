//! The host test harness as an activity author uses it: heartbeats with
//! details, log lines and output, resumption, injected cancellation and
//! deadlines, many tasks at once, and a Python guest through the same host.

mod common;

use std::sync::Arc;
use std::time::Duration;

use corral_core::sandbox::{FailureClass, LogLevel, Stream};
use corral_core::testing::{LogLine, TestComponent};
use serde_json::json;
use tokio::sync::Semaphore;

use common::{host, load};

#[tokio::test(flavor = "multi_thread")]
async fn activity_types_are_listed_with_their_signatures() {
    let host = host().build().unwrap();
    let greeter = load(&host, "greeter");
    let names: Vec<&str> = greeter.activity_types().iter().map(|a| &*a.name).collect();
    assert_eq!(
        names,
        ["demo:greeter/api.greet", "demo:greeter/api.greet-all"]
    );
    let greet_all = &greeter.activity_types()[1];
    assert_eq!(
        greet_all.signature(),
        "func(people: list<record { name: string, title: option<string>, \
         language: enum { english, french, german } }>) -> list<string>"
    );
    let python = load(&host, "python-shout");
    let names: Vec<&str> = python.activity_types().iter().map(|a| &*a.name).collect();
    assert_eq!(
        names,
        ["greet", "shout", "shout-checked", "remember", "count"],
        "a world-level export is named by its bare name"
    );
    let hidden: Vec<&str> = python
        .loaded()
        .unsupported
        .iter()
        .map(|u| u.name.as_str())
        .collect();
    assert_eq!(
        hidden,
        ["exports.init"],
        "componentize-py's initializer is not an activity"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn heartbeats_carry_details_and_the_next_attempt_resumes_from_the_last() {
    let host = host().build().unwrap();
    let progress = load(&host, "progress");
    let run = progress
        .call("demo:progress/api.count-to")
        .args([json!(3), json!(1)])
        .run()
        .await;
    assert_eq!(run.expect_ok(), &json!(3));
    assert_eq!(
        run.heartbeats,
        vec![
            Some(json!({"done": 1})),
            Some(json!({"done": 2})),
            Some(json!({"done": 3}))
        ]
    );

    let run = progress
        .call("demo:progress/api.count-to")
        .args([json!(5), json!(1)])
        .attempt(2)
        .last_heartbeat(json!({"done": 3}))
        .run()
        .await;
    assert_eq!(run.expect_ok(), &json!(5));
    assert_eq!(
        run.heartbeats,
        vec![Some(json!({"done": 4})), Some(json!({"done": 5}))]
    );
    assert_eq!(
        run.logs,
        vec![LogLine {
            level: LogLevel::Info,
            message: "resuming at 4".into()
        }]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_guest_sees_its_attempt_number() {
    let host = host().build().unwrap();
    let progress = load(&host, "progress");
    let run = progress
        .call("demo:progress/api.succeed-on-attempt")
        .arg(json!(3))
        .attempt(2)
        .run()
        .await;
    let f = run.expect_failure(FailureClass::Application);
    assert_eq!((f.kind.as_str(), f.retryable), ("NotYet", true));
    let run = progress
        .call("demo:progress/api.succeed-on-attempt")
        .arg(json!(3))
        .attempt(3)
        .run()
        .await;
    assert_eq!(run.expect_ok(), &json!(3));
}

#[tokio::test(flavor = "multi_thread")]
async fn cancellation_after_a_delay_reaches_a_cooperative_guest() {
    let host = host().build().unwrap();
    let progress = load(&host, "progress");
    let run = progress
        .call("demo:progress/api.count-to")
        .args([json!(100_000), json!(2)])
        .cancel_after(Duration::from_millis(200))
        .run()
        .await;
    run.expect_failure(FailureClass::Cancelled);
    assert!(!run.heartbeats.is_empty());
    assert!(
        run.elapsed < Duration::from_secs(10),
        "stopped promptly, not by a deadline"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_per_call_deadline_overrides_a_longer_tenant_timeout() {
    let host = host().timeout(Duration::from_secs(30)).build().unwrap();
    let progress = load(&host, "progress");
    let run = progress
        .call("demo:progress/api.count-to")
        .args([json!(100_000), json!(5)])
        .deadline(Duration::from_millis(150))
        .run()
        .await;
    let f = run.expect_failure(FailureClass::Timeout);
    assert!(f.message.contains("150ms"), "{}", f.message);
}

#[tokio::test(flavor = "multi_thread")]
async fn stdout_stderr_and_logs_are_captured_and_a_flood_is_cut_and_counted() {
    let host = host().max_stdio(4096).build().unwrap();
    let m = load(&host, "misbehave");
    let run = m
        .call("demo:misbehave/api.print")
        .arg(json!("hi there"))
        .run()
        .await;
    run.expect_ok();
    assert_eq!(
        run.output,
        vec![
            (Stream::Stdout, "hi there".into()),
            (Stream::Stderr, "hi there".into())
        ]
    );
    assert_eq!(run.dropped_output, 0);

    let run = m
        .call("demo:misbehave/api.flood")
        .arg(json!(10_000))
        .run()
        .await;
    run.expect_ok();
    let kept: usize = run.output.iter().map(|(_, l)| l.len()).sum::<usize>()
        + run.logs.iter().map(|l| l.message.len()).sum::<usize>();
    assert!(kept <= 4096, "kept {kept} bytes");
    assert!(
        run.dropped_output > 500_000,
        "dropped {}",
        run.dropped_output
    );
    assert_eq!(
        run.output[0],
        (Stream::Stdout, format!("flood line 0 {}", ".".repeat(46)))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_tasks_sixty_four_at_a_time_all_get_their_own_result() {
    let host = host().max_instances(64).build().unwrap();
    let greeter = load(&host, "greeter");
    let permits = Arc::new(Semaphore::new(64));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000u32 {
        let greeter = greeter.clone();
        let permit = permits.clone().acquire_owned().await.unwrap();
        tasks.spawn(async move {
            let run = greeter
                .call("demo:greeter/api.greet")
                .args([
                    json!({"name": format!("n{i}"), "language": "german"}),
                    json!({"custom": "Moin"}),
                ])
                .run()
                .await;
            drop(permit);
            (i, run.outcome)
        });
    }
    let mut seen = 0;
    while let Some(joined) = tasks.join_next().await {
        let (i, outcome) = joined.unwrap();
        let value = outcome.unwrap_or_else(|f| panic!("task {i}: {f}"));
        assert_eq!(value["message"], format!("Moin, n{i}!"));
        assert_eq!(value["calls-in-instance"], 1);
        seen += 1;
    }
    assert_eq!(seen, 1000);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_component_runs_through_the_same_host() {
    let host = host().build().unwrap();
    let python = load(&host, "python-shout");
    let run = python
        .call("shout")
        .args([json!("hey"), json!(3)])
        .attempt(2)
        .run()
        .await;
    assert_eq!(run.expect_ok(), &json!("HEY HEY HEY"));
    assert_eq!(run.heartbeats, vec![Some(json!({"length": 11}))]);
    assert_eq!(run.logs[0].message, "shouted 3 times on attempt 2");
    let run = python
        .call("shout")
        .args([json!("hey"), json!(-1)])
        .run()
        .await;
    let f = run.expect_failure(FailureClass::InvalidInput);
    assert_eq!(f.message, "parameter `times`: $: expected u32, got -1");
}

/// `counter` (a `count: func(to: u32)` heartbeating each number) cancelled
/// at its third heartbeat stops at its next check of `is-cancelled`.
async fn stops_when_cancelled(component: &TestComponent, counter: &str) {
    let run = component
        .call(counter)
        .arg(json!(100_000_000))
        .cancel_at_heartbeat(3)
        .run()
        .await;
    run.expect_failure(FailureClass::Cancelled);
    assert!(
        run.heartbeats.len() < 100,
        "{} heartbeats after the cancel",
        run.heartbeats.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_guest_fails_on_purpose_resumes_from_its_heartbeat_and_stops_when_cancelled() {
    let host = host().build().unwrap();
    let python = load(&host, "python-shout");
    // A typed failure: the guest's own kind and retry flag.
    let run = python.call("shout-checked").arg(json!("")).run().await;
    let f = run.expect_failure(FailureClass::Application);
    assert_eq!((f.kind.as_str(), f.retryable), ("Empty", false), "{f}");
    assert_eq!(f.message, "nothing to shout");
    let run = python.call("shout-checked").arg(json!("hey")).run().await;
    assert_eq!(run.expect_ok(), &json!("HEY"));
    // A retry resumes from the last attempt's heartbeat.
    let run = python
        .call("count")
        .arg(json!(5))
        .attempt(2)
        .last_heartbeat(json!({"count": 3}))
        .run()
        .await;
    assert_eq!(run.expect_ok(), &json!(5));
    assert_eq!(
        run.heartbeats,
        vec![Some(json!({"count": 4})), Some(json!({"count": 5}))]
    );
    stops_when_cancelled(&python, "count").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_javascript_guest_runs_through_the_same_host() {
    // componentize-js links `fetch`, so the component imports wasi:http; it
    // loads without any grant.
    let host = host().build().unwrap();
    let js = load(&host, "js-greeter");
    let greet = "demo:js-greeter/api.greet";
    // Typed records in and out, a u64 as a BigInt, the attempt from `info`,
    // a log line.
    let run = js
        .call(greet)
        .arg(json!({"name": "Ada", "languages": ["en", "fr"], "visits": 41}))
        .attempt(3)
        .run()
        .await;
    assert_eq!(
        run.expect_ok(),
        &json!({
            "message": "Hello, Ada! Visit 42, in en or fr.",
            "attempt": 3,
            "activity-type": greet,
        })
    );
    assert_eq!(run.logs[0].message, "greeting Ada (visit 42)");
    // A thrown failure record is a typed failure.
    let run = js
        .call(greet)
        .arg(json!({"name": "", "languages": [], "visits": 0}))
        .run()
        .await;
    let f = run.expect_failure(FailureClass::Application);
    assert_eq!((f.kind.as_str(), f.retryable), ("NoName", false), "{f}");
    // A wrong payload never reaches the guest.
    let run = js.call(greet).arg(json!({"name": "Ada"})).run().await;
    run.expect_failure(FailureClass::InvalidInput);
    // Heartbeats, resumed from the last one, and a cancel it notices.
    let count = "demo:js-greeter/api.count";
    let run = js
        .call(count)
        .arg(json!(4))
        .last_heartbeat(json!({"count": 2}))
        .run()
        .await;
    assert_eq!(run.expect_ok(), &json!(4));
    assert_eq!(
        run.heartbeats,
        vec![Some(json!({"count": 3})), Some(json!({"count": 4}))]
    );
    stops_when_cancelled(&js, count).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn aliases_and_named_arguments_are_routed_as_an_engine_delivers_them() {
    let host = host()
        .alias("Greet", "demo:greeter/api.greet")
        .build()
        .unwrap();
    let greeter = load(&host, "greeter");
    let named = |extra: Option<(&str, serde_json::Value)>| {
        let mut args = serde_json::Map::new();
        args.insert("tone".into(), json!("formal"));
        args.insert("who".into(), json!({"name": "Ada", "language": "english"}));
        if let Some((name, value)) = extra {
            args.insert(name.into(), value);
        }
        args
    };
    let run = greeter.call("Greet").named(named(None)).run().await;
    assert_eq!(run.expect_ok()["message"], "Good day, Ada!");

    let run = greeter
        .call("Greet")
        .named(named(Some(("mood", json!(1)))))
        .run()
        .await;
    let failure = run.expect_failure(FailureClass::InvalidInput);
    assert!(
        failure
            .message
            .contains("unknown argument `mood` (expected `who`, `tone`)"),
        "{failure}"
    );

    let run = greeter.call("Shout").run().await;
    let failure = run.expect_failure(FailureClass::UnknownActivity);
    assert!(
        failure.message.contains(
            "tenant `test` serves no activity type `Shout` (it serves: Greet, \
             demo:greeter/api.greet, demo:greeter/api.greet-all)"
        ),
        "{failure}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_type_limit_of_one_runs_its_tasks_one_after_the_other() {
    let host = host()
        .alias("Count", "demo:progress/api.count-to")
        .type_limit("Count", 1)
        .build()
        .unwrap();
    let progress = load(&host, "progress");
    let count = |name: &'static str| progress.call(name).args([json!(5), json!(40)]).run();
    // By alias and by full name: one limit, as under `corral serve`.
    let (a, b) = tokio::join!(count("Count"), count("demo:progress/api.count-to"));
    assert_eq!(a.expect_ok(), &json!(5));
    assert_eq!(b.expect_ok(), &json!(5));
    let (Some(a), Some(b)) = (a.active, b.active) else {
        panic!("both guests ran");
    };
    // One guest's instance exists only after the other's last heartbeat.
    assert!(
        a.1 <= b.0 || b.1 <= a.0,
        "the two tasks ran at once: {a:?} and {b:?}"
    );
}
