//! Where a task runs: a guest thread, or the caller's for its first
//! slice (with a slot free, or beyond the slots when its turn comes next),
//! and what a panic on either leaves.

use super::*;
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_execute_on_their_own_threads_below_the_hosts_priority() {
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    let host = threads::priority();
    // A task that used a whole slice (and yielded) goes on on a guest
    // thread, at the guests' priority.
    let ((name, nice), _) = execute(&scheduler, "a", async {
        Yield(false).await;
        here()
    })
    .await;
    assert_eq!(name.as_deref(), Some("corral-guest"));
    assert_eq!(nice, (host + GUEST_NICE).min(19), "host at nice {host}");
    // A short task, given a slot at once, runs where it was called...
    let caller = here();
    let (short, _) = execute(&scheduler, "a", async { here() }).await;
    assert_eq!(short, caller);
    // ...inside the guests' runtime: what it spawns runs on their threads.
    let (spawned, _) = execute(&scheduler, "a", async {
        tokio::spawn(async { here() }).await.ok()
    })
    .await;
    assert_eq!(
        spawned.and_then(|(name, _)| name).as_deref(),
        Some("corral-guest")
    );
    // A task that waits for I/O goes on on a guest thread once woken.
    let (wake, woken) = tokio::sync::oneshot::channel::<()>();
    let mut waits = Box::pin(execute(&scheduler, "a", async move {
        let _ = woken.await;
        here()
    }));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(waits.as_mut().poll(&mut cx).is_pending());
    let _ = wake.send(());
    let ((name, _), _) = waits.await;
    assert_eq!(name.as_deref(), Some("corral-guest"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_moved_to_a_guest_thread_keeps_its_span_and_subscriber() {
    use tracing::Instrument as _;
    use tracing::instrument::WithSubscriber as _;
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    // A subscriber of this test's own (none is the global default), and
    // a span the caller runs the task in.
    let subscriber = tracing::Dispatch::new(tracing_subscriber::registry());
    let span = tracing::dispatcher::with_default(&subscriber, || tracing::info_span!("the-task"));
    let ((span, ours, name), _) = execute(&scheduler, "a", async {
        Yield(false).await;
        (
            tracing::Span::current().metadata().map(|m| m.name()),
            tracing::dispatcher::get_default(|d| d.is::<tracing_subscriber::Registry>()),
            here().0,
        )
    })
    .instrument(span)
    .with_subscriber(subscriber)
    .await;
    assert_eq!(name.as_deref(), Some("corral-guest"));
    assert_eq!(span, Some("the-task"));
    assert!(ours, "the caller's subscriber");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_task_on_a_guest_thread_is_torn_down_in_its_span() {
    use tracing::Instrument as _;
    use tracing::instrument::WithSubscriber as _;
    /// Says, when dropped, which span was current.
    struct Torn(std::sync::mpsc::Sender<Option<&'static str>>);
    impl Drop for Torn {
        fn drop(&mut self) {
            let _ = self
                .0
                .send(tracing::Span::current().metadata().map(|m| m.name()));
        }
    }
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    let subscriber = tracing::Dispatch::new(tracing_subscriber::registry());
    let span = tracing::dispatcher::with_default(&subscriber, || tracing::info_span!("the-task"));
    let (torn, torn_rx) = std::sync::mpsc::channel();
    let (moved, moved_rx) = tokio::sync::oneshot::channel();
    let (_never, never_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(
        execute(&scheduler, "a", async move {
            let _torn = Torn(torn);
            Yield(false).await;
            let _ = moved.send(here().0);
            let _ = never_rx.await;
        })
        .instrument(span)
        .with_subscriber(subscriber),
    );
    assert_eq!(
        moved_rx.await.ok().flatten().as_deref(),
        Some("corral-guest")
    );
    // Cancelled mid-run: its store and instance go with it.
    task.abort();
    let current = tokio::task::spawn_blocking(move || torn_rx.recv())
        .await
        .unwrap();
    assert_eq!(current, Ok(Some("the-task")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guests_panic_reaches_the_caller_and_frees_its_slot_and_place() {
    // On a guest thread: the only slot is free again.
    let scheduler = CpuScheduler::new(1, Arc::new(Metrics::default()));
    let panicked = tokio::spawn(execute(&scheduler, "a", async {
        Yield(false).await;
        panic!("a broken invariant")
    }))
    .await;
    assert!(panicked.unwrap_err().is_panic());
    let seven = execute(&scheduler, "b", async { 7 });
    let (seven, _) = tokio::time::timeout(Duration::from_secs(10), seven)
        .await
        .expect("the slot is free");
    assert_eq!(seven, 7);
    // On the caller's thread: its place there is free again.
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    let panicked = tokio::spawn(execute(&scheduler, "a", async {
        panic!("a broken invariant")
    }))
    .await;
    assert!(panicked.unwrap_err().is_panic());
    let caller = here();
    let (short, _) = execute(&scheduler, "b", async { here() }).await;
    assert_eq!(short, caller);
}

/// Panics at its first poll; would end at its second.
struct PanicsOnce(bool);

impl Future for PanicsOnce {
    type Output = u8;

    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<u8> {
        if !self.0 {
            self.0 = true;
            panic!("a broken invariant");
        }
        Poll::Ready(1)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_first_poll_panicked_is_not_polled_on_as_if_it_had_not() {
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    let mut task = Box::pin(scheduler.execute(
        Arc::from("a"),
        Arc::default(),
        CpuShare::default(),
        || PanicsOnce(false),
    ));
    let mut cx = Context::from_waker(Waker::noop());
    let mut poll =
        || std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.as_mut().poll(&mut cx)));
    assert!(
        poll().is_err(),
        "its first poll panics, on the caller's thread"
    );
    // Polled again (a caller that caught the panic), it must not wait on
    // for a wake that never comes, holding the slot it panicked in.
    let again = poll().expect_err("polled on after its panic");
    assert_eq!(
        again.downcast_ref::<&str>(),
        Some(&"a task's execution polled again after its first poll panicked")
    );
    drop(task);
    // Its slot and its place on the caller's thread are free again.
    let caller = here();
    let (short, _) = execute(&scheduler, "b", async { here() }).await;
    assert_eq!(short, caller);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_task_that_waits_for_a_slot_runs_on_a_guest_thread() {
    // Both slots held, on guest threads, and a task of tenant `0` in line
    // (its turn comes before `b`'s: as little CPU, nothing running, and
    // its name first): the caller's place is free, but `b` must wait, and
    // waits on a guest thread.
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    let holders = [hold(&scheduler, "a", true), hold(&scheduler, "a", true)];
    let share = CpuShare::default();
    let mut ahead = scheduler.run(Arc::from("0"), Arc::from("t"), share, async {});
    let mut cx = Context::from_waker(Waker::noop());
    assert!(Pin::new(&mut ahead).poll(&mut cx).is_pending());
    let mut waits = Box::pin(execute(&scheduler, "b", async { here() }));
    assert!(
        waits.as_mut().poll(&mut cx).is_pending(),
        "ran without a slot"
    );
    for (holder, end) in holders {
        let _ = end.send(());
        holder.await.unwrap();
    }
    let ((name, _), _) = tokio::time::timeout(Duration::from_secs(10), waits)
        .await
        .expect("the slots are free");
    assert_eq!(name.as_deref(), Some("corral-guest"));
    ahead.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_tenant_whose_turn_comes_next_runs_its_first_slice_at_once_though_the_slots_are_taken() {
    // Both slots held by `a`'s tasks on guest threads, which the system
    // may push off their cores (they run at a lower priority than the
    // host's). `b` has nothing running and its turn comes next: its first
    // slice runs at once on the caller's thread, beyond the slots.
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    let holders = [hold(&scheduler, "a", true), hold(&scheduler, "a", true)];
    let caller = here();
    let runs = Box::pin(execute(&scheduler, "b", async { here() }));
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready((ran, used)) = { runs }.as_mut().poll(&mut cx) else {
        panic!("waited for a slot held by a tenant whose turn came after it");
    };
    assert_eq!(ran, caller);
    assert_eq!(used.waited, Duration::ZERO);
    // It gave the slot beyond the others back: `a`'s two hold theirs.
    assert_eq!(lock(&scheduler.fair).running(), 2);
    for (holder, end) in holders {
        let _ = end.send(());
        holder.await.unwrap();
    }
    assert_eq!(lock(&scheduler.fair).running(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_half_the_slots_run_a_first_poll_on_the_callers_threads() {
    // Two slots: `a`'s first poll takes the one place on the host's
    // threads, so `b`, with a slot free, runs on a guest thread.
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    // (Where its one poll ran is the test: it may end before a first
    // poll of the caller's would see it pending.)
    let (holder, end) = hold(&scheduler, "a", false);
    let runs = execute(&scheduler, "b", async { here() });
    let ((name, _), _) = tokio::time::timeout(Duration::from_secs(10), runs)
        .await
        .expect("a slot is free");
    assert_eq!(
        name.as_deref(),
        Some("corral-guest"),
        "ran on the caller's thread"
    );
    let _ = end.send(());
    holder.await.unwrap();
}
