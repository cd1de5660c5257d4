//! The attack suite, in the sandbox: what a hostile tenant's guest does to
//! its host. Each test mounts one attack with a real guest
//! (`tests/guests/hostile`, or a hand-written component), asserts the bound
//! that contains it (time, bytes, lines, handles), the class it ends in, and
//! that the host then serves the next task normally.

mod common;

use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use corral_core::sandbox::{DirMode, FailureClass, LoadError};
use corral_core::testing::{TestComponent, TestHost};
use serde_json::json;

use common::{host, hostile_guest, load, open_fds};

/// How late a deadline or a cancel may be met on a loaded 2-core machine.
/// The bound asserted is "within seconds": without the watchdog these
/// guests ran on for more than ten minutes.
const SLACK: Duration = Duration::from_secs(3);

/// How a test's runtime runs its tasks.
enum Runtime {
    /// One thread for the guest and everything else.
    OneThread,
    Threads,
}

/// Runs `test` on a runtime of its own thread, failing if it has not ended
/// within a minute: an attack that escapes its bound must fail its test,
/// not hang the suite.
fn within(runtime: Runtime, test: impl Future<Output = ()> + Send + 'static) {
    // Build the guests first: the clock is for the attack.
    hostile_guest("hostile");
    let limit = Duration::from_secs(60);
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut builder = match runtime {
            Runtime::OneThread => tokio::runtime::Builder::new_current_thread(),
            Runtime::Threads => tokio::runtime::Builder::new_multi_thread(),
        };
        let runtime = builder.enable_all().build().unwrap();
        runtime.block_on(test);
        let _ = done.send(());
    });
    match ended.recv_timeout(limit) {
        Ok(()) => {}
        Err(RecvTimeoutError::Timeout) => panic!("the attack was not contained within {limit:?}"),
        Err(RecvTimeoutError::Disconnected) => panic!("the test failed (above)"),
    }
}

fn hostile(host: &TestHost) -> TestComponent {
    match host.load_file(hostile_guest("hostile")) {
        Ok(component) => component,
        Err(e) => panic!("loading the hostile guest: {e}"),
    }
}

/// The greeter still works: nothing the attack did poisoned the host.
async fn assert_healthy(host: &TestHost) {
    let run = load(host, "greeter")
        .call("demo:greeter/api.greet")
        .args([
            json!({"name": "Ada", "language": "english"}),
            json!("casual"),
        ])
        .run()
        .await;
    assert_eq!(run.expect_ok()["message"], "Hi, Ada!");
}

fn component(wat: &str) -> Vec<u8> {
    match wat::parse_str(wat) {
        Ok(bytes) => bytes,
        Err(e) => panic!("test component: {e}"),
    }
}

#[test]
fn a_guest_living_in_host_calls_meets_its_deadline() {
    within(Runtime::Threads, async {
        let timeout = Duration::from_secs(1);
        let host = host().timeout(timeout).build().unwrap();
        let run = hostile(&host)
            .call("demo:hostile/api.random-forever")
            .arg(json!(1 << 20))
            .run()
            .await;
        eprintln!("a deadline of {timeout:?} met after {:?}", run.elapsed);
        let failure = run.expect_failure(FailureClass::Timeout);
        assert!(failure.retryable, "{failure}");
        assert!(failure.message.contains("deadline of 1s"), "{failure}");
        assert!(
            run.elapsed < timeout + SLACK,
            "the deadline of {timeout:?} was met only after {:?}",
            run.elapsed
        );
        assert_healthy(&host).await;
    });
}

#[test]
fn a_guest_logging_forever_meets_its_deadline_within_its_output_budget() {
    within(Runtime::Threads, async {
        let timeout = Duration::from_secs(1);
        let host = host().timeout(timeout).max_stdio(64 << 10).build().unwrap();
        // Each call hands the host 1 MiB to lift and drop.
        let run = hostile(&host)
            .call("demo:hostile/api.log-forever")
            .arg(json!(1 << 20))
            .run()
            .await;
        run.expect_failure(FailureClass::Timeout);
        assert!(run.elapsed < timeout + SLACK, "{:?}", run.elapsed);
        assert!(run.logs.is_empty(), "{} log lines", run.logs.len());
        assert!(run.dropped_output > 0);
        assert_healthy(&host).await;
    });
}

