//! The scheduler as tasks meet it: turns, slots given back, CPU counted;
//! where tasks run is in `placement`.

use super::*;
use crate::share::CpuWeight;

mod placement;

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

/// The name of the thread it runs on, and its nice value.
fn here() -> (Option<String>, i32) {
    let name = std::thread::current().name().map(str::to_owned);
    (name, threads::priority())
}

/// `work` executed by a task of `tenant`.
fn execute<F>(
    scheduler: &Arc<CpuScheduler>,
    tenant: &str,
    work: F,
) -> impl Future<Output = (F::Output, CpuUse)> + Send + 'static
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (scheduler, tenant) = (scheduler.clone(), Arc::from(tenant));
    async move {
        let share = CpuShare::default();
        scheduler
            .execute(tenant, Arc::default(), share, || work)
            .await
    }
}

/// A task of `tenant` that holds a slot, on a guest thread if `yields`
/// first or else on the caller's, until `end` is sent; returned once it
/// holds it.
fn hold(
    scheduler: &Arc<CpuScheduler>,
    tenant: &str,
    yields: bool,
) -> (
    tokio::task::JoinHandle<((), CpuUse)>,
    std::sync::mpsc::Sender<()>,
) {
    let (started, has_started) = std::sync::mpsc::channel();
    let (end, ended) = std::sync::mpsc::channel::<()>();
    let holder = tokio::spawn(execute(scheduler, tenant, async move {
        if yields {
            Yield(false).await;
        }
        let _ = started.send(());
        let _ = ended.recv_timeout(Duration::from_secs(10));
    }));
    has_started
        .recv_timeout(Duration::from_secs(10))
        .expect("it holds its slot");
    (holder, end)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_panics_while_it_runs_gives_its_slot_back() {
    let scheduler = CpuScheduler::new(1, Arc::new(Metrics::default()));
    let panics = scheduler.run(
        Arc::from("a"),
        Arc::from("panic"),
        CpuShare::default(),
        async { panic!("a broken invariant") },
    );
    assert!(tokio::spawn(panics).await.is_err());
    let next = scheduler.run(
        Arc::from("b"),
        Arc::from("seven"),
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
        scheduler.run(Arc::from(name), Arc::from("turns"), share, async move {
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
            Arc::from("burn"),
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
            Arc::from("hold"),
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
            Arc::from("seven"),
            CpuShare::default(),
            async { 7 },
        );
        tokio::time::timeout(Duration::from_secs(10), run)
    };
    // A task of `b` with nothing to do, to be dropped before it runs.
    let idle = |scheduler: &Arc<CpuScheduler>| {
        Box::pin(scheduler.run(
            Arc::from("b"),
            Arc::from("none"),
            CpuShare::default(),
            async {},
        ))
    };

    // In line, then gone: it must not be granted the slot later.
    let mut gone = idle(&scheduler);
    while_held(&scheduler, || {
        assert!(gone.as_mut().poll(&mut cx).is_pending());
        drop(gone);
    })
    .await;
    let ran = next(&scheduler).await.expect("the slot is free");
    assert_eq!(ran.0, 7);

    // Granted when the holder finished, then dropped before it ran.
    let mut granted = idle(&scheduler);
    while_held(&scheduler, || {
        assert!(granted.as_mut().poll(&mut cx).is_pending());
    })
    .await;
    drop(granted);
    let ran = next(&scheduler).await.expect("the slot is free");
    assert_eq!(ran.0, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_dropped_in_line_counts_the_time_it_waited_there() {
    // A deadline or cancel that ends a task while it waits for a core:
    // that wait is the tenant's too (`corral_tenant_cpu_wait_seconds_total`).
    let metrics = Arc::new(Metrics::default());
    let scheduler = CpuScheduler::new(1, metrics.clone());
    let mut cx = Context::from_waker(Waker::noop());
    let mut gone = Box::pin(scheduler.run(
        Arc::from("b"),
        Arc::from("none"),
        CpuShare::default(),
        async {},
    ));
    let mut between = Duration::ZERO;
    while_held(&scheduler, || {
        let asked = Instant::now();
        assert!(gone.as_mut().poll(&mut cx).is_pending());
        // A wait too long to be mistaken for none.
        std::thread::sleep(Duration::from_millis(5));
        drop(gone);
        between = asked.elapsed();
    })
    .await;
    let waited = metrics.cpu("b").waited;
    assert!(
        waited >= Duration::from_millis(5) && waited <= between,
        "counted {waited:?} of a wait of {between:?}"
    );
}

/// Work whose drop burns this much of its thread's CPU (a store and an
/// instance to tear down).
struct CostlyToDrop(Duration);

impl Drop for CostlyToDrop {
    fn drop(&mut self) {
        let start = thread_cpu();
        while thread_cpu().saturating_sub(start) < self.0 {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_tasks_teardown_is_counted_as_its_tenants_cpu() {
    // Cancelled while it waits for I/O: in no line, holding no slot.
    let metrics = Arc::new(Metrics::default());
    let scheduler = CpuScheduler::new(1, metrics.clone());
    let mut cx = Context::from_waker(Waker::noop());
    let costly = CostlyToDrop(Duration::from_millis(20));
    let mut waiting = Box::pin(scheduler.run(
        Arc::from("b"),
        Arc::from("io"),
        CpuShare::default(),
        async move {
            let _costly = costly;
            std::future::pending::<()>().await;
        },
    ));
    assert!(waiting.as_mut().poll(&mut cx).is_pending());
    let before = metrics.cpu("b").used;
    drop(waiting);
    let counted = metrics.cpu("b").used.saturating_sub(before);
    assert!(
        counted >= Duration::from_millis(20),
        "counted {counted:?} of a 20 ms teardown"
    );
}

/// A waker that, woken, has the task follow another waker at once, as a
/// waker that polls the task where it is woken would.
struct Reentrant(Mutex<Option<Arc<Waiter>>>);

impl std::task::Wake for Reentrant {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let waiter = lock(&self.0).clone();
        if let Some(waiter) = waiter {
            waiter.follow(Waker::noop());
        }
    }
}

#[test]
fn a_wake_is_passed_on_with_the_tasks_waker_let_go() {
    let waiter = Waiter::new();
    let reentrant = Arc::new(Reentrant(Mutex::new(Some(waiter.clone()))));
    waiter.follow(&Waker::from(reentrant.clone()));
    let waker = Waker::from(waiter.clone());
    let (done, woke) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        waker.wake_by_ref();
        let _ = done.send(());
    });
    let woke = woke.recv_timeout(Duration::from_secs(10));
    lock(&reentrant.0).take();
    assert!(
        woke.is_ok(),
        "the wake never returned: the task's waker found its lock held"
    );
}
