//! The session loop's rules against a scripted engine (a unit-test fake
//! connector) and a tiny component written in WAT.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::sandbox::{FailureClass, Limits, SandboxConfig, Tenant};

const COMPONENT: &str = r#"(component
    (core module $m
        (func (export "answer") (result i32) i32.const 42)
        (func (export "spin") (loop $l br $l))
        (func (export "add") (param i32 i32 i32) (result i32)
            local.get 0 local.get 1 local.get 2 i32.mul i32.add))
    (core instance $i (instantiate $m))
    (func (export "add") (param "left-term" u32) (param "bonus" (option u32)) (result u32)
        (canon lift (core func $i "add")))
    (func (export "answer") (result u32) (canon lift (core func $i "answer")))
    (func (export "spin") (canon lift (core func $i "spin")))
)"#;

/// An engine that delivers what the test sends and records reports,
/// refusing the first `transport_failures` of them as a broken transport
/// would.
struct Scripted {
    inbound: tokio::sync::Mutex<mpsc::Receiver<Inbound>>,
    stopped: CancellationToken,
    reports: Mutex<Vec<(TaskKey, Report)>>,
    transport_failures: AtomicU32,
    /// Reports that panic (a connector's bug) before any is taken.
    panics: AtomicU32,
    attempts: AtomicU32,
    heartbeats: Mutex<Vec<(TaskKey, Option<Value>)>>,
}

impl Scripted {
    fn heartbeats_of(&self, key: &[u8]) -> Vec<Option<Value>> {
        let heartbeats = self.heartbeats.lock().unwrap();
        heartbeats
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, details)| details.clone())
            .collect()
    }
}

#[async_trait]
impl Connector for Scripted {
    async fn next(&self) -> Option<Inbound> {
        let mut inbound = self.inbound.lock().await;
        tokio::select! {
            biased;
            message = inbound.recv() => message,
            () = self.stopped.cancelled() => None,
        }
    }

    async fn report(&self, key: &TaskKey, report: Report) -> Result<(), ReportError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        if self
            .panics
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            panic!("the connector's bug");
        }
        if self
            .transport_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(ReportError {
                retryable: true,
                message: "connection reset".into(),
            });
        }
        self.reports.lock().unwrap().push((key.clone(), report));
        Ok(())
    }

    fn heartbeat(&self, key: &TaskKey, details: Option<&HeartbeatDetails>) {
        let details = details.map(|d| serde_json::from_str(d.json()).unwrap());
        let mut heartbeats = self.heartbeats.lock().unwrap();
        heartbeats.push((key.clone(), details));
    }

    fn stop_polling(&self) {
        self.stopped.cancel();
    }
}

struct Fixture {
    session: Arc<Session>,
    engine: Arc<Scripted>,
    send: mpsc::Sender<Inbound>,
    shutdown: CancellationToken,
}

fn fixture(transport_failures: u32) -> Fixture {
    fixture_with(transport_failures, Permits::new(8, []))
}

fn fixture_with(transport_failures: u32, permits: Permits) -> Fixture {
    fixture_of(transport_failures, permits, SandboxConfig::default(), None)
}

/// A fixture on a sandbox configured as `config` (its pool sized to the
/// host's slots), its tenant's fuel budget `fuel`.
fn fixture_of(
    transport_failures: u32,
    permits: Permits,
    config: SandboxConfig,
    fuel: Option<u64>,
) -> Fixture {
    // The pool is exactly the host's slots, as `corral serve` sizes it.
    let sandbox = Sandbox::new(SandboxConfig {
        max_instances: u32::try_from(permits.host_usage().limit).unwrap(),
        ..config
    })
    .unwrap();
    let bytes = wat::parse_str(COMPONENT).unwrap();
    let component = sandbox.load(&bytes).unwrap();
    let tenant = Tenant {
        name: "t".into(),
        limits: Limits {
            cancel_grace: Duration::from_millis(100),
            fuel,
            ..Limits::default()
        },
        ..Tenant::default()
    };
    let registry = Registry::default();
    registry
        .set_tenant(
            sandbox.prepare(tenant).unwrap(),
            &[component],
            &[("Answer".into(), "answer".into())],
        )
        .unwrap();
    let (send, receive) = mpsc::channel(8);
    Fixture {
        session: Session::new(sandbox, Arc::new(registry), Default::default(), permits),
        engine: Arc::new(Scripted {
            inbound: tokio::sync::Mutex::new(receive),
            stopped: CancellationToken::new(),
            reports: Mutex::new(Vec::new()),
            transport_failures: AtomicU32::new(transport_failures),
            panics: AtomicU32::new(0),
            attempts: AtomicU32::new(0),
            heartbeats: Mutex::new(Vec::new()),
        }),
        send,
        shutdown: CancellationToken::new(),
    }
}

