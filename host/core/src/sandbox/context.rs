//! The per-task store data and the host side of `corral:activity/context`.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_config::WasiConfigVariables;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::http::HttpPolicy;
use super::limits::Limiter;
use super::observer::{LogLevel, TaskObserver};
use super::secrets::Secrets;
use super::stdio::{Capture, MAX_LINE};
use super::task_id::TaskLabels;
use super::watchdog::Watchdog;
use crate::sync::lock;

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "corral:activity/imports",
        imports: { default: trappable },
    });
}

pub(crate) use bindings::corral::activity::context::add_to_linker as add_context_to_linker;
use bindings::corral::activity::{context, types};

/// What the host knows about one attempt of an activity.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskInfo {
    pub tenant: String,
    pub activity_id: String,
    pub workflow_id: Option<String>,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// JSON details of the last heartbeat of the previous attempt (text:
    /// held for the attempt's life, a tree could be dozens of times its
    /// size).
    pub last_heartbeat: Option<HeartbeatDetails>,
    /// The caller's W3C `traceparent`, when the engine carried one: the
    /// task's span is its child.
    pub traceparent: Option<String>,
}

/// A heartbeat's details as the engine gets them (and gives back to the
/// next attempt): compact JSON text, made only from a JSON value (so
/// always valid), a guest's already redacted. Kept and
/// shared as text: the tree a guest's details parse to can be dozens of
/// times their size, and each beat would copy it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatDetails(Arc<str>);

impl HeartbeatDetails {
    pub fn of(details: &Value) -> HeartbeatDetails {
        HeartbeatDetails(details.to_string().into())
    }

    /// The JSON text.
    pub fn json(&self) -> &str {
        &self.0
    }
}

/// A guest broke the host contract in a way that is its output's fault
/// (e.g. heartbeat details that are not JSON): reported as `InvalidOutput`.
#[derive(Debug)]
pub struct ContractViolation(pub String);

impl fmt::Display for ContractViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ContractViolation {}

/// Everything one task's store holds. Nothing in it outlives the task, but
/// for a warm instance's resource table, which the next task takes over
/// when it holds only the guest's output streams (see `execute`).
pub(crate) struct TaskState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) http: WasiHttpCtx,
    /// Where this task's `wasi:http` requests may go.
    pub(crate) http_policy: HttpPolicy,
    /// What `wasi:config/store` answers.
    pub(crate) config: Arc<WasiConfigVariables>,
    /// The tenant's secrets: redacted from what the guest hands the host.
    pub(crate) secrets: Arc<Secrets>,
    pub(crate) limiter: Limiter,
    pub(crate) capture: Arc<Mutex<Capture>>,
    /// The attempt, moved from the task: `info()` builds the guest's
    /// record from it only when the guest asks.
    pub(crate) info: TaskInfo,
    pub(crate) cancel: CancellationToken,
    pub(crate) observer: Arc<dyn TaskObserver>,
    pub(crate) heartbeats: u32,
    pub(crate) max_details: usize,
    pub(crate) labels: Arc<TaskLabels>,
    pub(crate) watchdog: Watchdog,
    /// Whether the guest's code has run in its call (its export, or its
    /// `realloc` asked for room for the arguments; not what instantiation
    /// ran): set by the call hook, read only to classify an error that has
    /// no trap and no frame.
    pub(crate) entered: bool,
}

impl TaskState {
    /// What the guest's `info()` returns for this attempt.
    fn activity_info(&self) -> types::ActivityInfo {
        let info = &self.info;
        types::ActivityInfo {
            activity_type: self.labels.activity_type.to_string(),
            activity_id: info.activity_id.clone(),
            workflow_id: info.workflow_id.clone(),
            attempt: info.attempt,
            tenant: info.tenant.clone(),
            deadline_unix_ms: self.watchdog.deadline().map(unix_ms),
            last_heartbeat: info.last_heartbeat.as_ref().map(|d| d.json().to_owned()),
        }
    }
}

/// The wall-clock time of `at`, in milliseconds since the Unix epoch:
/// worked out only when a guest asks, not for every task.
fn unix_ms(at: Instant) -> u64 {
    let (now, wall) = (Instant::now(), SystemTime::now());
    let wall_at = if at >= now {
        wall.checked_add(at - now)
    } else {
        wall.checked_sub(now - at)
    };
    wall_at
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}

