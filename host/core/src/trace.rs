//! Joining a task's spans to a distributed trace without tying the harness
//! to a tracing backend: the harness makes `tracing` spans (a `task` span,
//! with `permits`, `instantiate`, `guest` and one `http` span per outbound
//! request under it); a host that exports them (corral's OpenTelemetry
//! layer) installs a [`Propagation`] that parents the task span on the
//! caller's W3C `traceparent` and writes one for each outbound request.

use std::sync::OnceLock;

use tracing::Span;

/// What a host that exports spans does with W3C trace context.
pub trait Propagation: Send + Sync {
    /// Makes `span` a child of the remote span `traceparent` names.
    fn adopt(&self, span: &Span, traceparent: &str);
    /// The `traceparent` naming `span`, for an outbound request.
    fn traceparent(&self, span: &Span) -> Option<String>;
}

/// The target of a task's phase spans (`permits`, `instantiate`, `guest`),
/// made at `debug`: a log filtered at `info` makes none of them, which
/// spares every task the cost of three spans it would never show (a tenth
/// of a Rust task's time in the sandbox bench), while an exporter lets
/// this target through at `debug` to draw the task's phases.
pub const PHASES: &str = "corral::phase";

static PROPAGATION: OnceLock<Box<dyn Propagation>> = OnceLock::new();

/// Installs the process's propagation, once (like the global `tracing`
/// subscriber it goes with); false when one was already installed.
pub fn install(propagation: Box<dyn Propagation>) -> bool {
    PROPAGATION.set(propagation).is_ok()
}

pub(crate) fn adopt(span: &Span, traceparent: &str) {
    if let Some(p) = PROPAGATION.get() {
        p.adopt(span, traceparent);
    }
}

pub(crate) fn traceparent(span: &Span) -> Option<String> {
    PROPAGATION.get().and_then(|p| p.traceparent(span))
}
