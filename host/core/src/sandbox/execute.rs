//! Running one task: a fresh store and instance per task, limits applied,
//! the call raced against its deadline and cancellation, and however it
//! ends classified into an [`Outcome`].

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use smallvec::SmallVec;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use wasmtime::component::types::{ResultType, Type};
use wasmtime::component::{ResourceTable, Val};
use wasmtime::{AsContext as _, CallHook, Store, UpdateDeadline};
use wasmtime_wasi_http::WasiHttpCtx;

use super::classify::{Evidence, classify, listed_names, shown_name};
use super::component::LoadedComponent;
use super::context::{TaskInfo, TaskState};
use super::convert::{self, from_json, to_json};
use super::engine::Sandbox;
use super::failure::{Failure, FailureClass, Outcome, RetryPolicy};
use super::http::HttpPolicy;
use super::limits::{Limiter, Limits};
use super::observer::{Stream, TaskObserver, Unobserved};
use super::secrets::Secrets;
use super::stdio::{Capture, GuestOutput, TaskLabels};
use super::tenant::PreparedTenant;
use super::watchdog::{Interrupt, Verdict, Watchdog};
use crate::sync::lock;
use crate::trace::PHASES;

/// One attempt of an activity to run.
pub struct Task {
    /// The activity type's full name (aliases already resolved).
    pub activity_type: String,
    /// One JSON value per WIT parameter.
    pub args: Vec<Value>,
    pub info: TaskInfo,
    /// The engine's deadline for this attempt; the tighter of it and the
    /// tenant's timeout applies.
    pub deadline: Option<Duration>,
    /// Cancelling makes `is-cancelled` true at once; after the tenant's
    /// grace period the instance is interrupted.
    pub cancel: CancellationToken,
    pub observer: Arc<dyn TaskObserver>,
}

impl Task {
    /// A first attempt with no engine deadline and nobody observing.
    pub fn new(activity_type: impl Into<String>, args: Vec<Value>) -> Self {
        Task {
            activity_type: activity_type.into(),
            args,
            info: TaskInfo {
                attempt: 1,
                ..TaskInfo::default()
            },
            deadline: None,
            cancel: CancellationToken::new(),
            observer: UNOBSERVED.clone(),
        }
    }
}

/// One observer for every unobserved task, not one allocation per task.
static UNOBSERVED: LazyLock<Arc<dyn TaskObserver>> = LazyLock::new(|| Arc::new(Unobserved));

/// How the race between the guest, the deadline and cancellation ended.
enum Ended {
    Returned(wasmtime::Result<()>),
    DeadlineReached(Duration),
    Interrupted,
}

