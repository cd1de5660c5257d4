//! How a task ended, as its [`Outcome`]: the race's ending classified, the
//! guest's result or failure read and bounded, and what leaves the sandbox
//! redacted of every secret value.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};
use wasmtime::component::Val;
use wasmtime::component::types::{ResultType, Type};

use super::classify::{Evidence, classify};
use super::convert;
use super::failure::{Failure, FailureClass, Outcome, RetryPolicy};
use super::limits::{Breach, Limits};
use super::secrets::Secrets;
use super::stdio::Capture;
use super::watchdog::Interrupt;
use crate::sync::lock;

/// How the race between the guest, the deadline and cancellation ended.
pub(crate) enum Ended {
    Returned,
    /// Instantiation or the call failed (a trap, a limit, a host call's
    /// error, a value wasmtime could not carry across the boundary).
    Failed(wasmtime::Error),
    DeadlineReached(Duration),
    Interrupted,
}

/// What the classification of an ending reads besides the ending itself.
pub(crate) struct Ending<'a> {
    /// The activity's WIT result type, and the value it returned (if it did).
    pub(crate) result_type: Option<&'a Type>,
    pub(crate) returned: Option<Val>,
    pub(crate) limits: &'a Limits,
    pub(crate) policy: &'a RetryPolicy,
    pub(crate) secrets: &'a Secrets,
    pub(crate) cancelled: bool,
    /// Set when the watchdog stopped the guest inside a host call.
    pub(crate) fired: Option<Interrupt>,
    /// Whether the guest's code ran in its call (see `TaskState::entered`).
    pub(crate) entered: bool,
    /// Which store limit the guest hit, if one.
    pub(crate) breach: Option<&'a Breach>,
    /// The guest's output, whose stderr tail explains a fault (read only
    /// then).
    pub(crate) capture: &'a Mutex<Capture>,
}

/// Classifies how the race ended.
pub(crate) fn classify_ending(ended: Ended, e: Ending<'_>) -> Outcome {
    let policy = e.policy;
    match ended {
        Ended::Returned => {
            let outcome = result_to_outcome(e.result_type, e.returned, e.limits, policy, e.secrets);
            match outcome {
                Err(failure) if e.cancelled && failure.class == FailureClass::Application => {
                    Err(Failure {
                        class: FailureClass::Cancelled,
                        kind: FailureClass::Cancelled.as_str().to_owned(),
                        retryable: policy.retryable(FailureClass::Cancelled),
                        message: format!("cancelled; the guest stopped: {}", failure.message),
                        details: failure.details,
                    })
                }
                other => other,
            }
        }
        Ended::Failed(error) => match e.fired {
            Some(Interrupt::Deadline(limit)) => Err(timeout_failure(limit, policy)),
            Some(Interrupt::Cancel(grace)) => Err(interrupted_failure(grace, policy)),
            None => {
                let evidence = Evidence {
                    breach: e.breach,
                    fuel: e.limits.fuel,
                    max_output: e.limits.max_output,
                    max_handles: e.limits.max_handles,
                    stderr_tail: lock(e.capture).stderr_tail(),
                    handed: e.entered,
                };
                Err(classify(&error, &evidence, policy))
            }
        },
        Ended::DeadlineReached(limit) => Err(timeout_failure(limit, policy)),
        Ended::Interrupted => Err(interrupted_failure(e.limits.cancel_grace, policy)),
    }
}

/// What leaves the sandbox: every secret value redacted, and a failure
/// told which outbound requests corral refused (the guest saw only the
/// standard `wasi:http` error code).
pub(crate) fn finish(outcome: Outcome, secrets: &Secrets, refusals: &[String]) -> Outcome {
    match outcome {
        Ok(mut value) => {
            secrets.redact_json(&mut value);
            Ok(value)
        }
        Err(mut failure) => {
            if !refusals.is_empty() {
                failure.message = format!(
                    "{} (corral refused outbound HTTP: {})",
                    failure.message,
                    refusals.join("; ")
                );
            }
            failure.message = secrets.redact(&failure.message).into_owned();
            if let Some(details) = failure.details.as_mut() {
                secrets.redact_json(details);
            }
            failure.kind = secrets.redact(&failure.kind).into_owned();
            Err(failure)
        }
    }
}