fn start(key: &[u8], activity_type: &str) -> Inbound {
    Inbound::Start(Box::new(TaskStart {
        key: key.to_vec(),
        tenant: "t".into(),
        activity_type: activity_type.into(),
        args: Ok(Args::Positional(vec![])),
        info: TaskInfo {
            attempt: 1,
            ..TaskInfo::default()
        },
        deadline: None,
        heartbeat_every: Duration::from_secs(1),
        type_slot: None,
        observer: None,
    }))
}

impl Fixture {
    fn serve(&self, grace: Duration) -> tokio::task::JoinHandle<usize> {
        let (session, engine, shutdown) = (
            self.session.clone(),
            self.engine.clone(),
            self.shutdown.clone(),
        );
        tokio::spawn(async move { session.serve(engine, shutdown, grace).await })
    }

    /// The engine asks for `key` to be cancelled.
    async fn cancel(&self, key: &[u8]) {
        let cancel = Inbound::Cancel {
            key: key.to_vec(),
            reason: CancelReason::Requested,
        };
        self.send.send(cancel).await.unwrap();
    }

    /// Waits (at most five seconds) until `done` holds.
    async fn until(&self, what: &str, done: impl Fn() -> bool) {
        for _ in 0..500 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never: {what}");
    }

    async fn wait_for_reports(&self, n: usize) -> Vec<(TaskKey, Report)> {
        for _ in 0..500 {
            let reports = self.engine.reports.lock().unwrap().clone();
            if reports.len() >= n {
                return reports;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("fewer than {n} reports arrived");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_report_the_transport_drops_is_retried_until_accepted() {
    let f = fixture(2);
    let serving = f.serve(Duration::from_secs(1));
    f.send.send(start(b"a", "Answer")).await.unwrap();
    let reports = f.wait_for_reports(1).await;
    assert_eq!(reports, vec![(b"a".to_vec(), Report::Completed(json!(42)))]);
    assert_eq!(
        f.engine.attempts.load(Ordering::SeqCst),
        3,
        "two failures, then accepted"
    );
    f.shutdown.cancel();
    serving.await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_report_whose_connector_panics_is_retried_not_lost() {
    let f = fixture(0);
    f.engine.panics.store(2, Ordering::SeqCst);
    let serving = f.serve(Duration::from_secs(1));
    f.send.send(start(b"a", "Answer")).await.unwrap();
    let reports = f.wait_for_reports(1).await;
    assert_eq!(reports, vec![(b"a".to_vec(), Report::Completed(json!(42)))]);
    assert_eq!(
        f.engine.attempts.load(Ordering::SeqCst),
        3,
        "two panics, then accepted"
    );
    f.shutdown.cancel();
    serving.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_stopping_session_waits_for_a_report_the_engine_never_takes_only_so_long() {
    // Every report refused by the transport, and no deadline to give up at.
    let f = fixture(u32::MAX);
    let grace = Duration::from_secs(1);
    let serving = f.serve(grace);
    f.send.send(start(b"a", "NoSuchType")).await.unwrap();
    f.until("a report was tried", || {
        f.engine.attempts.load(Ordering::SeqCst) > 0
    })
    .await;
    let stopping = tokio::time::Instant::now();
    f.shutdown.cancel();
    // (Paused time: the waits pass as soon as nothing else can run.)
    let stopped = tokio::time::timeout(2 * FINAL_WAIT, serving).await;
    assert_eq!(stopped.unwrap().unwrap(), 1, "one task left unreported");
    let took = stopping.elapsed();
    assert!(took >= grace + FINAL_WAIT, "{took:?}");
    assert!(
        f.engine.attempts.load(Ordering::SeqCst) > 3,
        "it tried to report meanwhile"
    );
    assert!(f.engine.reports.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_types_and_bad_payloads_are_reported_not_dropped() {
    let f = fixture(0);
    let serving = f.serve(Duration::from_secs(1));
    f.send.send(start(b"u", "nope")).await.unwrap();
    let Inbound::Start(mut bad) = start(b"p", "answer") else {
        unreachable!()
    };
    let not_json = serde_json::from_str::<Value>("{").unwrap_err();
    let said = not_json.to_string();
    bad.args = Err(InputError::new(not_json));
    f.send.send(Inbound::Start(bad)).await.unwrap();
    let reports = f.wait_for_reports(2).await;
    for (key, report) in reports {
        let Report::Failed(failure) = report else {
            panic!("{report:?}")
        };
        let expected = if key == b"u" {
            FailureClass::UnknownActivity
        } else {
            FailureClass::InvalidInput
        };
        assert_eq!(failure.class, expected, "{failure}");
        if key == b"p" {
            // The connector's own error reaches the engine word for word.
            assert_eq!(failure.message, said, "{failure}");
        }
    }
    assert!(f.session.in_flight_count() == 0);
    f.shutdown.cancel();
    serving.await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn named_arguments_are_matched_to_parameters_by_name() {
    let f = fixture(0);
    let serving = f.serve(Duration::from_secs(1));
    let cases = [
        (json!({"left_term": 40, "bonus": 2}), Ok(json!(42))),
        (json!({"leftTerm": 40}), Ok(json!(40))),
        (
            json!({"bonus": 2}),
            Err("missing argument `left-term` (expected `left-term`, `bonus`)"),
        ),
        (json!({"left-term": 1, "x": 2}), Err("unknown argument `x`")),
    ];
    for (i, (args, _)) in cases.iter().enumerate() {
        let Inbound::Start(mut task) = start(&[i as u8], "add") else {
            unreachable!()
        };
        let Value::Object(named) = args.clone() else {
            unreachable!()
        };
        task.args = Ok(Args::Named(named));
        f.send.send(Inbound::Start(task)).await.unwrap();
    }
    let reports = f.wait_for_reports(cases.len()).await;
    for (key, report) in reports {
        match (&cases[key[0] as usize].1, report) {
            (Ok(expected), Report::Completed(value)) => assert_eq!(&value, expected),
            (Err(expected), Report::Failed(failure)) => {
                assert_eq!(failure.class, FailureClass::InvalidInput);
                assert!(failure.message.starts_with(expected), "{failure}");
            }
            (expected, report) => panic!("{expected:?} but {report:?}"),
        }
    }
    f.shutdown.cancel();
    serving.await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_requested_cancel_interrupts_a_stuck_guest_and_reports_cancelled() {
    let f = fixture(0);
    let serving = f.serve(Duration::from_secs(1));
    f.send.send(start(b"s", "spin")).await.unwrap();
    f.until("the guest runs", || f.session.in_flight_count() == 1)
        .await;
    f.cancel(b"s").await;
    let reports = f.wait_for_reports(1).await;
    assert!(
        matches!(&reports[0].1, Report::Cancelled(f) if f.class == FailureClass::Cancelled),
        "{reports:?}"
    );
    f.shutdown.cancel();
    serving.await.unwrap();
}

// Two guests spin: two more workers keep the timers running.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_in_flight_are_heartbeated_at_their_pace_until_they_end() {
    let f = fixture(0);
    let serving = f.serve(Duration::from_secs(1));
    let Inbound::Start(mut spin) = start(b"s", "spin") else {
        unreachable!()
    };
    spin.heartbeat_every = Duration::from_millis(50);
    spin.info.last_heartbeat = Some(HeartbeatDetails::of(&json!({"step": 3})));
    f.send.send(Inbound::Start(spin)).await.unwrap();
    let Inbound::Start(mut slow) = start(b"w", "spin") else {
        unreachable!()
    };
    slow.heartbeat_every = Duration::from_secs(60);
    f.send.send(Inbound::Start(slow)).await.unwrap();
    let Inbound::Start(mut quick) = start(b"a", "answer") else {
        unreachable!()
    };
    quick.heartbeat_every = Duration::from_millis(50);
    f.send.send(Inbound::Start(quick)).await.unwrap();
    f.wait_for_reports(1).await;
    // `a` is heartbeated while it waits for a slot (both are spun on), as
    // long as a loaded machine makes that: counted from its report on.
    let quick_beats = f.engine.heartbeats_of(b"a").len();
    let s_beats = f.engine.heartbeats_of(b"s").len();
    f.until("three heartbeats of `s` since", || {
        f.engine.heartbeats_of(b"s").len() >= s_beats + 3
    })
    .await;

    let beats = f.engine.heartbeats_of(b"s");
    assert!(beats.len() >= 3, "a running task is heartbeated: {beats:?}");
    assert!(
        beats.iter().all(|d| d == &Some(json!({"step": 3}))),
        "with the previous attempt's details: {beats:?}"
    );
    assert!(
        f.engine.heartbeats_of(b"w").is_empty(),
        "each at its own pace"
    );
    // (One may have been under way as it was reported.)
    assert!(
        f.engine.heartbeats_of(b"a").len() <= quick_beats + 1,
        "a finished task is not heartbeated"
    );

    for key in [b"s", b"w"] {
        f.cancel(key).await;
    }
    f.wait_for_reports(3).await;
    let after = f.engine.heartbeats_of(b"s").len();
    // A task still running at the same pace: once it has been heartbeated
    // three times, `s` would have been too, were it still pumped.
    let Inbound::Start(mut witness) = start(b"x", "spin") else {
        unreachable!()
    };
    witness.heartbeat_every = Duration::from_millis(50);
    f.send.send(Inbound::Start(witness)).await.unwrap();
    f.until("three heartbeats of the witness", || {
        f.engine.heartbeats_of(b"x").len() >= 3
    })
    .await;
    f.cancel(b"x").await;
    f.wait_for_reports(4).await;
    assert_eq!(
        f.engine.heartbeats_of(b"s").len(),
        after,
        "no heartbeats once reported"
    );
    f.shutdown.cancel();
    serving.await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_type_at_its_own_limit_waits_for_its_sibling() {
    let permits = Permits::new(8, []).with_type_limits("t", [("spin".to_owned(), 1)]);
    let f = fixture_with(0, permits.clone());
    let serving = f.serve(Duration::from_secs(1));
    for key in [b"a", b"b"] {
        let Inbound::Start(mut spin) = start(key, "spin") else {
            unreachable!()
        };
        spin.heartbeat_every = Duration::from_millis(50);
        f.send.send(Inbound::Start(spin)).await.unwrap();
    }
    f.send.send(start(b"c", "Answer")).await.unwrap();
    // The other type is not held back.
    let reports = f.wait_for_reports(1).await;
    assert_eq!(reports[0], (b"c".to_vec(), Report::Completed(json!(42))));
    // Both in flight and heartbeated a few times: by then the second would
    // hold a host slot too, were it not waiting for the first.
    f.until("both spins heartbeated", || {
        [b"a", b"b"]
            .iter()
            .all(|key| f.engine.heartbeats_of(*key).len() >= 3)
    })
    .await;
    assert_eq!(f.session.in_flight_count(), 2);
    assert_eq!(permits.host_usage().in_use, 1, "one spin runs, one waits");
    for key in [b"a", b"b"] {
        f.cancel(key).await;
    }
    let reports = f.wait_for_reports(3).await;
    assert!(
        reports[1..]
            .iter()
            .all(|(_, r)| matches!(r, Report::Cancelled(_))),
        "{reports:?}"
    );
    f.shutdown.cancel();
    serving.await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_of_exactly_the_host_slots_runs_every_task_that_waited_for_one() {
    let permits = Permits::new(2, []);
    let f = fixture_with(0, permits.clone());
    let serving = f.serve(Duration::from_secs(1));
    for key in [b"s1", b"s2"] {
        f.send.send(start(key, "spin")).await.unwrap();
    }
    f.until("both spins hold a host slot", || {
        permits.host_usage().in_use == 2
    })
    .await;
    // Queued behind the spins; each instantiates in a slot a cancelled spin
    // has just given back, so none may find the pool still full.
    let answers: Vec<Vec<u8>> = (0..6).map(|i| format!("a{i}").into_bytes()).collect();
    for key in &answers {
        f.send.send(start(key, "answer")).await.unwrap();
    }
    for key in [b"s1", b"s2"] {
        f.cancel(key).await;
    }
    let reports = f.wait_for_reports(8).await;
    for key in &answers {
        let report = reports.iter().find(|(k, _)| k == key).map(|(_, r)| r);
        assert_eq!(report, Some(&Report::Completed(json!(42))), "{reports:?}");
    }
    f.shutdown.cancel();
    serving.await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_waits_for_the_grace_period_then_interrupts_and_reports_everything() {
    let f = fixture(0);
    let serving = f.serve(Duration::from_millis(300));
    f.send.send(start(b"s", "spin")).await.unwrap();
    f.send.send(start(b"a", "answer")).await.unwrap();
    // Both accepted: `a` reported, `s` spinning.
    f.wait_for_reports(1).await;
    f.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("serve returns after the grace period")
        .unwrap();
    let reports = f.engine.reports.lock().unwrap().clone();
    assert_eq!(reports.len(), 2, "{reports:?}");
    let spin = reports
        .iter()
        .find(|(k, _)| k == b"s")
        .map(|(_, r)| r.clone());
    let Some(Report::Failed(failure)) = spin else {
        panic!("{spin:?}")
    };
    assert!(
        failure.retryable,
        "an interrupted task runs again elsewhere"
    );
    assert!(
        failure.message.contains("interrupted by the worker"),
        "{failure}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_waiting_for_a_slot_ends_there_at_its_deadline_or_its_cancel() {
    // One slot, held by a spinning guest: the tasks behind it wait.
    let f = fixture_with(0, Permits::new(1, []));
    let serving = f.serve(Duration::from_secs(1));
    f.send.send(start(b"s", "spin")).await.unwrap();
    f.until("the spinner runs", || f.session.in_flight_count() == 1)
        .await;
    let Inbound::Start(mut late) = start(b"d", "answer") else {
        unreachable!()
    };
    late.deadline = Some(Duration::from_millis(300));
    f.send.send(Inbound::Start(late)).await.unwrap();
    f.send.send(start(b"c", "answer")).await.unwrap();
    f.until("both wait", || f.session.in_flight_count() == 3)
        .await;
    f.cancel(b"c").await;
    // Reported while the spinner still holds the slot: neither ran.
    let reports = f.wait_for_reports(2).await;
    assert_eq!(f.session.in_flight_count(), 1, "{reports:?}");
    for (key, report) in &reports {
        match (key.as_slice(), report) {
            (b"d", Report::Failed(failure)) => {
                assert_eq!(failure.class, FailureClass::Timeout, "{failure}");
                assert!(failure.message.contains("never ran"), "{failure}");
            }
            (b"c", Report::Cancelled(failure)) => {
                assert_eq!(failure.class, FailureClass::Cancelled, "{failure}");
                assert!(failure.message.contains("never ran"), "{failure}");
            }
            _ => panic!("{reports:?}"),
        }
    }
    f.cancel(b"s").await;
    f.wait_for_reports(3).await;
    f.shutdown.cancel();
    serving.await.unwrap();
}

/// An observer with a bug: it panics once the task's instance exists.
struct Panicking;

impl TaskObserver for Panicking {
    fn instantiated(&self, _took: Duration) {
        panic!("a broken observer");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_whose_run_panics_is_reported_and_gives_its_slot_back() {
    // One slot: the next task runs only if the panicking one gave it back.
    let f = fixture_with(0, Permits::new(1, []));
    let serving = f.serve(Duration::from_secs(1));
    let Inbound::Start(mut broken) = start(b"p", "answer") else {
        unreachable!()
    };
    broken.observer = Some(Arc::new(Panicking));
    f.send.send(Inbound::Start(broken)).await.unwrap();
    f.send.send(start(b"a", "answer")).await.unwrap();
    let reports = f.wait_for_reports(2).await;
    for (key, report) in &reports {
        match (key.as_slice(), report) {
            (b"p", Report::Failed(failure)) => {
                assert_eq!(failure.class, FailureClass::Host, "{failure}");
                assert!(failure.retryable, "{failure}");
                assert!(failure.message.contains("a broken observer"), "{failure}");
            }
            (b"a", Report::Completed(value)) => assert_eq!(value, &json!(42)),
            _ => panic!("{reports:?}"),
        }
    }
    assert_eq!(f.session.in_flight_count(), 0);
    f.shutdown.cancel();
    serving.await.unwrap();
}

/// Counts the tasks whose instance exists (about to call the guest).
struct Instantiated(Arc<AtomicU32>);

impl TaskObserver for Instantiated {
    fn instantiated(&self, _took: Duration) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_that_yields_by_no_fuel_interval_still_gives_its_core_up_by_the_clock() {
    // No fuel interval ever ends here (as memory-bound code's takes long
    // to), so only the clock can end a slice; the spinners' fuel budget
    // ends them in a second or so.
    let config = SandboxConfig {
        yield_every_fuel: u64::MAX / 2,
        ..SandboxConfig::default()
    };
    let f = fixture_of(0, Permits::new(8, []), config, Some(1_000_000_000));
    let serving = f.serve(Duration::from_secs(1));
    // As many spinners as the scheduler has cores, each on one.
    let cores = crate::session::cpu::host_slots();
    let instantiated = Arc::new(AtomicU32::new(0));
    for n in 0..cores {
        let Inbound::Start(mut spinner) = start(format!("s{n}").as_bytes(), "spin") else {
            unreachable!()
        };
        spinner.observer = Some(Arc::new(Instantiated(instantiated.clone())));
        f.send.send(Inbound::Start(spinner)).await.unwrap();
    }
    f.until("every spinner spins", || {
        instantiated.load(Ordering::SeqCst) as usize == cores
    })
    .await;
    f.send.send(start(b"a", "answer")).await.unwrap();
    // The answer is given a core at the end of a spinner's slice, within a
    // tick: before any spinner has used its budget up (without the ticks,
    // after one had).
    let reports = f.wait_for_reports(cores + 1).await;
    assert_eq!(reports[0].0, b"a", "{reports:?}");
    assert!(
        matches!(&reports[0].1, Report::Completed(v) if v == &json!(42)),
        "{reports:?}"
    );
    for (_, report) in &reports[1..] {
        assert!(
            matches!(report, Report::Failed(f) if f.class == FailureClass::ResourceExhausted),
            "{reports:?}"
        );
    }
    f.shutdown.cancel();
    serving.await.unwrap();
}

/// A guest stuck where its own deadline cannot stop it (here: inside the
/// host's call that tells of its instance, which never returns; on a
/// machine whose cores are saturated, a guest thread that is not
/// scheduled) is reported timed out by the host itself, within the
/// backstop's margin, while it still holds its slot; its late ending is
/// not reported again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_guest_stuck_past_its_deadline_is_reported_timed_out_by_the_host() {
    struct Stuck(Mutex<Option<std::sync::mpsc::Receiver<()>>>);
    impl TaskObserver for Stuck {
        fn instantiated(&self, _: Duration) {
            let waiting = self.0.lock().unwrap().take();
            if let Some(release) = waiting {
                // (Bounded, so that a failing test ends.)
                let _ = release.recv_timeout(Duration::from_secs(60));
            }
        }
    }
    let (release, stuck) = std::sync::mpsc::channel();
    let f = fixture(0);
    let serving = f.serve(Duration::from_secs(1));
    let Inbound::Start(mut task) = start(b"a", "answer") else {
        unreachable!()
    };
    task.deadline = Some(Duration::from_millis(200));
    task.observer = Some(Arc::new(Stuck(Mutex::new(Some(stuck)))));
    let sent = std::time::Instant::now();
    f.send.send(Inbound::Start(task)).await.unwrap();
    let mut reports = Vec::new();
    for _ in 0..300 {
        reports = f.engine.reports.lock().unwrap().clone();
        if !reports.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = sent.elapsed();
    let [(key, Report::Failed(failure))] = reports.as_slice() else {
        panic!("{reports:?}")
    };
    assert_eq!(key, b"a");
    assert_eq!(failure.class, FailureClass::Timeout);
    assert!(
        failure.message.contains("the host reported the timeout"),
        "{}",
        failure.message
    );
    // Within the backstop's margin and a check's period of the deadline.
    assert!(took < Duration::from_secs(12), "{took:?}");
    // The stuck guest still holds its slot.
    assert_eq!(f.session.permits.host_usage().in_use, 1);
    release.send(()).unwrap();
    f.until("the slot is given back", || {
        f.session.permits.host_usage().in_use == 0
    })
    .await;
    f.until("the task has left", || f.session.in_flight_count() == 0)
        .await;
    assert_eq!(f.engine.reports.lock().unwrap().len(), 1, "reported once");
    f.shutdown.cancel();
    serving.await.unwrap();
}
