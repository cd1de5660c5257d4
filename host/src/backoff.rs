//! Capped exponential backoff, for every retry loop in corral: reconnecting
//! to an engine, polling it, reporting to it, accepting connections.

use std::time::Duration;

/// Waits that start at `first` and double up to `max`; [`Backoff::reset`]
/// after a success starts again from `first`.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    upcoming: Duration,
}

impl Backoff {
    pub(crate) fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max,
            upcoming: first,
        }
    }

    /// The wait the next [`Backoff::next`] returns.
    pub(crate) fn upcoming(&self) -> Duration {
        self.upcoming
    }

    /// The next wait; the one after it is twice as long, up to the cap.
    pub(crate) fn next(&mut self) -> Duration {
        let wait = self.upcoming;
        self.upcoming = (wait * 2).min(self.max);
        wait
    }

    /// Sleeps the next wait.
    pub(crate) async fn wait(&mut self) {
        tokio::time::sleep(self.next()).await;
    }

    pub(crate) fn reset(&mut self) {
        self.upcoming = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_and_reset_to_the_first() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let waits: Vec<u128> = (0..4).map(|_| backoff.next().as_millis()).collect();
        assert_eq!(waits, [100, 200, 350, 350]);
        backoff.reset();
        assert_eq!(backoff.upcoming(), Duration::from_millis(100));
    }
}
