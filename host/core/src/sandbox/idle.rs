//! Giving back the pool's resident memory when the host goes idle.
//!
//! The pool keeps each freed slot's memory resident for the next instance
//! (`memory_keep_resident` per slot): cheaper than faulting it back in, but
//! a host that served a burst and then went quiet keeps that memory.
//! [`Sandbox::release_idle_memory`] hands it back to the kernel once no task
//! has started for a while.
//!
//! wasmtime takes the warm slots out of the pool while it releases them, so
//! an instantiation at that moment could find no slot. Releasing and running
//! therefore exclude each other: a task entering the sandbox counts itself
//! in (two atomic operations, no lock), a release happens only when the
//! count is zero and keeps tasks out until it is done, and a task that finds
//! a release under way waits for it (a few milliseconds).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use wasmtime::Engine;

/// The bit of [`Activity::state`] set while a release runs; the rest count
/// the tasks in the sandbox.
const RELEASING: u64 = 1 << 63;

/// Tasks in the sandbox, when the last one started, and releases.
pub(crate) struct Activity {
    state: AtomicU64,
    released: Notify,
    epoch: Instant,
    /// Milliseconds from `epoch` to the last task's start.
    last_start_ms: AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            state: AtomicU64::new(0),
            released: Notify::new(),
            epoch: Instant::now(),
            last_start_ms: AtomicU64::new(0),
        }
    }
}

/// A task in the sandbox; counted out when dropped.
pub(crate) struct Running<'a>(&'a Activity);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.state.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Activity {
    /// Counts a task in that started at `started`, waiting out a release.
    pub(crate) async fn enter(&self, started: Instant) -> Running<'_> {
        let since = started.saturating_duration_since(self.epoch).as_millis();
        self.last_start_ms
            .fetch_max(u64::try_from(since).unwrap_or(u64::MAX), Ordering::Relaxed);
        loop {
            if self.state.fetch_add(1, Ordering::AcqRel) & RELEASING == 0 {
                return Running(self);
            }
            self.state.fetch_sub(1, Ordering::AcqRel);
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if self.state.load(Ordering::Acquire) & RELEASING != 0 {
                released.await;
            }
        }
    }

    /// How long since the last task started.
    fn idle_for(&self, now: Instant) -> Duration {
        let last = Duration::from_millis(self.last_start_ms.load(Ordering::Relaxed));
        now.saturating_duration_since(self.epoch)
            .saturating_sub(last)
    }
}

impl Activity {
    /// Releases the memory `engine`'s pool keeps resident for its free
    /// slots, if no task has started for `idle` and none is running; the
    /// bytes released, or `None` when the host is not idle.
    pub(crate) fn release(&self, engine: &Engine, idle: Duration) -> Option<usize> {
        if self.idle_for(Instant::now()) < idle {
            return None;
        }
        self.state
            .compare_exchange(0, RELEASING, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        let released = engine.release_idle_pool_memory();
        self.state.fetch_and(!RELEASING, Ordering::AcqRel);
        self.released.notify_waiters();
        Some(released)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_release_waits_for_running_tasks_and_tasks_wait_for_a_release() {
        let activity = Activity::default();
        let long_ago = activity.epoch;
        let running = activity.enter(long_ago).await;
        // Not while a task runs.
        assert!(
            activity
                .state
                .compare_exchange(0, RELEASING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        );
        drop(running);
        // A release under way holds the next task back until it is done.
        activity.state.store(RELEASING, Ordering::Release);
        let mut entering = std::pin::pin!(activity.enter(long_ago));
        assert!(futures::poll!(entering.as_mut()).is_pending());
        activity.state.fetch_and(!RELEASING, Ordering::AcqRel);
        activity.released.notify_waiters();
        let running = entering.await;
        assert_eq!(activity.state.load(Ordering::Acquire), 1);
        drop(running);
        assert_eq!(activity.state.load(Ordering::Acquire), 0);
    }

    #[test]
    fn idleness_counts_from_the_last_task_started() {
        let activity = Activity::default();
        let later = activity.epoch + Duration::from_secs(5);
        activity.last_start_ms.store(2_000, Ordering::Relaxed);
        assert_eq!(activity.idle_for(later), Duration::from_secs(3));
    }
}
