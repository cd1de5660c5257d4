//! The scheduler as tasks meet it: turns, slots given back, threads.

use super::*;
use crate::share::CpuWeight;

/// Yields as wasmtime's fuel and epoch yields do: wakes itself while it
/// is polled, then returns `Pending` once.
struct Yield(bool);

impl Future for Yield {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Burns about `cpu` of CPU, yielding every millisecond of it (it may
/// go on on another thread after each).
async fn burn(cpu: Duration) {
    let mut burnt = Duration::ZERO;
    while burnt < cpu {
        let slice = thread_cpu();
        while thread_cpu().saturating_sub(slice) < Duration::from_millis(1) {}
        burnt += thread_cpu().saturating_sub(slice);
        Yield(false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_execute_on_their_own_threads_below_the_hosts_priority() {
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    let host = threads::priority();
    let here = || {
        let name = std::thread::current().name().map(str::to_owned);
        (name, threads::priority())
    };
    // A task that used a whole slice (and yielded) goes on on a guest
    // thread, at the guests' priority.
    let ((name, nice), _) = scheduler
        .execute(
            Arc::from("a"),
            "where".to_owned(),
            CpuShare::default(),
            async move {
                Yield(false).await;
                here()
            },
        )
        .await;
    assert_eq!(name.as_deref(), Some("corral-guest"));
    assert_eq!(nice, (host + GUEST_NICE).min(19), "host at nice {host}");
    // A short task, given a slot at once, runs where it was called.
    let caller = here();
    let (short, _) = scheduler
        .execute(
            Arc::from("a"),
            "where".to_owned(),
            CpuShare::default(),
            async move { here() },
        )
        .await;
    assert_eq!(short, caller);
    // A task that waits for I/O goes on on a guest thread once woken.
    let (wake, woken) = tokio::sync::oneshot::channel::<()>();
    let mut waits = Box::pin(scheduler.execute(
        Arc::from("a"),
        "where".to_owned(),
        CpuShare::default(),
        async move {
            let _ = woken.await;
            here()
        },
    ));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(waits.as_mut().poll(&mut cx).is_pending());
    let _ = wake.send(());
    let ((name, _), _) = waits.await;
    assert_eq!(name.as_deref(), Some("corral-guest"));
    // A guest's panic reaches the caller, and its slot is free again.
    let panicked = tokio::spawn({
        let scheduler = scheduler.clone();
        async move {
            scheduler
                .execute(
                    Arc::from("a"),
                    "panic".to_owned(),
                    CpuShare::default(),
                    async { panic!("a broken invariant") },
                )
                .await
        }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    let run = scheduler.execute(
        Arc::from("b"),
        "seven".to_owned(),
        CpuShare::default(),
        async { 7 },
    );
    let (seven, _) = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the slots are free");
    assert_eq!(seven, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_waits_for_a_slot_runs_on_a_guest_thread() {
    let scheduler = CpuScheduler::new(1, Arc::new(Metrics::default()));
    // `a` holds the only slot (running on the thread that called it)
    // until told to end.
    let (started, has_started) = std::sync::mpsc::channel();
    let (end, ended) = std::sync::mpsc::channel::<()>();
    let holder = tokio::spawn({
        let scheduler = scheduler.clone();
        async move {
            let hold = async move {
                let _ = started.send(());
                let _ = ended.recv_timeout(Duration::from_secs(10));
            };
            let share = CpuShare::default();
            let held = scheduler.execute(Arc::from("a"), "hold".to_owned(), share, hold);
            held.await
        }
    });
    has_started
        .recv_timeout(Duration::from_secs(10))
        .expect("a runs");
    let mut waits = Box::pin(scheduler.execute(
        Arc::from("b"),
        "where".to_owned(),
        CpuShare::default(),
        async { std::thread::current().name().map(str::to_owned) },
    ));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(waits.as_mut().poll(&mut cx).is_pending());
    let _ = end.send(());
    holder.await.unwrap();
    let (name, _) = tokio::time::timeout(Duration::from_secs(10), waits)
        .await
        .expect("the slot is free");
    assert_eq!(name.as_deref(), Some("corral-guest"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_panics_while_it_runs_gives_its_slot_back() {
    let scheduler = CpuScheduler::new(1, Arc::new(Metrics::default()));
    let panics = scheduler.run(
        Arc::from("a"),
        "panic".to_owned(),
        CpuShare::default(),
        async { panic!("a broken invariant") },
    );
    assert!(tokio::spawn(panics).await.is_err());
    let next = scheduler.run(
        Arc::from("b"),
        "seven".to_owned(),
        CpuShare::default(),
        async { 7 },
    );
    let (value, _) = tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("the slot is free");
    assert_eq!(value, 7);
}

#[tokio::test(flavor = "current_thread")]
async fn a_task_that_yields_is_back_in_line_before_its_slot_is_given_away() {
    // One slot; `a` weighs 10,000 times `b`, each has one task that
    // yields every millisecond. Once `b` has had its turn (it starts
    // level), `a` is owed the slot at each of its yields and keeps it:
    // were a yielding task not back in line before the slot is handed
    // on, `b`, the only one waiting, would take every other slice.
    let scheduler = CpuScheduler::new(1, Arc::new(Metrics::default()));
    let order = Arc::new(Mutex::new(Vec::new()));
    let task = |name: &'static str, weight: i64| {
        let order = order.clone();
        let share = CpuShare {
            weight: CpuWeight::new(weight).unwrap(),
            max: None,
        };
        scheduler.run(Arc::from(name), "turns".to_owned(), share, async move {
            for _ in 0..5 {
                lock(&order).push(name);
                let slice = thread_cpu();
                while thread_cpu().saturating_sub(slice) < Duration::from_millis(1) {}
                Yield(false).await;
            }
        })
    };
    let (a, b) = (tokio::spawn(task("a", 10_000)), tokio::spawn(task("b", 1)));
    a.await.unwrap();
    b.await.unwrap();
    let order = lock(&order).clone();
    let a_done = order.iter().rposition(|n| *n == "a").unwrap_or(0);
    assert!(
        a_done <= 6,
        "b took turns while a was owed the slot: {order:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn two_tasks_on_one_slot_take_turns_and_count_their_cpu_and_wait() {
    let metrics = Arc::new(Metrics::default());
    let scheduler = CpuScheduler::new(1, metrics.clone());
    let run = |tenant: &str| {
        tokio::spawn(scheduler.run(
            Arc::from(tenant),
            "burn".to_owned(),
            CpuShare::default(),
            burn(Duration::from_millis(50)),
        ))
    };
    let (a, b) = (run("a"), run("b"));
    let ((_, a), (_, b)) = (a.await.unwrap(), b.await.unwrap());
    for used in [a, b] {
        assert!(used.cpu >= Duration::from_millis(50), "{used:?}");
    }
    // One slot: each waited while the other ran, about as long.
    assert!(
        a.waited + b.waited >= Duration::from_millis(40),
        "{a:?} {b:?}"
    );
    // And the metrics hold exactly what each task counted.
    for (tenant, used) in [("a", a), ("b", b)] {
        let counted = metrics.cpu(tenant);
        assert_eq!((counted.used, counted.waited), (used.cpu, used.waited));
    }
}

/// Runs `inside` while a task of tenant "a" holds the only slot.
async fn while_held(scheduler: &Arc<CpuScheduler>, inside: impl FnOnce()) {
    let mut inside = Some(inside);
    let holder = std::future::poll_fn(move |_| {
        if let Some(inside) = inside.take() {
            inside();
        }
        Poll::Ready(())
    });
    scheduler
        .run(
            Arc::from("a"),
            "hold".to_owned(),
            CpuShare::default(),
            holder,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_dropped_while_in_line_or_granted_leaves_no_slot_taken() {
    let scheduler = CpuScheduler::new(1, Arc::new(Metrics::default()));
    let mut cx = Context::from_waker(Waker::noop());
    let next = |scheduler: &Arc<CpuScheduler>| {
        let run = scheduler.run(
            Arc::from("b"),
            "seven".to_owned(),
            CpuShare::default(),
            async { 7 },
        );
        tokio::time::timeout(Duration::from_secs(10), run)
    };

    // In line, then gone: it must not be granted the slot later.
    let mut gone = Box::pin(scheduler.run(
        Arc::from("b"),
        "none".to_owned(),
        CpuShare::default(),
        async {},
    ));
    while_held(&scheduler, || {
        assert!(gone.as_mut().poll(&mut cx).is_pending());
        drop(gone);
    })
    .await;
    let ran = next(&scheduler).await.expect("the slot is free");
    assert_eq!(ran.0, 7);

    // Granted when the holder finished, then dropped before it ran.
    let mut granted = Box::pin(scheduler.run(
        Arc::from("b"),
        "none".to_owned(),
        CpuShare::default(),
        async {},
    ));
    while_held(&scheduler, || {
        assert!(granted.as_mut().poll(&mut cx).is_pending());
    })
    .await;
    drop(granted);
    let ran = next(&scheduler).await.expect("the slot is free");
    assert_eq!(ran.0, 7);
}
