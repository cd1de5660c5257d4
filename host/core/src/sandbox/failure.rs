//! The failure taxonomy: every way a task can end that is not a success maps
//! to exactly one [`FailureClass`], with a stable kind string, a retryable
//! flag from the tenant's [`RetryPolicy`] and a message an operator can act on.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The classes of DESIGN.md's failure taxonomy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FailureClass {
    /// The guest returned `err(...)`.
    Application,
    /// An `unreachable` trap, which is how a Rust panic (or `abort`) ends.
    Panic,
    /// Any other guest fault: out-of-bounds access, division by zero, stack
    /// overflow, a bad indirect call, or `exit` called by the guest.
    Trap,
    /// A memory, table or instance limit, or the fuel budget, was exceeded.
    ResourceExhausted,
    /// The wall-clock deadline of the attempt was reached.
    Timeout,
    /// The engine or the host cancelled the task and the guest stopped.
    Cancelled,
    /// The input payload does not fit the WIT types, or is too large.
    InvalidInput,
    /// The guest produced output (result or heartbeat) that is invalid or too
    /// large.
    InvalidOutput,
    /// No component serves this activity type for this tenant.
    UnknownActivity,
    /// A host-side fault: I/O, an exhausted instance pool, an instantiation
    /// error.
    Host,
}

impl FailureClass {
    /// Every class, in taxonomy order.
    pub const ALL: [FailureClass; 10] = [
        FailureClass::Application,
        FailureClass::Panic,
        FailureClass::Trap,
        FailureClass::ResourceExhausted,
        FailureClass::Timeout,
        FailureClass::Cancelled,
        FailureClass::InvalidInput,
        FailureClass::InvalidOutput,
        FailureClass::UnknownActivity,
        FailureClass::Host,
    ];

    /// The stable name of the class, also the `kind` of every failure of the
    /// class except `Application` (whose kind the guest chooses).
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Application => "Application",
            FailureClass::Panic => "Panic",
            FailureClass::Trap => "Trap",
            FailureClass::ResourceExhausted => "ResourceExhausted",
            FailureClass::Timeout => "Timeout",
            FailureClass::Cancelled => "Cancelled",
            FailureClass::InvalidInput => "InvalidInput",
            FailureClass::InvalidOutput => "InvalidOutput",
            FailureClass::UnknownActivity => "UnknownActivity",
            FailureClass::Host => "Host",
        }
    }

    /// DESIGN.md's documented retryable default for the class. For
    /// `Application` this is the default for error types other than the
    /// `corral:activity/types.failure` record, which carries its own flag.
    pub fn default_retryable(self) -> bool {
        match self {
            FailureClass::Application
            | FailureClass::Timeout
            | FailureClass::UnknownActivity
            | FailureClass::Host => true,
            FailureClass::Panic
            | FailureClass::Trap
            | FailureClass::ResourceExhausted
            | FailureClass::Cancelled
            | FailureClass::InvalidInput
            | FailureClass::InvalidOutput => false,
        }
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a failure of each class may be retried: tenant policy, with
/// DESIGN.md's defaults. A guest's own `failure.retryable` always wins for
/// `Application` failures that carry one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetryPolicy {
    overrides: BTreeMap<FailureClass, bool>,
}

impl RetryPolicy {
    /// Overrides the default for one class.
    pub fn set(&mut self, class: FailureClass, retryable: bool) -> &mut Self {
        self.overrides.insert(class, retryable);
        self
    }

    /// Whether a failure of `class` is retryable under this policy.
    pub fn retryable(&self, class: FailureClass) -> bool {
        self.overrides
            .get(&class)
            .copied()
            .unwrap_or_else(|| class.default_retryable())
    }
}

/// A classified failure, ready to report to an engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub class: FailureClass,
    /// Stable machine-readable type: the class name, or the guest's own kind
    /// for `Application` failures.
    pub kind: String,
    pub retryable: bool,
    pub message: String,
    /// Extra detail as JSON: the guest's details, the trap code and wasm
    /// backtrace, or the limit that was hit.
    pub details: Option<Value>,
}

impl Failure {
    /// A failure of `class` whose kind is the class name and whose retryable
    /// flag comes from `policy`.
    pub fn new(class: FailureClass, policy: &RetryPolicy, message: impl Into<String>) -> Self {
        Failure {
            class,
            kind: class.as_str().to_owned(),
            retryable: policy.retryable(class),
            message: message.into(),
            details: None,
        }
    }

    /// Attaches JSON details.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// The `--json` shape of `corral run`:
    /// `{"class":…,"kind":…,"retryable":…,"message":…,"details":…}`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "class": self.class.as_str(),
            "kind": self.kind,
            "retryable": self.retryable,
            "message": self.message,
            "details": self.details,
        })
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let retry = if self.retryable {
            "retryable"
        } else {
            "non-retryable"
        };
        write!(
            f,
            "{} ({}, {retry}): {}",
            self.class, self.kind, self.message
        )
    }
}

/// How a task ended: the result as JSON, or a classified failure.
pub type Outcome = Result<Value, Failure>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_design_table() {
        let policy = RetryPolicy::default();
        let retryable: Vec<_> = FailureClass::ALL
            .into_iter()
            .filter(|c| policy.retryable(*c))
            .map(FailureClass::as_str)
            .collect();
        assert_eq!(
            retryable,
            ["Application", "Timeout", "UnknownActivity", "Host"]
        );
    }

    #[test]
    fn a_policy_override_changes_only_its_class() {
        let mut policy = RetryPolicy::default();
        policy.set(FailureClass::Trap, true);
        policy.set(FailureClass::Timeout, false);
        assert!(policy.retryable(FailureClass::Trap));
        assert!(!policy.retryable(FailureClass::Timeout));
        assert!(!policy.retryable(FailureClass::Panic));
        let failure = Failure::new(FailureClass::Trap, &policy, "x");
        assert!(failure.retryable);
        assert_eq!(failure.kind, "Trap");
    }
}