#[test]
fn empty_log_lines_cost_their_overhead_in_the_output_budget() {
    within(Runtime::Threads, async {
        let host = host().max_stdio(64 << 10).build().unwrap();
        let run = hostile(&host)
            .call("demo:hostile/api.empty-logs")
            .arg(json!(100_000))
            .run()
            .await;
        run.expect_ok();
        assert!(run.logs.len() <= 1024, "{} log lines", run.logs.len());
        assert_healthy(&host).await;
    });
}

#[test]
fn a_guest_living_in_host_calls_is_stopped_when_a_cancels_grace_runs_out() {
    within(Runtime::Threads, async {
        let grace = Duration::from_millis(500);
        let host = host().cancel_grace(grace).build().unwrap();
        let run = hostile(&host)
            .call("demo:hostile/api.random-forever")
            .arg(json!(1 << 20))
            .cancel_after(Duration::from_millis(100))
            .run()
            .await;
        eprintln!(
            "cancelled at 100 ms with a grace of {grace:?}: stopped after {:?}",
            run.elapsed
        );
        let failure = run.expect_failure(FailureClass::Cancelled);
        assert!(failure.message.contains("grace period"), "{failure}");
        assert!(run.elapsed < grace + SLACK, "{:?}", run.elapsed);
        assert_healthy(&host).await;
    });
}

