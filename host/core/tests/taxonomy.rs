//! Every class of the failure taxonomy, produced by a real guest: class,
//! retryable flag and the substance of the message, and a host that stays
//! healthy for the next task.

mod common;

use std::time::Duration;

use corral_core::sandbox::FailureClass;
use corral_core::testing::{TestComponent, TestHost};
use serde_json::json;

use common::{host, load};

/// The greeter still works: nothing a failed task did poisoned the host.
async fn assert_healthy(host: &TestHost) {
    let greeter = load(host, "greeter");
    let run = greeter
        .call("demo:greeter/api.greet")
        .args([
            json!({"name": "Ada", "language": "french"}),
            json!("formal"),
        ])
        .run()
        .await;
    assert_eq!(run.expect_ok()["message"], "Bonjour, Ada!");
}

fn misbehave(host: &TestHost) -> TestComponent {
    load(host, "misbehave")
}

#[tokio::test(flavor = "multi_thread")]
async fn application_failure_keeps_the_guests_kind_flag_and_details() {
    let host = host().build().unwrap();
    let m = misbehave(&host);
    let run = m
        .call("demo:misbehave/api.fail")
        .args([json!("PaymentDeclined"), json!(false)])
        .run()
        .await;
    let f = run.expect_failure(FailureClass::Application);
    assert_eq!(f.kind, "PaymentDeclined");
    assert!(!f.retryable);
    assert_eq!(f.message, "failed on purpose: PaymentDeclined");
    assert_eq!(f.details, Some(json!({"why": "asked to"})));

    let run = m
        .call("demo:misbehave/api.fail")
        .args([json!("Flaky"), json!(true)])
        .run()
        .await;
    assert!(run.expect_failure(FailureClass::Application).retryable);
    assert_healthy(&host).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn another_error_type_is_a_retryable_application_failure_with_the_value_as_details() {
    let host = host().build().unwrap();
    let run = misbehave(&host)
        .call("demo:misbehave/api.plain-error")
        .arg(json!(7))
        .run()
        .await;
    let f = run.expect_failure(FailureClass::Application);
    assert_eq!(f.kind, "Application");
    assert!(f.retryable);
    assert_eq!(f.details, Some(json!([7, "plain error"])));
    assert!(f.message.contains("[7,\"plain error\"]"), "{}", f.message);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rust_panic_is_a_non_retryable_panic_with_the_message_and_location() {
    let host = host().build().unwrap();
    let run = misbehave(&host)
        .call("demo:misbehave/api.panic")
        .arg(json!("the flux capacitor broke"))
        .run()
        .await;
    let f = run.expect_failure(FailureClass::Panic);
    assert_eq!(f.kind, "Panic");
    assert!(!f.retryable);
    assert!(
        f.message.contains("the flux capacitor broke"),
        "{}",
        f.message
    );
    assert!(
        f.message.contains("Guest>::panic`"),
        "names the guest function: {}",
        f.message
    );
    assert!(!f.message.contains("RUST_BACKTRACE"), "{}", f.message);
    let details = f.details.as_ref().unwrap();
    assert_eq!(details["trap"], "UnreachableCodeReached");
    assert!(
        details["backtrace"]
            .as_array()
            .is_some_and(|b| !b.is_empty())
    );
    assert_healthy(&host).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_out_of_bounds_access_is_a_trap_naming_the_code_and_function() {
    let host = host().build().unwrap();
    let run = misbehave(&host)
        .call("demo:misbehave/api.wild-read")
        .run()
        .await;
    let f = run.expect_failure(FailureClass::Trap);
    assert!(!f.retryable);
    assert!(
        f.message.contains("out of bounds memory access"),
        "{}",
        f.message
    );
    assert!(f.message.contains("wild-read"), "{}", f.message);
    assert_eq!(f.details.as_ref().unwrap()["trap"], "MemoryOutOfBounds");
    assert_healthy(&host).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deep_recursion_is_a_trap_that_points_at_the_recursion() {
    let host = host().build().unwrap();
    let run = misbehave(&host)
        .call("demo:misbehave/api.recurse")
        .arg(json!(u64::MAX))
        .run()
        .await;
    let f = run.expect_failure(FailureClass::Trap);
    assert!(
        f.message
            .contains("runaway recursion in `misbehave::descend`"),
        "{}",
        f.message
    );
    assert_healthy(&host).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exit_is_a_trap() {
    let host = host().build().unwrap();
    let run = misbehave(&host)
        .call("demo:misbehave/api.exit")
        .arg(json!(3))
        .run()
        .await;
    let f = run.expect_failure(FailureClass::Trap);
    assert!(f.message.contains("called exit"), "{}", f.message);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_memory_bomb_is_resource_exhausted_naming_the_limit() {
    let host = host().memory(32 << 20).build().unwrap();
    let run = misbehave(&host)
        .call("demo:misbehave/api.allocate")
        .arg(json!(200))
        .run()
        .await;
    let f = run.expect_failure(FailureClass::ResourceExhausted);
    assert!(!f.retryable);
    assert!(
        f.message.contains("linear memory limit of 32 MiB exceeded"),
        "{}",
        f.message
    );
    assert_eq!(f.details.as_ref().unwrap()["limit"], "memory");
    assert_eq!(f.details.as_ref().unwrap()["value"], "32 MiB");

    // Within the limit, the same guest succeeds.
    let run = misbehave(&host)
        .call("demo:misbehave/api.allocate")
        .arg(json!(8))
        .run()
        .await;
    assert_eq!(run.expect_ok(), &json!(8));
    assert_healthy(&host).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn running_out_of_fuel_is_resource_exhausted() {
    let host = host().fuel(50_000_000).build().unwrap();
    let run = misbehave(&host).call("demo:misbehave/api.spin").run().await;
    let f = run.expect_failure(FailureClass::ResourceExhausted);
    assert!(f.message.contains("50000000 fuel"), "{}", f.message);
    assert_eq!(f.details.as_ref().unwrap()["limit"], "fuel");
    assert_healthy(&host).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_infinite_loop_times_out_retryable_and_the_host_stays_healthy() {
    let host = host().timeout(Duration::from_millis(300)).build().unwrap();
    let run = misbehave(&host).call("demo:misbehave/api.spin").run().await;
    let f = run.expect_failure(FailureClass::Timeout);
    assert!(f.retryable);
    assert!(f.message.contains("deadline of 300ms"), "{}", f.message);
    assert_healthy(&host).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_sleeping_on_the_wasi_clock_times_out_too() {
    let host = host().build().unwrap();
    let run = misbehave(&host)
        .call("demo:misbehave/api.sleep")
        .arg(json!(60_000))
        .deadline(Duration::from_millis(200))
        .run()
        .await;
    let f = run.expect_failure(FailureClass::Timeout);
    assert!(
        f.message.contains("deadline of 200ms"),
        "the engine deadline applies: {}",
        f.message
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cooperative_guest_stops_when_cancelled() {
    let host = host().build().unwrap();
    let progress = load(&host, "progress");
    let run = progress
        .call("demo:progress/api.count-to")
        .args([json!(1000), json!(5)])
        .cancel_at_heartbeat(3)
        .run()
        .await;
    let f = run.expect_failure(FailureClass::Cancelled);
    assert!(!f.retryable);
    assert!(f.message.contains("the guest stopped"), "{}", f.message);
    assert_eq!(run.heartbeats.len(), 3, "is-cancelled turned true at once");
    assert_eq!(f.details, Some(json!({"done": 3})));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_uncooperative_guest_is_interrupted_after_the_grace_period() {
    let host = host()
        .cancel_grace(Duration::from_millis(200))
        .build()
        .unwrap();
    let run = misbehave(&host)
        .call("demo:misbehave/api.spin")
        .cancel_after(Duration::from_millis(100))
        .run()
        .await;
    let f = run.expect_failure(FailureClass::Cancelled);
    assert!(
        f.message
            .contains("did not stop within the 200ms grace period"),
        "{}",
        f.message
    );
    assert_healthy(&host).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn payloads_that_do_not_fit_are_invalid_input_naming_the_parameter_and_path() {
    let host = host().build().unwrap();
    let echo = load(&host, "echo");
    let order = json!({"items": [
        {"sku": "a", "price": 1, "quantity": 1},
        {"sku": "b", "price": 2, "quantity": 1},
        {"sku": "c", "price": 3, "quantity": 1},
        {"sku": "d", "price": -1, "quantity": 1},
    ]});
    let run = echo.call("demo:echo/api.total").arg(order).run().await;
    let f = run.expect_failure(FailureClass::InvalidInput);
    assert!(!f.retryable);
    assert_eq!(
        f.message,
        "parameter `order`: $.items[3].price: expected u32, got -1"
    );

    let run = echo.call("demo:echo/api.nothing").arg(json!(1)).run().await;
    let f = run.expect_failure(FailureClass::InvalidInput);
    assert!(f.message.contains("takes 2 argument(s)"), "{}", f.message);
    assert!(
        f.message.contains("func(a: u32, b: string)"),
        "{}",
        f.message
    );
    assert!(f.message.contains("but got 1"), "{}", f.message);
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_input_is_invalid_input() {
    let host = host().max_input(1024).build().unwrap();
    let run = load(&host, "echo")
        .call("demo:echo/api.echo-string")
        .arg(json!("x".repeat(2000)))
        .run()
        .await;
    let f = run.expect_failure(FailureClass::InvalidInput);
    assert!(
        f.message.contains("over the limit of 1024 bytes"),
        "{}",
        f.message
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_output_and_bad_heartbeats_are_invalid_output() {
    let host = host().max_output(1000).build().unwrap();
    let m = misbehave(&host);
    let run = m
        .call("demo:misbehave/api.big-output")
        .arg(json!(5000))
        .run()
        .await;
    let f = run.expect_failure(FailureClass::InvalidOutput);
    assert!(!f.retryable);
    assert!(
        f.message
            .contains("the result is at least 5002 bytes, over the limit of 1000 bytes"),
        "{}",
        f.message
    );

    // The guest's failure counts its kind too: 600 bytes of kind, and
    // the message that repeats it, are over 1000 only together.
    let run = m
        .call("demo:misbehave/api.fail")
        .args([json!("K".repeat(600)), json!(false)])
        .run()
        .await;
    let f = run.expect_failure(FailureClass::InvalidOutput);
    assert!(
        f.message.contains("the guest's failure is"),
        "{}",
        f.message
    );

    let run = m.call("demo:misbehave/api.bad-heartbeat").run().await;
    let f = run.expect_failure(FailureClass::InvalidOutput);
    assert!(
        f.message.contains("heartbeat details are not valid JSON"),
        "{}",
        f.message
    );
    assert_healthy(&host).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_activity_type_is_retryable_and_lists_what_exists() {
    let host = host().build().unwrap();
    let run = load(&host, "greeter")
        .call("demo:greeter/api.shout")
        .run()
        .await;
    let f = run.expect_failure(FailureClass::UnknownActivity);
    assert!(f.retryable);
    assert!(
        f.message
            .contains("no activity type `demo:greeter/api.shout`"),
        "{}",
        f.message
    );
    assert!(
        f.message.contains("demo:greeter/api.greet-all"),
        "{}",
        f.message
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exhausted_instance_pool_is_a_retryable_host_failure() {
    // Two host slots on a pool of one instance: the second task is admitted
    // and finds no instance (as when a host's pool is smaller than its
    // slots), rather than waiting for a slot.
    let host = host().max_instances(1).max_concurrent(2).build().unwrap();
    let m = misbehave(&host);
    // (Five seconds: the second task must find it held on a loaded machine.)
    let mut sleep = m.call("demo:misbehave/api.sleep").arg(json!(5000));
    let holding = sleep.started();
    let sleeper = tokio::spawn(sleep.run());
    // The sleeper holds the only instance.
    holding.await.unwrap();
    let run = m.call("demo:misbehave/api.counter").run().await;
    let f = run.expect_failure(FailureClass::Host);
    assert!(f.retryable);
    assert!(f.message.contains("maximum concurrent"), "{}", f.message);
    sleeper.await.unwrap().expect_ok();
    // The slot is back.
    let run = m.call("demo:misbehave/api.counter").run().await;
    assert_eq!(run.expect_ok(), &json!(1));
}

#[tokio::test(flavor = "multi_thread")]
async fn retryable_defaults_are_tenant_policy() {
    let host = host()
        .timeout(Duration::from_millis(200))
        .retry(FailureClass::Timeout, false)
        .retry(FailureClass::Trap, true)
        .build()
        .unwrap();
    let m = misbehave(&host);
    assert!(
        !m.call("demo:misbehave/api.spin")
            .run()
            .await
            .expect_failure(FailureClass::Timeout)
            .retryable
    );
    assert!(
        m.call("demo:misbehave/api.wild-read")
            .run()
            .await
            .expect_failure(FailureClass::Trap)
            .retryable
    );
}
