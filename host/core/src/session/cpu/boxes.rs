//! Boxes for tasks' futures, kept for the next task. A task's future is
//! kilobytes (the sandbox's whole `execute` state), past the allocator's
//! per-thread cache, and must be on the heap to move to a guest thread at
//! its first yield: a fresh box for each task cost about a thousand
//! instructions in `malloc` and `free`, a third of what the scheduler cost
//! a task (`cargo bench -p corral --bench sandbox callgrind`). A box stays
//! pinned all its life; a task's future is dropped in it, in place, and the
//! next task's is written into it.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use crate::sync::lock;

/// The boxes kept, at most `most` of each future type (a session runs its
/// tasks' futures as one type, shadow replay its own).
pub(super) struct TaskBoxes {
    /// One `Vec<Kept<F>>` for each type `F` kept so far.
    kept: Mutex<Vec<Box<dyn Any + Send>>>,
    most: usize,
}

/// A box kept for a future of type `F`: empty, pinned since it was made.
type Kept<F> = Pin<Box<Option<F>>>;

/// The boxes kept for futures of type `F`, if any type `F` ever was.
fn of_type<F: Send + 'static>(kept: &mut [Box<dyn Any + Send>]) -> Option<&mut Vec<Kept<F>>> {
    kept.iter_mut().find_map(|boxes| boxes.downcast_mut())
}

/// A task's future in a box that outlives it: see [`TaskBoxes`]. Dropping
/// it drops the future and keeps the box.
pub(super) struct TaskBox<F: Send + 'static> {
    /// `Some` until dropped; the future in it until it ends.
    slot: Option<Kept<F>>,
    boxes: Arc<TaskBoxes>,
}

impl TaskBoxes {
    pub fn new(most: usize) -> Arc<TaskBoxes> {
        Arc::new(TaskBoxes {
            kept: Mutex::new(Vec::new()),
            most,
        })
    }

    /// The future `build` makes, in a kept box if there is one, else in
    /// a new one it is built for.
    pub fn boxed<F: Send + 'static>(self: &Arc<Self>, build: impl FnOnce() -> F) -> TaskBox<F> {
        let kept = of_type::<F>(&mut lock(&self.kept)).and_then(Vec::pop);
        let slot = match kept {
            Some(mut slot) => {
                debug_assert!(slot.is_none(), "a kept box holds a future");
                // SAFETY: a kept box holds `None` (its task's future was
                // dropped in place before it was kept), so writing over it
                // drops nothing, and its content is replaced where it is,
                // never moved out of its pin. Written without `Pin::set`'s
                // drop of the old value, the future is built in the box,
                // not built beside it and copied in.
                unsafe { std::ptr::write(slot.as_mut().get_unchecked_mut(), Some(build())) };
                slot
            }
            None => Box::into_pin(Box::write(Box::new_uninit(), Some(build()))),
        };
        TaskBox {
            slot: Some(slot),
            boxes: self.clone(),
        }
    }

    /// How many boxes are kept now.
    #[cfg(test)]
    pub fn kept<F: Send + 'static>(&self) -> usize {
        of_type::<F>(&mut lock(&self.kept)).map_or(0, |kept| kept.len())
    }
}

impl<F: Future + Send + 'static> Future for TaskBox<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        match self
            .slot
            .as_mut()
            .and_then(|slot| slot.as_mut().as_pin_mut())
        {
            Some(work) => work.poll(cx),
            // Never: dropped, it is not polled.
            None => Poll::Pending,
        }
    }
}

impl<F: Send + 'static> Drop for TaskBox<F> {
    fn drop(&mut self) {
        let Some(mut slot) = self.slot.take() else {
            return;
        };
        // The future ends here, in place: its box stays pinned.
        slot.as_mut().set(None);
        let mut kept = lock(&self.boxes.kept);
        match of_type::<F>(&mut kept) {
            Some(boxes) if boxes.len() < self.boxes.most => boxes.push(slot),
            // Enough kept: freed, with the lock let go.
            Some(_) => {}
            None => {
                let mut boxes: Vec<Kept<F>> = Vec::with_capacity(self.boxes.most);
                boxes.push(slot);
                kept.push(Box::new(boxes));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A task's future: ends at once with its number, and holds `alive`
    /// until it is dropped.
    struct Job {
        n: u32,
        _alive: Arc<()>,
    }

    impl Future for Job {
        type Output = u32;

        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<u32> {
            Poll::Ready(self.n)
        }
    }

    fn address(boxed: &TaskBox<Job>) -> *const Option<Job> {
        boxed.slot.as_ref().map_or(std::ptr::null(), |slot| &**slot)
    }

    #[tokio::test]
    async fn an_ended_tasks_box_holds_the_next_tasks_future_and_its_own_is_dropped_there() {
        let boxes = TaskBoxes::new(2);
        let alive = Arc::new(());
        let job = |n| {
            let alive = alive.clone();
            move || Job { n, _alive: alive }
        };
        let first = boxes.boxed(job(1));
        let at = address(&first);
        assert!(!at.is_null());
        assert_eq!(first.await, 1);
        // Its future is dropped with it (`.await` drops it), not kept alive
        // in the box.
        assert_eq!(Arc::strong_count(&alive), 1);
        assert_eq!(boxes.kept::<Job>(), 1);

        let second = boxes.boxed(job(2));
        assert_eq!(address(&second), at, "the ended task's box");
        assert_eq!(boxes.kept::<Job>(), 0);
        let third = boxes.boxed(job(3));
        assert_ne!(
            address(&third),
            at,
            "a box of its own while the other is taken"
        );
        assert_eq!((second.await, third.await), (2, 3));
        assert_eq!(Arc::strong_count(&alive), 1);
    }

    #[test]
    fn no_more_boxes_are_kept_than_the_bound() {
        let boxes = TaskBoxes::new(2);
        let alive = Arc::new(());
        let many: Vec<_> = (0..5)
            .map(|n| {
                let alive = alive.clone();
                boxes.boxed(move || Job { n, _alive: alive })
            })
            .collect();
        assert_eq!(Arc::strong_count(&alive), 6);
        // Dropped unpolled (a task cancelled before it ran): the same.
        drop(many);
        assert_eq!(Arc::strong_count(&alive), 1);
        assert_eq!(boxes.kept::<Job>(), 2);
    }

    #[test]
    fn each_future_type_keeps_boxes_of_its_own_whichever_ends_first() {
        let boxes = TaskBoxes::new(2);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // Another type's task (shadow replay's, say) ends first.
        let mut other = boxes.boxed(|| std::future::ready(7u8));
        assert_eq!(Pin::new(&mut other).poll(&mut cx), Poll::Ready(7));
        drop(other);
        assert_eq!(boxes.kept::<std::future::Ready<u8>>(), 1);
        let alive = Arc::new(());
        let alive_in_job = alive.clone();
        let job = boxes.boxed(move || Job {
            n: 1,
            _alive: alive_in_job,
        });
        let at = address(&job);
        drop(job);
        assert_eq!(boxes.kept::<Job>(), 1);
        let again = boxes.boxed(move || Job {
            n: 2,
            _alive: alive,
        });
        assert_eq!(address(&again), at);
        assert_eq!(boxes.kept::<std::future::Ready<u8>>(), 1);
    }
}
