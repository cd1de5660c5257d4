//! Deadlines and cancels that hold whatever the guest does.
//!
//! The executor races the guest's call against its deadline and its cancel,
//! but that race is only looked at when the guest's future yields. Fuel makes
//! a busy guest yield every so many wasm instructions; a guest that spends
//! its time inside host calls (random bytes, heartbeats, stdout writes)
//! burns almost no fuel, so without this it never yielded: it ran past its
//! deadline for as long as it liked and held a runtime thread that polling,
//! heartbeats and the admin API need.
//!
//! The watchdog closes that gap at the one place every such guest must pass:
//! each call from the guest into the host. There it
//! - stops the guest once its deadline has passed, or once a cancel's grace
//!   period has run out (so a deadline holds within one host call);
//! - makes the guest yield to the runtime at its next epoch check (a loop
//!   header or function entry) once it has run for a time slice without
//!   yielding. A call hook may not change its store's epoch deadline
//!   (wasmtime 50), so the hook advances the engine's epoch instead: every
//!   running store's one-tick deadline is reached, the store that asked
//!   yields, the others read a flag and go on. Nothing else advances the
//!   epoch, so a task that never needs a yield never sees its callback.
//!
//! It costs one clock read per host call; no thread, no timer.

use std::time::{Duration, Instant};

/// How long a guest may run inside host calls before it is made to yield to
/// the runtime: about what the fuel interval gives a busy wasm loop.
pub(crate) const TIME_SLICE: Duration = Duration::from_millis(1);

/// Why the watchdog stopped a guest. Classified exactly as when the
/// executor's own race ends the call: a `Timeout` or a `Cancelled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Interrupt {
    #[error("the attempt ran past its deadline of {0:?} and was interrupted")]
    Deadline(Duration),
    #[error("cancelled; the guest did not stop within the {0:?} grace period and was interrupted")]
    Cancel(Duration),
}

/// What the guest may do after a host call was checked.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Continue,
    /// Yield to the runtime at the next wasm instruction, then continue.
    Yield,
    Stop(Interrupt),
}

/// One task's watchdog, kept in its store.
pub(crate) struct Watchdog {
    /// When the deadline passes, and the limit it came from.
    deadline: Option<(Instant, Duration)>,
    grace: Duration,
    /// When a host call first saw the cancel.
    cancel_seen: Option<Instant>,
    /// When the guest is next made to yield.
    next_yield: Instant,
    /// A yield was asked for and the guest has not yielded yet.
    yield_pending: bool,
    /// Why the guest was stopped, if it was: the evidence classification
    /// reads (a guest may catch nothing, but its language runtime may turn
    /// the trap into something else on the way out).
    pub(crate) fired: Option<Interrupt>,
}

impl Watchdog {
    pub(crate) fn new(started: Instant, timeout: Option<Duration>, grace: Duration) -> Self {
        Watchdog {
            deadline: timeout.map(|t| (started + t, t)),
            grace,
            cancel_seen: None,
            next_yield: started + TIME_SLICE,
            yield_pending: false,
            fired: None,
        }
    }

    /// When the task's deadline passes, if it has one.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline.map(|(at, _)| at)
    }

    /// Checks the task at a call from the guest into the host, at `now`,
    /// with the task `cancelled` or not.
    pub(crate) fn on_host_call(&mut self, now: Instant, cancelled: bool) -> Verdict {
        if let Some(interrupt) = self.fired {
            return Verdict::Stop(interrupt);
        }
        if let Some((at, limit)) = self.deadline
            && now >= at
        {
            return self.stop(Interrupt::Deadline(limit));
        }
        if cancelled {
            let seen = *self.cancel_seen.get_or_insert(now);
            if now >= seen + self.grace {
                return self.stop(Interrupt::Cancel(self.grace));
            }
        }
        if now >= self.next_yield {
            self.next_yield = now + TIME_SLICE;
            self.yield_pending = true;
            return Verdict::Yield;
        }
        Verdict::Continue
    }

    /// Whether the guest owes a yield (asked for at a host call), clearing
    /// it: read at the guest's next epoch check.
    pub(crate) fn take_yield(&mut self) -> bool {
        std::mem::take(&mut self.yield_pending)
    }

    fn stop(&mut self, interrupt: Interrupt) -> Verdict {
        self.fired = Some(interrupt);
        Verdict::Stop(interrupt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_stops_the_guest_at_the_first_host_call_past_it() {
        let start = Instant::now();
        let mut dog = Watchdog::new(start, Some(Duration::from_secs(3)), Duration::from_secs(1));
        assert_eq!(dog.on_host_call(start, false), Verdict::Continue);
        let late = start + Duration::from_secs(3);
        let stop = Verdict::Stop(Interrupt::Deadline(Duration::from_secs(3)));
        assert_eq!(dog.on_host_call(late, false), stop);
        // And every host call after it, as the trap unwinds.
        assert_eq!(dog.on_host_call(start, false), stop);
        assert_eq!(dog.fired, Some(Interrupt::Deadline(Duration::from_secs(3))));
    }

    #[test]
    fn a_cancel_stops_the_guest_once_its_grace_has_run_out() {
        let start = Instant::now();
        let grace = Duration::from_millis(500);
        let mut dog = Watchdog::new(start, None, grace);
        let seen = start + Duration::from_millis(10);
        assert_eq!(dog.on_host_call(seen, true), Verdict::Yield);
        assert_eq!(
            dog.on_host_call(seen + Duration::from_millis(499), true),
            Verdict::Yield
        );
        assert_eq!(
            dog.on_host_call(seen + grace, true),
            Verdict::Stop(Interrupt::Cancel(grace))
        );
    }

    #[test]
    fn a_guest_in_host_calls_yields_once_per_time_slice() {
        let start = Instant::now();
        let mut dog = Watchdog::new(start, None, Duration::ZERO);
        assert_eq!(dog.on_host_call(start, false), Verdict::Continue);
        let slice = start + TIME_SLICE;
        assert_eq!(dog.on_host_call(slice, false), Verdict::Yield);
        assert_eq!(dog.on_host_call(slice, false), Verdict::Continue);
        assert_eq!(dog.on_host_call(slice + TIME_SLICE, false), Verdict::Yield);
    }
}