impl WasiView for TaskState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for TaskState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_policy,
        }
    }
}

impl types::Host for TaskState {}

impl context::Host for TaskState {
    fn info(&mut self) -> wasmtime::Result<types::ActivityInfo> {
        Ok(self.activity_info())
    }

    fn heartbeat(&mut self, details: Option<String>) -> wasmtime::Result<()> {
        let details = match details {
            None => None,
            Some(text) if text.len() > self.max_details => {
                return Err(wasmtime::Error::new(ContractViolation(format!(
                    "heartbeat details of {} bytes exceed the limit of {} bytes",
                    text.len(),
                    self.max_details
                ))));
            }
            Some(text) => {
                let mut details = serde_json::from_str::<Value>(&text).map_err(|e| {
                    wasmtime::Error::new(ContractViolation(format!(
                        "heartbeat details are not valid JSON: {e}"
                    )))
                })?;
                self.secrets.redact_json(&mut details);
                Some(details)
            }
        };
        self.heartbeats += 1;
        self.observer.heartbeat(self.heartbeats, details.as_ref());
        Ok(())
    }

    fn is_cancelled(&mut self) -> wasmtime::Result<bool> {
        Ok(self.cancel.is_cancelled())
    }

    fn log(&mut self, level: context::Level, message: String) -> wasmtime::Result<()> {
        if !lock(&self.capture).admit(message.len()) {
            return Ok(());
        }
        let message = self.secrets.redact(&message);
        let level = match level {
            context::Level::Trace => LogLevel::Trace,
            context::Level::Debug => LogLevel::Debug,
            context::Level::Info => LogLevel::Info,
            context::Level::Warn => LogLevel::Warn,
            context::Level::Error => LogLevel::Error,
        };
        let TaskLabels {
            tenant,
            activity_type,
            activity_id,
        } = &*self.labels;
        macro_rules! emit {
            ($lvl:ident, $piece:expr) => {
                tracing::$lvl!(target: "corral::guest", %tenant, %activity_type, %activity_id, "{}", crate::shown::Escaped($piece))
            };
        }
        // Redacted whole (above), then split as output lines are: no host
        // log line is longer than MAX_LINE of the guest's text.
        for piece in pieces(&message, MAX_LINE) {
            match level {
                LogLevel::Trace => emit!(trace, piece),
                LogLevel::Debug => emit!(debug, piece),
                LogLevel::Info => emit!(info, piece),
                LogLevel::Warn => emit!(warn, piece),
                LogLevel::Error => emit!(error, piece),
            }
        }
        self.observer.log(level, &message);
        Ok(())
    }
}

/// `text` in pieces of at most `max` bytes, cut at character boundaries
/// (one empty piece for an empty text: an empty message is still a line).
fn pieces(text: &str, max: usize) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let text = rest?;
        if text.len() <= max {
            rest = None;
            return Some(text);
        }
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        rest = Some(&text[end..]);
        Some(&text[..end])
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_long_log_message_is_written_in_pieces_at_character_boundaries() {
        let text = format!("{}é{}", "a".repeat(5), "b".repeat(6));
        let cut: Vec<&str> = pieces(&text, 6).collect();
        assert_eq!(cut, ["aaaaa", "ébbbb", "bb"]);
        assert_eq!(pieces("", 6).collect::<Vec<_>>(), [""]);
        assert!(pieces(&"x".repeat(1 << 20), 4096).all(|p| p.len() <= 4096));
    }

    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use super::{pieces, unix_ms};

    #[test]
    fn unix_ms_is_the_wall_clock_time_of_an_instant_ahead_or_behind() {
        let minute = Duration::from_secs(60);
        let wall_ms = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        let ahead = unix_ms(Instant::now() + minute);
        assert!(
            ahead.abs_diff(wall_ms(SystemTime::now() + minute)) < 1_000,
            "{ahead}"
        );
        if let Some(past) = Instant::now().checked_sub(minute) {
            let behind = unix_ms(past);
            assert!(
                behind.abs_diff(wall_ms(SystemTime::now() - minute)) < 1_000,
                "{behind}"
            );
        }
    }
}