/// The attempt ran past its deadline (found by the executor's race or by
/// the watchdog in a host call: the same failure either way).
fn timeout_failure(limit: Duration, policy: &RetryPolicy) -> Failure {
    Failure::new(
        FailureClass::Timeout,
        policy,
        Interrupt::Deadline(limit).to_string(),
    )
    .with_details(json!({ "limit": "timeout", "value_ms": limit.as_millis() as u64 }))
}

/// A cancelled guest did not stop within its grace period.
fn interrupted_failure(grace: Duration, policy: &RetryPolicy) -> Failure {
    Failure::new(
        FailureClass::Cancelled,
        policy,
        Interrupt::Cancel(grace).to_string(),
    )
}

/// Turns what the guest returned into the outcome.
fn result_to_outcome(
    ty: Option<&Type>,
    val: Option<Val>,
    limits: &Limits,
    policy: &RetryPolicy,
    secrets: &Secrets,
) -> Outcome {
    let invalid = |message: String| Failure::new(FailureClass::InvalidOutput, policy, message);
    // A guest's bytes are redacted before they are encoded as base64.
    let redact = &|bytes: &mut Vec<u8>| secrets.redact_bytes(bytes);
    // (A failure is bounded in `guest_failure`, by its own message.)
    if let Some(val) = &val
        && !matches!(val, Val::Result(Err(_)))
    {
        let least = convert::json_size_at_least(val);
        if least > limits.max_output {
            return Err(invalid(format!(
                "the result is at least {least} bytes, over the limit of {} bytes",
                limits.max_output
            )));
        }
    }
    let value = match (ty, val) {
        (None, _) => Value::Null,
        (Some(Type::Result(result)), Some(Val::Result(returned))) => match returned {
            Ok(ok) => convert::payload_to_json_filtering(result.ok(), ok.map(|v| *v), redact)
                .map_err(|e| invalid(format!("the result {e}")))?,
            Err(err) => {
                return Err(guest_failure(
                    result,
                    err.map(|v| *v),
                    limits,
                    policy,
                    secrets,
                ));
            }
        },
        (Some(ty), Some(val)) => convert::to_json_filtering(ty, val, redact)
            .map_err(|e| invalid(format!("the result {e}")))?,
        (Some(_), None) => return Err(invalid("the guest returned no result".into())),
    };
    let size = json_len(&value);
    if size > limits.max_output {
        return Err(invalid(format!(
            "the result is {size} bytes, over the limit of {} bytes",
            limits.max_output
        )));
    }
    Ok(value)
}

/// A guest's `err(...)`: the `corral:activity/types.failure` record keeps
/// the guest's kind, retryable flag and details; any other error type is a
/// retryable `Application` failure with the error value as details.
fn guest_failure(
    result: &ResultType,
    err: Option<Val>,
    limits: &Limits,
    policy: &RetryPolicy,
    secrets: &Secrets,
) -> Failure {
    let err = match err {
        Some(Val::Record(fields)) => match failure_record(fields) {
            Ok(failure) => return bounded(failure, limits, policy),
            Err(fields) => Some(Val::Record(fields)),
        },
        other => other,
    };
    let redact = &|bytes: &mut Vec<u8>| secrets.redact_bytes(bytes);
    let details = match convert::payload_to_json_filtering(result.err(), err, redact) {
        Ok(details) => details,
        Err(e) => {
            return Failure::new(
                FailureClass::InvalidOutput,
                policy,
                format!("the error value {e}"),
            );
        }
    };
    // Redacted before it is cut: a value spanning the cut would leave its
    // start in the message.
    let mut shown = secrets.redact(&details.to_string()).into_owned();
    if shown.len() > 200 {
        shown = format!("{}…", shown.chars().take(200).collect::<String>());
    }
    Failure::new(
        FailureClass::Application,
        policy,
        format!("the activity returned an error: {shown}"),
    )
    .with_details(details)
}