/// One runtime thread, shared by the guest and a neighbour: the neighbour
/// (standing for polling, heartbeats, the admin API) gets the thread while
/// the guest still runs. The guest's fuel budget is one yield interval, so
/// fuel alone never makes it yield: without the watchdog it would run to its
/// fuel's end before the neighbour ran once.
#[test]
fn a_guest_living_in_host_calls_yields_to_its_neighbours() {
    within(Runtime::OneThread, async {
        let host = host().fuel(10_000_000).build().unwrap();
        let guest = hostile(&host);
        let run = guest
            .call("demo:hostile/api.random-forever")
            .arg(json!(4096))
            .run();
        tokio::pin!(run);
        let neighbour = async {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::select! {
            biased;
            () = neighbour => {}
            run = &mut run => panic!(
                "the guest held the thread to its end ({:?}) before its neighbour ran",
                run.outcome
            ),
        }
        let run = run.await;
        let failure = run.failure().expect("random-forever never returns");
        assert_eq!(failure.class, FailureClass::ResourceExhausted, "{failure}");
    });
}

#[test]
fn one_host_call_cannot_make_the_host_build_unbounded_random_bytes() {
    within(Runtime::Threads, async {
        let host = host().build().unwrap();
        let guest = hostile(&host);
        let run = guest
            .call("demo:hostile/api.random-once")
            .arg(json!(64 << 10))
            .run()
            .await;
        assert_eq!(run.expect_ok(), &json!(64 << 10));
        let run = guest
            .call("demo:hostile/api.random-once")
            .arg(json!(256u64 << 20))
            .run()
            .await;
        let failure = run.expect_failure(FailureClass::Trap);
        assert!(
            failure.message.contains("exceeds limit 1048576"),
            "{failure}"
        );
        assert_healthy(&host).await;
    });
}

/// Each host function a guest can call against its contract, the words the
/// host refuses it with.
const MISUSES: [(&str, &str); 6] = [
    ("random", "exceeds limit 1048576"),
    ("insecure-random", "exceeds limit 1048576"),
    ("poll-empty", "empty poll list"),
    ("bad-handle", "unknown handle index"),
    ("write-over-permit", "write exceeded budget"),
    ("blocking-write-over-4096", "4096"),
];

#[test]
fn a_guest_that_misuses_a_host_function_fails_as_its_own_trap_named_or_stripped() {
    within(Runtime::Threads, async {
        let dir = tempfile::tempdir().unwrap();
        let host = host()
            .dir(dir.path(), "/d", DirMode::ReadWrite)
            .build()
            .unwrap();
        for guest in ["hostile", "hostile-stripped"] {
            let component = host.load_file(hostile_guest(guest)).unwrap();
            for (how, said) in MISUSES {
                let run = component
                    .call("demo:hostile/api.misuse")
                    .args([json!(how), json!("/d")])
                    .run()
                    .await;
                // A Host failure would be retried, and blame the host.
                let failure = run.expect_failure(FailureClass::Trap);
                assert!(!failure.retryable, "{guest} {how}: {failure}");
                assert!(
                    failure.message.contains("called the host incorrectly")
                        && failure.message.contains(said),
                    "{guest} {how}: {failure}"
                );
                // The host's words, not wasmtime's backtrace of guest-chosen
                // names.
                assert!(
                    !failure.message.contains("wasm backtrace"),
                    "{guest} {how}: {failure}"
                );
            }
        }
        assert_healthy(&host).await;
    });
}

#[test]
fn empty_lines_cost_their_overhead_in_the_output_budget() {
    within(Runtime::Threads, async {
        let budget = 64 << 10;
        let host = host().max_stdio(budget).build().unwrap();
        let lines: u64 = 4 << 20;
        let run = hostile(&host)
            .call("demo:hostile/api.blank-lines")
            .arg(json!(lines))
            .run()
            .await;
        run.expect_ok();
        // Each line costs 64 bytes besides its own: at most budget / 64 lines.
        assert!(
            run.output.len() <= budget / 64,
            "{} lines",
            run.output.len()
        );
        assert!(
            run.dropped_output >= lines - (budget / 64) as u64,
            "{} bytes dropped",
            run.dropped_output
        );
        assert_healthy(&host).await;
    });
}

#[test]
fn a_result_too_large_to_lift_is_invalid_output_not_a_host_failure() {
    within(Runtime::Threads, async {
        let host = host().build().unwrap();
        let guest = hostile(&host);
        // 5M elements: more than the output limit lets the host lift (one
        // lifted value per byte of the limit).
        let run = guest
            .call("demo:hostile/api.big-list")
            .arg(json!(5_000_000))
            .run()
            .await;
        let failure = run.expect_failure(FailureClass::InvalidOutput);
        assert!(!failure.retryable, "{failure}");
        assert!(
            failure.message.contains("output limit of 4 MiB"),
            "{failure}"
        );
        // 1M elements lift, but cannot fit 4 MiB of JSON: refused before the
        // JSON is built.
        let run = guest
            .call("demo:hostile/api.big-list")
            .arg(json!(1_000_000))
            .run()
            .await;
        let failure = run.expect_failure(FailureClass::InvalidOutput);
        assert!(failure.message.contains("at least"), "{failure}");
        // A list that fits is returned whole.
        let run = guest
            .call("demo:hostile/api.big-list")
            .arg(json!(1000))
            .run()
            .await;
        assert_eq!(run.expect_ok().as_array().map(Vec::len), Some(1000));
        assert_healthy(&host).await;
    });
}

#[test]
fn handles_are_capped_per_task_and_released_with_it() {
    within(Runtime::Threads, async {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        let host = host()
            .dir(dir.path(), "/data", DirMode::ReadOnly)
            .build()
            .unwrap();
        let before = open_fds("self");
        let run = hostile(&host)
            .call("demo:hostile/api.hold-files")
            .args([json!("/data/f"), json!(5000)])
            .run()
            .await;
        let failure = run.expect_failure(FailureClass::ResourceExhausted);
        assert!(
            failure.message.contains("limit of 1024 handles"),
            "{failure}"
        );
        assert_eq!(failure.details.as_ref().unwrap()["limit"], "max_handles");
        let after = open_fds("self");
        assert!(
            after < before + 64,
            "{before} descriptors before the task, {after} after"
        );
        assert_healthy(&host).await;
    });
}

#[test]
fn a_component_the_pool_cannot_hold_is_refused_at_load_with_the_numbers() {
    within(Runtime::Threads, async {
        let host = host().build().unwrap();
        let instances = "(core instance (instantiate $m))\n".repeat(200);
        let bytes = component(&format!(
            r#"(component
                 (core module $m (func (export "f")))
                 {instances}
                 (core instance $i (instantiate $m))
                 (func (export "run") (canon lift (core func $i "f"))))"#
        ));
        let Err(error) = host.load_bytes(&bytes) else {
            panic!("a component of 201 core instances loaded");
        };
        assert!(matches!(error, LoadError::Invalid(_)), "{error}");
        let message = error.to_string();
        assert!(message.contains("201 core module instances"), "{message}");
        assert!(message.contains("maximum of 32"), "{message}");
        assert_healthy(&host).await;
    });
}

