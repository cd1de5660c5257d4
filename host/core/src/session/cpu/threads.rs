//! The threads guests run on: a runtime of their own, one thread per guest
//! slot, each at a lower CPU priority (nice) than the host's own threads.
//! The host's work (polling, reporting, heartbeats, the admin API,
//! `/metrics`) runs on the main runtime and always goes first, as do other
//! processes on the machine — an engine's server beside the host, say:
//! guests take the CPU that is left, and it is all theirs when nothing else
//! wants it. (A task's first poll is the exception: see
//! [`super::CpuScheduler::execute`].)

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// How much lower guest threads' priority is than the host's (added to the
/// host's nice value, at most 19): a thread 10 lower gets about a tenth of
/// the CPU of one at the host's when both want it.
pub const GUEST_NICE: i32 = 10;

/// The guests' runtime; shut down without waiting when dropped.
pub(super) struct GuestThreads(Option<Runtime>);

impl GuestThreads {
    pub fn new(threads: usize) -> std::io::Result<GuestThreads> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("corral-guest")
            .on_thread_start(lower_priority)
            .enable_all()
            .build()?;
        Ok(GuestThreads(Some(runtime)))
    }

    /// Makes the guests' runtime the current one until dropped: what the
    /// caller spawns, and its timers, are the guests'.
    pub fn enter(&self) -> Option<tokio::runtime::EnterGuard<'_>> {
        self.0.as_ref().map(Runtime::enter)
    }

    /// Runs `work` on a guest thread; the returned future ends with it, and
    /// stops it when dropped. A panic in `work` resumes in the caller.
    pub fn spawn<F>(&self, work: F) -> OnGuestThread<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.0 {
            Some(runtime) => OnGuestThread(runtime.spawn(work)),
            // Only while dropping: never reached by a caller.
            None => OnGuestThread(tokio::spawn(work)),
        }
    }
}

impl Drop for GuestThreads {
    fn drop(&mut self) {
        // Dropping a runtime may not block inside another one.
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Work running on a guest thread: see [`GuestThreads::spawn`].
pub struct OnGuestThread<T>(JoinHandle<T>);

impl<T> Future for OnGuestThread<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match Pin::new(&mut self.0).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(output)) => Poll::Ready(output),
            Poll::Ready(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Aborted only by our own drop, or the runtime shutting down
            // with the host: nothing is waiting for it then.
            Poll::Ready(Err(_)) => Poll::Pending,
        }
    }
}

impl<T> Drop for OnGuestThread<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Lowers the calling thread's priority (Linux: nice is per thread). A
/// host where that is refused runs guests at the host's priority.
fn lower_priority() {
    // SAFETY: getpriority and setpriority on the calling thread (who = 0)
    // read and change nothing but its scheduling priority. (getpriority's
    // -1 is also a nice value: a host at -1 puts guests at 9.)
    unsafe {
        let host = libc::getpriority(libc::PRIO_PROCESS, 0);
        let _ = libc::setpriority(libc::PRIO_PROCESS, 0, (host + GUEST_NICE).min(19));
    }
}

/// The nice value of the calling thread.
#[cfg(test)]
pub(super) fn priority() -> i32 {
    // SAFETY: getpriority reads the calling thread's nice value.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
}