/// The guest's own failure record, or `InvalidOutput` if it is over the
/// output limit.
fn bounded(failure: Failure, limits: &Limits, policy: &RetryPolicy) -> Failure {
    let size =
        failure.kind.len() + failure.message.len() + failure.details.as_ref().map_or(0, json_len);
    if size > limits.max_output {
        return Failure::new(
            FailureClass::InvalidOutput,
            policy,
            format!(
                "the guest's failure is {size} bytes, over the limit of {} bytes",
                limits.max_output
            ),
        );
    }
    failure
}

/// Reads a `corral:activity/types.failure` record (matched by shape), its
/// strings moved out; any other record is handed back as it was.
fn failure_record(fields: Vec<(String, Val)>) -> Result<Failure, Vec<(String, Val)>> {
    let [message, kind, retryable, details] = <[(String, Val); 4]>::try_from(fields)?;
    let (message, kind, retryable, details) = match (message, kind, retryable, details) {
        (
            (message_name, Val::String(message)),
            (kind_name, Val::String(kind)),
            (retryable_name, Val::Bool(retryable)),
            (details_name, Val::Option(details)),
        ) if (
            message_name.as_str(),
            kind_name.as_str(),
            retryable_name.as_str(),
            details_name.as_str(),
        ) == ("message", "kind", "retryable", "details")
            && matches!(details.as_deref(), None | Some(Val::String(_))) =>
        {
            (message, kind, retryable, details)
        }
        (message, kind, retryable, details) => return Err(vec![message, kind, retryable, details]),
    };
    let details = match details.map(|d| *d) {
        Some(Val::String(text)) => Some(serde_json::from_str(&text).unwrap_or(Value::String(text))),
        _ => None,
    };
    Ok(Failure {
        class: FailureClass::Application,
        kind: if kind.is_empty() {
            "Application".to_owned()
        } else {
            kind
        },
        retryable,
        message,
        details,
    })
}

/// The length of `value` serialized as compact JSON, without building the
/// string: size limits are checked on every task's input and output.
pub(crate) fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` to an infallible writer cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

#[cfg(test)]
mod tests {
    use super::{failure_record, json_len};
    use serde_json::{Value, json};
    use wasmtime::component::Val;

    fn record(names: [&str; 4], details: Option<Val>) -> Vec<(String, Val)> {
        let values = [
            Val::String("declined".into()),
            Val::String("Payment".into()),
            Val::Bool(false),
            Val::Option(details.map(Box::new)),
        ];
        names.map(str::to_owned).into_iter().zip(values).collect()
    }

    #[test]
    fn a_failure_record_moves_its_fields_into_the_failure() {
        let names = ["message", "kind", "retryable", "details"];
        let failure = failure_record(record(names, Some(Val::String(r#"{"a":1}"#.into()))))
            .map_err(|fields| format!("{fields:?}"))
            .unwrap();
        assert_eq!(
            (
                failure.message.as_str(),
                failure.kind.as_str(),
                failure.retryable
            ),
            ("declined", "Payment", false)
        );
        assert_eq!(failure.details, Some(json!({"a": 1})));
        let failure = failure_record(record(names, Some(Val::String("not json".into()))))
            .map_err(|fields| format!("{fields:?}"))
            .unwrap();
        assert_eq!(failure.details, Some(Value::String("not json".into())));
    }

    #[test]
    fn any_other_record_is_handed_back_whole() {
        let renamed = record(["message", "kind", "retry", "details"], None);
        assert_eq!(failure_record(renamed.clone()).err(), Some(renamed));
        let numeric_details = record(
            ["message", "kind", "retryable", "details"],
            Some(Val::U32(7)),
        );
        assert_eq!(
            failure_record(numeric_details.clone()).err(),
            Some(numeric_details)
        );
        let short = vec![("message".to_owned(), Val::String("x".into()))];
        assert_eq!(failure_record(short.clone()).err(), Some(short));
    }

    #[test]
    fn json_len_is_the_compact_serialized_length() {
        for value in [
            json!(null),
            json!("héllo \"x\""),
            json!({"a": [1, 2.5, {"b": null}]}),
        ] {
            assert_eq!(json_len(&value), value.to_string().len());
        }
    }
}
