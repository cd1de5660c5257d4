//! `demo:progress`: heartbeats with details, resumption from the previous
//! attempt's last heartbeat, and cooperative cancellation.

use std::time::Duration;

use corral_guest::Failure;
use serde::{Deserialize, Serialize};

corral_guest::generate!("demo:progress/progress");

use exports::demo::progress::api::Guest;

#[derive(Serialize, Deserialize)]
struct Progress {
    done: u32,
}

struct Counter;

impl Guest for Counter {
    fn count_to(target: u32, step_ms: u32) -> Result<u32, Failure> {
        let start = corral_guest::last_heartbeat::<Progress>().map_or(1, |p| p.done + 1);
        if start > 1 {
            corral_guest::log::info(&format!("resuming at {start}"));
        }
        for i in start..=target {
            if corral_guest::is_cancelled() {
                return Err(Failure::cancelled().with_details(&Progress { done: i - 1 }));
            }
            std::thread::sleep(Duration::from_millis(u64::from(step_ms)));
            corral_guest::heartbeat(&Progress { done: i })
                .map_err(|e| Failure::new("Serialize", e.to_string()))?;
        }
        Ok(target)
    }

    fn succeed_on_attempt(succeed_on: u32) -> Result<u32, Failure> {
        let attempt = corral_guest::info().attempt;
        if attempt < succeed_on {
            return Err(Failure::new(
                "NotYet",
                format!("attempt {attempt} of {succeed_on}"),
            ));
        }
        Ok(attempt)
    }
}

export!(Counter);
