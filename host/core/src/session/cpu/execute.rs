//! [`super::CpuScheduler::execute`]'s task: its first poll on the caller's
//! thread when it may, then on a guest thread. Written out rather than an
//! `async` block: the caller moves it into its own future whole, twice, and
//! this is half the size (no second place for the scheduled task, no copy
//! of its output held between awaits): two copies of a few hundred bytes
//! less a task (`cargo bench -p corral --bench sandbox callgrind`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use super::boxes::TaskBox;
use super::fair::Beyond;
use super::threads::OnGuestThread;
use super::{CpuScheduler, Scheduled};
use crate::share::CpuUse;

/// A task under the scheduler, where it runs.
pub(super) struct Execute<'a, F: Future + Send + 'static>
where
    F::Output: Send + 'static,
{
    scheduler: &'a Arc<CpuScheduler>,
    stage: Stage<F>,
}

/// Where a task runs.
enum Stage<F: Future + Send + 'static>
where
    F::Output: Send + 'static,
{
    /// Not polled yet.
    First(Scheduled<TaskBox<F>>),
    /// On the caller's thread all its life: the system refused guests
    /// threads of their own.
    Here(Scheduled<TaskBox<F>>),
    /// On a guest thread.
    There(OnGuestThread<(F::Output, CpuUse)>),
    /// Ended on the caller's thread, or between it and a guest thread.
    Gone,
}

impl<F: Future + Send + 'static> Stage<F>
where
    F::Output: Send + 'static,
{
    fn take(&mut self) -> Stage<F> {
        std::mem::replace(self, Stage::Gone)
    }
}

impl<'a, F: Future + Send + 'static> Execute<'a, F>
where
    F::Output: Send + 'static,
{
    pub fn new(scheduler: &'a Arc<CpuScheduler>, scheduled: Scheduled<TaskBox<F>>) -> Self {
        Execute {
            scheduler,
            stage: Stage::First(scheduled),
        }
    }
}

impl<F: Future + Send + 'static> Future for Execute<'_, F>
where
    F::Output: Send + 'static,
{
    type Output = (F::Output, CpuUse);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let scheduler = this.scheduler;
        let scheduled = match &mut this.stage {
            // Polled before, so its first poll panicked (one that returned
            // `Pending` moved it on): as an `async` block, it may not go
            // on, its slot and place held twice.
            Stage::First(scheduled) if scheduled.polled => {
                panic!("a task's execution polled again after its first poll panicked")
            }
            Stage::First(scheduled) => scheduled,
            Stage::Here(scheduled) => return Pin::new(scheduled).poll(cx),
            Stage::There(on_thread) => return Pin::new(on_thread).poll(cx),
            Stage::Gone => return Poll::Pending,
        };
        let Some(threads) = &scheduler.threads else {
            if let Stage::First(scheduled) = this.stage.take() {
                this.stage = Stage::Here(scheduled);
            }
            return Pin::new(this).poll(cx);
        };
        if let Some(_place) = Inline::take(&scheduler.inline) {
            // Returns at once: the guard never crosses a `Pending`. The
            // caller's span and subscriber are this thread's already.
            let _guests = threads.enter();
            // Here, at the host's priority, no slot holder pushed off its
            // core can keep it waiting: with the slots all taken it runs
            // now if its tenant's turn comes next anyway.
            scheduled.beyond = Beyond::IfNext;
            if let Poll::Ready(done) = Pin::new(scheduled).poll(cx) {
                this.stage = Stage::Gone;
                return Poll::Ready(done);
            }
        }
        // From its first `Pending` on, on a guest thread, with the task's
        // span and the caller's subscriber: its logs and spans are the
        // task's, as on the caller's thread.
        if let Stage::First(mut scheduled) = this.stage.take() {
            scheduled.context = Some(Box::new((
                tracing::Span::current(),
                tracing::dispatcher::get_default(Clone::clone),
            )));
            this.stage = Stage::There(threads.spawn(scheduled));
        }
        Pin::new(this).poll(cx)
    }
}

/// A task's first poll running on the host's threads: its place in
/// [`CpuScheduler::inline`], given back when dropped (a panic too).
struct Inline<'a>(&'a AtomicUsize);

impl<'a> Inline<'a> {
    fn take(places: &'a AtomicUsize) -> Option<Inline<'a>> {
        places
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| {
                free.checked_sub(1)
            })
            .ok()
            .map(|_| Inline(places))
    }
}

impl Drop for Inline<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}
