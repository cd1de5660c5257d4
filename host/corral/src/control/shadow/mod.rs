//! Shadow replay: a tenant's recorded attempts, and the policy that says
//! which it keeps.
//!
//! A tenant's `rollout.shadow` names the activity types whose real
//! attempts are recorded (see `corral_core::sandbox::shadow` for what an
//! attempt holds, and why no secret is in it). [`Samples`] keeps, per
//! tenant, the newest `sample` attempts of each type, none older than
//! `expire`, in at most `max_bytes` and never more than what the tenant's
//! `max_stored` leaves beside its stored versions: a sample never takes
//! the room a version needs. It is written to the data directory every 5
//! seconds while it changes and when the host stops, and read back at
//! start. A candidate version replays the sample before it serves
//! (`catalog::replay`).

mod report;
mod samples;

use std::collections::BTreeSet;
use std::time::Duration;

pub use report::{KEPT_DIFFERENCES, ReplayReport, TypeReplay};
pub use samples::{Samples, TypeSample};

use corral_core::shown::shown;

/// A tenant's shadow policy, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shadow {
    /// The activity types recorded; `*` records every type.
    types: BTreeSet<String>,
    sample: u32,
    expire: Duration,
    max_bytes: u64,
    min_agreement: Option<u32>,
}

/// A shadow policy out of its bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShadowError {
    #[error("types: name at least one activity type (or `*` for every type)")]
    NoTypes,
    #[error("types: `{}` is not an activity type's name", shown(.0, 64))]
    Type(String),
    #[error("sample: from 1 to {MAX_SAMPLE} attempts per type, got {0}")]
    Sample(u32),
    #[error("expire: from 1m to 30d, got {0:?}")]
    Expire(Duration),
    #[error("max_bytes: from 64 KiB to 256 MiB, got {0}")]
    MaxBytes(u64),
    #[error("min_agreement: a percentage from 0 to 100, got {0}")]
    MinAgreement(u32),
}

const MAX_SAMPLE: u32 = 1000;
/// Attempts kept per type when the policy does not say.
pub const DEFAULT_SAMPLE: u32 = 50;
/// How long an attempt is kept when the policy does not say.
pub const DEFAULT_EXPIRE: Duration = Duration::from_secs(24 * 3600);
/// The bytes a tenant's sample may take when the policy does not say.
pub const DEFAULT_MAX_BYTES: u64 = 16 * 1024 * 1024;

impl Shadow {
    pub fn new<S: AsRef<str>>(
        types: &[S],
        sample: u32,
        expire: Duration,
        max_bytes: u64,
        min_agreement: Option<u32>,
    ) -> Result<Shadow, ShadowError> {
        if types.is_empty() {
            return Err(ShadowError::NoTypes);
        }
        let types: BTreeSet<String> = types.iter().map(|t| t.as_ref().to_owned()).collect();
        if let Some(bad) = types
            .iter()
            .find(|t| t.is_empty() || t.len() > 256 || t.chars().any(char::is_control))
        {
            return Err(ShadowError::Type(bad.clone()));
        }
        if !(1..=MAX_SAMPLE).contains(&sample) {
            return Err(ShadowError::Sample(sample));
        }
        if expire < Duration::from_secs(60) || expire > Duration::from_secs(30 * 24 * 3600) {
            return Err(ShadowError::Expire(expire));
        }
        if !(64 * 1024..=256 << 20).contains(&max_bytes) {
            return Err(ShadowError::MaxBytes(max_bytes));
        }
        if let Some(m) = min_agreement.filter(|m| *m > 100) {
            return Err(ShadowError::MinAgreement(m));
        }
        Ok(Shadow {
            types,
            sample,
            expire,
            max_bytes,
            min_agreement,
        })
    }

    /// Whether attempts of `activity_type` are recorded.
    pub fn records(&self, activity_type: &str) -> bool {
        self.types.contains("*") || self.types.contains(activity_type)
    }

    pub fn sample(&self) -> u32 {
        self.sample
    }

    pub fn expire(&self) -> Duration {
        self.expire
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The percent of a type's replayed attempts a candidate must agree
    /// on to activate by itself.
    pub fn min_agreement(&self) -> Option<u32> {
        self.min_agreement
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_out_of_bounds_is_named() {
        let day = DEFAULT_EXPIRE;
        let ok = Shadow::new(&["shout"], 10, day, DEFAULT_MAX_BYTES, Some(90)).unwrap();
        assert!(ok.records("shout") && !ok.records("other"));
        assert!(
            Shadow::new(&["*"], 10, day, DEFAULT_MAX_BYTES, None)
                .unwrap()
                .records("any")
        );
        let err = |r: Result<Shadow, ShadowError>| r.unwrap_err().to_string();
        let none: [&str; 0] = [];
        assert!(err(Shadow::new(&none, 10, day, DEFAULT_MAX_BYTES, None)).contains("at least one"));
        assert!(err(Shadow::new(&["a\nb"], 10, day, DEFAULT_MAX_BYTES, None)).contains("\\n"));
        assert!(err(Shadow::new(&["a"], 0, day, DEFAULT_MAX_BYTES, None)).contains("got 0"));
        assert!(err(Shadow::new(&["a"], 1001, day, DEFAULT_MAX_BYTES, None)).contains("1001"));
        let second = Duration::from_secs(1);
        assert!(err(Shadow::new(&["a"], 1, second, DEFAULT_MAX_BYTES, None)).contains("expire"));
        assert!(err(Shadow::new(&["a"], 1, day, 10, None)).contains("max_bytes"));
        assert!(err(Shadow::new(&["a"], 1, day, DEFAULT_MAX_BYTES, Some(101))).contains("101"));
    }
}