/// The pool's other per-component bounds: 2 memories and 4 tables in all
/// of a component's instances. A component over either is refused when it
/// loads, naming the count and the bound, and the host serves on.
#[test]
fn a_component_over_the_pools_memories_or_tables_is_refused_at_load_with_the_numbers() {
    within(Runtime::Threads, async {
        let host = host().build().unwrap();
        for (what, module, count, bound) in [
            ("memories", "(memory 1)", 3, 2),
            ("tables", "(table 1 funcref)", 5, 4),
        ] {
            let instances = "(core instance (instantiate $m))\n".repeat(count - 1);
            let bytes = component(&format!(
                r#"(component
                     (core module $m {module} (func (export "f")))
                     (core instance $i (instantiate $m))
                     {instances}
                     (func (export "run") (canon lift (core func $i "f"))))"#
            ));
            let Err(error) = host.load_bytes(&bytes) else {
                panic!("a component of {count} {what} loaded");
            };
            assert!(matches!(error, LoadError::Invalid(_)), "{error}");
            let message = error.to_string();
            assert!(message.contains(&count.to_string()), "{what}: {message}");
            assert!(
                message.contains(&format!("maximum of {bound}")),
                "{what}: {message}"
            );
        }
        assert_healthy(&host).await;
    });
}

#[test]
fn the_memory_limit_covers_all_of_an_instances_memories() {
    within(Runtime::Threads, async {
        let host = host().memory(64 << 20).build().unwrap();
        // Each memory is 40 MiB (640 pages): one fits the limit, two do not.
        let with = |memories: usize| {
            let instances = "(core instance (instantiate $m))\n".repeat(memories - 1);
            component(&format!(
                r#"(component
                     (core module $m (memory 640) (func (export "f")))
                     (core instance $i (instantiate $m))
                     {instances}
                     (func (export "run") (canon lift (core func $i "f"))))"#
            ))
        };
        let one = host.load_bytes(&with(1)).unwrap();
        one.call("run").run().await.expect_ok();
        let two = host.load_bytes(&with(2)).unwrap();
        let run = two.call("run").run().await;
        let failure = run.expect_failure(FailureClass::ResourceExhausted);
        assert!(
            failure.message.contains("64 MiB exceeded")
                && failure.message.contains("80 MiB in all"),
            "{failure}"
        );
        assert_healthy(&host).await;
    });
}

#[test]
fn guest_chosen_names_are_cut_short_in_failure_messages() {
    within(Runtime::Threads, async {
        let host = host().build().unwrap();
        let name = "a".repeat(10_000);
        let guest = host
            .load_bytes(&component(&format!(
                r#"(component
                     (core module $m (func (export "f")))
                     (core instance $i (instantiate $m))
                     (func (export "{name}") (canon lift (core func $i "f"))))"#
            )))
            .unwrap();
        let run = guest.call("missing").run().await;
        let failure = run.expect_failure(FailureClass::UnknownActivity);
        assert!(
            failure.message.len() < 1000,
            "{} bytes",
            failure.message.len()
        );
        assert!(failure.message.contains("aaaa…"), "{failure}");
    });
}

/// A guest whose core function hands back a result the component model
/// cannot read: its return area at 8 holds `bytes` (a string's pointer and
/// length, or a variant's discriminant), read as `result`.
fn malformed_result(result: &str, bytes: &str) -> Vec<u8> {
    component(&format!(
        r#"(component
             (core module $m
               (memory (export "mem") 1)
               (data (i32.const 8) "{bytes}")
               (func (export "f") (result i32) i32.const 8))
             (core instance $i (instantiate $m))
             (func (export "run") (result {result})
               (canon lift (core func $i "f") (memory (core memory $i "mem")))))"#
    ))
}

#[test]
fn a_result_the_host_cannot_read_is_the_guests_invalid_output_not_a_host_fault() {
    within(Runtime::Threads, async {
        let host = host().build().unwrap();
        let cases = [
            // 100 bytes at 0xffffff00: past the guest's one page.
            ("string", r"\00\ff\ff\ff\64\00\00\00", "out of bounds"),
            // An option's discriminant is 0 or 1.
            ("(option u32)", r"\07\00\00\00\00\00\00\00", "discriminant"),
        ];
        for (result, bytes, said) in cases {
            let guest = host.load_bytes(&malformed_result(result, bytes)).unwrap();
            let run = guest.call("run").run().await;
            let failure = run.expect_failure(FailureClass::InvalidOutput);
            assert!(!failure.retryable, "{failure}");
            assert!(
                failure.message.contains("cannot read") && failure.message.contains(said),
                "{failure}"
            );
        }
        assert_healthy(&host).await;
    });
}
