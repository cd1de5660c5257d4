//! Time slices by the clock. A guest yields to the runtime every so much
//! fuel (`yield_every_fuel`): a few milliseconds of typical code, but fuel
//! counts instructions, not time, and code that misses the cache at most
//! of its loads runs one interval for far longer. So while any task runs, a
//! thread advances the engine's epoch every [`TICK`]. Each running guest
//! then reaches its epoch deadline, a call into the host that the store's
//! call hook sees: the watchdog there yields a guest whose slice has run
//! its 1 ms (and checks its deadline and cancel), as it does at any host
//! call. A guest that never yields by fuel therefore yields within a tick;
//! typical code still yields by fuel, and at most once a tick besides.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use wasmtime::Engine;

use crate::sync::lock;

/// How often the epoch advances while a task runs: the longest a guest
/// runs between yields however slowly its fuel goes (and how late its
/// deadline or cancel may be seen), a slice's 1 ms aside.
pub const TICK: Duration = Duration::from_millis(10);

#[derive(Default)]
struct State {
    running: usize,
    stopped: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

/// The thread that advances the epoch while tasks run; stopped when
/// dropped.
pub(crate) struct Ticker(Arc<Shared>);

/// A task counted in: the epoch advances until it is dropped.
pub(crate) struct Ticking<'a>(&'a Shared);

impl Drop for Ticking<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.0.state);
        state.running = state.running.saturating_sub(1);
    }
}

impl Ticker {
    /// Starts the thread for `engine`. Without one (the system refused a
    /// thread), guests yield by fuel only.
    pub(crate) fn start(engine: Engine) -> Ticker {
        let shared = Arc::new(Shared::default());
        let ticking = shared.clone();
        let started = std::thread::Builder::new()
            .name("corral-epoch".into())
            .spawn(move || tick(&ticking, &engine));
        if let Err(e) = started {
            tracing::warn!("no epoch thread ({e}): guests yield by fuel only");
        }
        Ticker(shared)
    }

    /// Counts a task in: the epoch advances while any is.
    pub(crate) fn enter(&self) -> Ticking<'_> {
        let mut state = lock(&self.0.state);
        state.running += 1;
        if state.running == 1 {
            self.0.changed.notify_all();
        }
        Ticking(&self.0)
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        lock(&self.0.state).stopped = true;
        self.0.changed.notify_all();
    }
}

/// Advances `engine`'s epoch every [`TICK`] while a task runs; sleeps
/// while none does.
fn tick(shared: &Shared, engine: &Engine) {
    loop {
        {
            let mut state = lock(&shared.state);
            while state.running == 0 && !state.stopped {
                state = match shared.changed.wait(state) {
                    Ok(state) => state,
                    Err(poisoned) => poisoned.into_inner(),
                };
            }
            if state.stopped {
                return;
            }
        }
        std::thread::sleep(TICK);
        engine.increment_epoch();
    }
}