impl Sandbox {
    /// Runs one task to its classified outcome. Never panics on anything a
    /// guest or its input can do; the instance is gone when this returns.
    pub async fn execute(
        &self,
        component: &LoadedComponent,
        tenant: &PreparedTenant,
        task: Task,
    ) -> Outcome {
        let policy = &tenant.retry;
        let limits = &tenant.limits;
        let Some(activity) = component.activity(&task.activity_type) else {
            // The names are the guest's: bounded in number and length.
            let known = listed_names(component.activities.iter().map(|a| &*a.name));
            return Err(Failure::new(
                FailureClass::UnknownActivity,
                policy,
                format!(
                    "no activity type `{}` in component {} (it has: {known})",
                    shown_name(&task.activity_type),
                    component.digest,
                ),
            ));
        };
        let invalid_input =
            |message: String| Failure::new(FailureClass::InvalidInput, policy, message);
        if task.args.len() != activity.params.len() {
            return Err(invalid_input(format!(
                "`{}` takes {} argument(s), {}, but got {}",
                activity.name,
                activity.params.len(),
                activity.signature(),
                task.args.len()
            )));
        }
        let input_size: usize = task.args.iter().map(json_len).sum();
        if input_size > limits.max_input {
            return Err(invalid_input(format!(
                "the input is {input_size} bytes, over the limit of {} bytes",
                limits.max_input
            )));
        }
        // On the stack for the usual few parameters; a string, the
        // commonest, moves into its value instead of being copied.
        let mut params = SmallVec::<[Val; 4]>::with_capacity(task.args.len());
        for ((name, ty), arg) in activity.params.iter().zip(task.args) {
            let val = match (ty, arg) {
                (Type::String, Value::String(text)) => Ok(Val::String(text)),
                (ty, arg) => from_json(ty, &arg),
            };
            match val {
                Ok(val) => params.push(val),
                Err(e) => return Err(invalid_input(format!("parameter `{name}`: {e}"))),
            }
        }

        let timeout = match (task.deadline, limits.timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // Shared by the output capture, the HTTP policy and the store.
        let labels = Arc::new(TaskLabels {
            tenant: tenant.label.clone(),
            activity_type: activity.name.clone(),
            // Chosen by whoever started the activity: escaped and bounded.
            activity_id: crate::shown::shown(&task.info.activity_id, crate::shown::MAX_NAME),
        });
        let secrets = tenant.capabilities.secrets.clone();
        let capture = Capture::new(
            labels.clone(),
            task.observer.clone(),
            secrets.clone(),
            limits.max_stdio,
        );
        let wasi = match tenant.wasi_ctx(
            GuestOutput::new(Stream::Stdout, &capture),
            GuestOutput::new(Stream::Stderr, &capture),
        ) {
            Ok(wasi) => wasi,
            Err(e) => return Err(Failure::new(FailureClass::Host, policy, e.to_string())),
        };
        let started = Instant::now();
        // Counted in: idle pool memory is never released under a task.
        let _running = self.activity.enter(started).await;
        let mut table = ResourceTable::new();
        table.set_max_capacity(limits.max_handles);
        let state = TaskState {
            wasi,
            table,
            http: WasiHttpCtx::new(),
            http_policy: HttpPolicy::new(
                tenant.capabilities.http_hosts.clone(),
                secrets.clone(),
                limits.max_http_requests,
                limits.max_http_bytes,
                labels.clone(),
            ),
            config: tenant.config_vars(),
            secrets: secrets.clone(),
            limiter: Limiter::new(limits),
            capture: capture.clone(),
            info: task.info,
            cancel: task.cancel.clone(),
            observer: task.observer.clone(),
            heartbeats: 0,
            max_details: limits.max_output,
            labels,
            watchdog: Watchdog::new(started, timeout, limits.cancel_grace),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.limiter);
        // What the guest may hand the host in one call (a result, heartbeat
        // details, a log line, a write) is bounded before the host lifts it:
        // one lifted value per byte of the output limit, so no output that
        // fits `max_output` is refused here.
        store.set_hostcall_fuel(hostcall_fuel(limits.max_output));
        // Deadlines and cancels hold inside host calls too, and a guest
        // living in host calls still yields: see `watchdog`.
        store.call_hook(|mut store, hook| {
            if !matches!(hook, CallHook::CallingHost) {
                return Ok(());
            }
            let state = store.data_mut();
            let cancelled = state.cancel.is_cancelled();
            match state.watchdog.on_host_call(Instant::now(), cancelled) {
                Verdict::Continue => Ok(()),
                Verdict::Yield => {
                    // A hook may not touch the store's own deadline: move
                    // the engine's epoch past every running store's, and
                    // this store's callback (below) yields.
                    store.as_context().engine().increment_epoch();
                    Ok(())
                }
                Verdict::Stop(interrupt) => Err(wasmtime::Error::new(interrupt)),
            }
        });
        // Only a watchdog's yield advances the engine's epoch, so a store's
        // deadline of one tick is reached only then: the store that asked
        // yields, any other running store checks its own watchdog and goes
        // on (a flag read). The callback captures nothing: no allocation.
        store.epoch_deadline_callback(|mut store| {
            Ok(if store.data_mut().watchdog.take_yield() {
                UpdateDeadline::Yield(1)
            } else {
                UpdateDeadline::Continue(1)
            })
        });
        store.set_epoch_deadline(1);
        // The tenant's CPU budget, and a yield to the runtime every so much
        // fuel: this is what lets the deadline and cancellation below end a
        // guest that never returns, and keeps one busy guest from starving
        // everything else.
        if let Err(e) = store
            .set_fuel(limits.fuel.unwrap_or(u64::MAX))
            .and_then(|()| store.fuel_async_yield_interval(Some(self.config.yield_every_fuel)))
        {
            return Err(Failure::new(
                FailureClass::Host,
                policy,
                format!("setting fuel: {e:#}"),
            ));
        }

        let mut result = [Val::Bool(false)];
        let results = &mut result[..usize::from(activity.result.is_some())];
        let observer = task.observer.clone();
        let ended = {
            let call = async {
                let instance = component
                    .pre
                    .instantiate_async(&mut store)
                    .instrument(tracing::debug_span!(target: PHASES, "instantiate"))
                    .await?;
                observer.instantiated(started.elapsed());
                let func = instance
                    .get_func(&mut store, activity.export)
                    .ok_or_else(|| {
                        wasmtime::Error::msg(format!("export `{}` vanished", activity.name))
                    })?;
                func.call_async(&mut store, &params, results)
                    .instrument(tracing::debug_span!(target: PHASES, "guest"))
                    .await
            };
            let deadline = async {
                match timeout {
                    Some(t) => tokio::time::sleep_until((started + t).into()).await,
                    None => std::future::pending().await,
                }
            };
            let interrupt = async {
                task.cancel.cancelled().await;
                tokio::time::sleep(limits.cancel_grace).await;
            };
            tokio::select! {
                biased;
                returned = call => Ended::Returned(returned),
                () = deadline => Ended::DeadlineReached(timeout.unwrap_or_default()),
                () = interrupt => Ended::Interrupted,
            }
        };
        lock(&capture).finish();

        let outcome = match ended {
            Ended::Returned(Ok(())) => {
                // The returned value moves into the outcome: a result's
                // strings are not copied.
                let returned = results
                    .first_mut()
                    .map(|val| std::mem::replace(val, Val::Bool(false)));
                let outcome =
                    result_to_outcome(activity.result.as_ref(), returned, limits, policy, &secrets);
                match outcome {
                    Err(failure)
                        if task.cancel.is_cancelled()
                            && failure.class == FailureClass::Application =>
                    {
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
            Ended::Returned(Err(error)) => match store.data().watchdog.fired {
                Some(Interrupt::Deadline(limit)) => Err(timeout_failure(limit, policy)),
                Some(Interrupt::Cancel(grace)) => Err(interrupted_failure(grace, policy)),
                None => {
                    let tail = lock(&capture).stderr_tail();
                    let evidence = Evidence {
                        breach: store.data().limiter.breach.as_ref(),
                        fuel: limits.fuel,
                        max_output: limits.max_output,
                        max_handles: limits.max_handles,
                        stderr_tail: tail,
                    };
                    Err(classify(&error, &evidence, policy))
                }
            },
            Ended::DeadlineReached(limit) => Err(timeout_failure(limit, policy)),
            Ended::Interrupted => Err(interrupted_failure(limits.cancel_grace, policy)),
        };
        let refusals = store.data().http_policy.refusals();
        finish(outcome, &secrets, &refusals)
    }
}

/// What leaves the sandbox: every secret value redacted, and a failure
/// told which outbound requests corral refused (the guest saw only the
/// standard `wasi:http` error code).
fn finish(outcome: Outcome, secrets: &Secrets, refusals: &[String]) -> Outcome {
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

/// Hostcall fuel for an output limit: wasmtime charges the lifted size of
/// what a guest passes the host (a `Val` per element, a byte per byte of a
/// string), and every element of a JSON output is at least a byte of it.
fn hostcall_fuel(max_output: usize) -> usize {
    max_output.saturating_mul(size_of::<Val>())
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
            Ok(ok) => convert::payload_to_json(result.ok(), ok.map(|v| *v))
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
        (Some(ty), Some(val)) => {
            to_json(ty, val).map_err(|e| invalid(format!("the result {e}")))?
        }
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
    let details = match convert::payload_to_json(result.err(), err) {
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
    let size = failure.message.len() + failure.details.as_ref().map_or(0, json_len);
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
fn json_len(value: &Value) -> usize {
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
