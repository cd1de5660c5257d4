//! What a running task tells the outside world while it runs: progress
//! heartbeats, log lines and captured output. The session loop forwards
//! them to an engine; the test harness records them.

use std::fmt;

use serde::Serialize;
use serde_json::Value;

/// Severity of a guest log line (`corral:activity/context.level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        })
    }
}

/// Which guest output stream a captured line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        })
    }
}

/// Receives a task's events as they happen, on the thread running the guest:
/// implementations must be quick and must not block.
pub trait TaskObserver: Send + Sync {
    /// The guest recorded progress; `count` is 1 for the first heartbeat of
    /// the attempt. `details` has been checked to be JSON within the size
    /// limit.
    fn heartbeat(&self, count: u32, details: Option<&Value>) {
        let _ = (count, details);
    }

    /// The guest logged a line through `corral:activity/context.log`.
    fn log(&self, level: LogLevel, message: &str) {
        let _ = (level, message);
    }

    /// A line the guest wrote to stdout or stderr (within the output budget).
    fn output(&self, stream: Stream, line: &str) {
        let _ = (stream, line);
    }

    /// The task's instance exists; creating it took `took`.
    fn instantiated(&self, took: std::time::Duration) {
        let _ = took;
    }

    /// The task runs in a warm instance, which ran `tasks` tasks before it
    /// (its tenant reuses instances): nothing was instantiated.
    fn reused(&self, tasks: u32) {
        let _ = tasks;
    }

    /// The task ended having written `bytes` more output (or log text) than
    /// its budget allowed; that output was dropped.
    fn output_dropped(&self, bytes: u64) {
        let _ = bytes;
    }
}

/// An observer that ignores everything (events still reach `tracing`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Unobserved;

impl TaskObserver for Unobserved {}
