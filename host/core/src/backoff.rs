//! Capped exponential backoff, for every retry loop in corral: reconnecting
//! to an engine, polling it, reporting to it, accepting connections.

use std::time::Duration;

/// Waits that start at `first` and double up to `max`; [`Backoff::reset`]
/// after a success starts again from `first`.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    upcoming: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max,
            upcoming: first,
        }
    }

    /// The wait the next [`Backoff::next`] returns.
    pub fn upcoming(&self) -> Duration {
        self.upcoming
    }

    /// The next wait; the one after it is twice as long, up to the cap.
    pub fn advance(&mut self) -> Duration {
        let wait = self.upcoming;
        self.upcoming = (wait * 2).min(self.max);
        wait
    }

    /// Sleeps the next wait.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.advance()).await;
    }

    pub fn reset(&mut self) {
        self.upcoming = self.first;
    }
}

/// What one try of [`patiently`] found.
pub enum Try<T, E> {
    Done(T),
    /// Worth trying again (the other side is not up yet).
    Again(E),
    /// Trying again changes nothing.
    Fail(E),
}

/// Tries until `attempt` is done or fails for good, waiting with `backoff`
/// between tries while another try still fits in `patience`; `waiting`
/// hears of each transient failure and the wait before the next try. The
/// last transient failure is the error once patience runs out.
pub async fn patiently<T, E, F>(
    patience: Duration,
    mut backoff: Backoff,
    mut attempt: impl FnMut() -> F,
    waiting: impl Fn(&E, Duration),
) -> Result<T, E>
where
    F: std::future::Future<Output = Try<T, E>>,
{
    // The runtime's clock, which its sleeps follow.
    let started = tokio::time::Instant::now();
    loop {
        match attempt().await {
            Try::Done(value) => return Ok(value),
            Try::Again(e) if started.elapsed() + backoff.upcoming() < patience => {
                waiting(&e, backoff.upcoming());
                backoff.wait().await;
            }
            Try::Again(e) | Try::Fail(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_and_reset_to_the_first() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let waits: Vec<u128> = (0..4).map(|_| backoff.advance().as_millis()).collect();
        assert_eq!(waits, [100, 200, 350, 350]);
        backoff.reset();
        assert_eq!(backoff.upcoming(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn patience_retries_transient_failures_only_while_a_try_fits() {
        let tries = std::cell::Cell::new(0);
        let backoff = || Backoff::new(Duration::from_secs(1), Duration::from_secs(1));
        let attempt = || {
            tries.set(tries.get() + 1);
            async { Try::<(), _>::Again("down") }
        };
        let e = patiently(Duration::from_millis(3500), backoff(), attempt, |_, _| {}).await;
        assert_eq!(
            (e, tries.get()),
            (Err("down"), 4),
            "tries at 0, 1, 2 and 3 s"
        );

        tries.set(0);
        let refused = || {
            tries.set(tries.get() + 1);
            async { Try::<(), _>::Fail("refused") }
        };
        let e = patiently(Duration::from_secs(60), backoff(), refused, |_, _| {}).await;
        assert_eq!((e, tries.get()), (Err("refused"), 1));

        let up = || async { Try::<_, &str>::Done(7) };
        assert_eq!(
            patiently(Duration::ZERO, backoff(), up, |_, _| {}).await,
            Ok(7)
        );
    }
}
