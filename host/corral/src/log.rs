//! corral's own log: text or JSON lines on stderr, filtered by `CORRAL_LOG`,
//! with room for a layer beside it (the OTLP export) that filters alone.

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer, Registry};

/// What a server logs by default. wasmtime's WASI crates warn about what
/// a guest did wrong (a malformed request, …), as often as the guest likes:
/// only their errors reach the host's log. A task's phase spans (target
/// `corral::phase`, at `debug`) are left out: `CORRAL_LOG=corral=debug`
/// shows them.
pub const SERVER_LOG: &str = "warn,corral=info,wasmtime_wasi=error,wasmtime_wasi_http=error";
/// What the other commands log by default.
pub const CLI_LOG: &str = "warn,wasmtime_wasi=error,wasmtime_wasi_http=error";

/// Logs go to stderr, as text or (for log collectors) JSON lines.
pub fn init_tracing(default_filter: &str, json: bool) {
    init_tracing_with(default_filter, json, None);
}

/// The log `corral serve` starts with (text on stderr, filtered by
/// `CORRAL_LOG` or [`SERVER_LOG`]): the benches run under it, so that what
/// corral logs and the spans it makes cost what they cost in the binary.
pub fn init_server_log() {
    init_tracing(SERVER_LOG, false);
}

/// A layer with a filter of its own beside the log (the OTLP export).
pub type ExtraLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// [`init_tracing`], with `extra` beside the log: `CORRAL_LOG` filters the
/// log only, so a quiet log does not silence the export.
pub fn init_tracing_with(default_filter: &str, json: bool, extra: Option<ExtraLayer>) {
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("CORRAL_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter))
    };
    let log = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(extra);
    if json {
        registry.with(log.json().with_filter(filter())).init();
    } else {
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        registry
            .with(log.with_ansi(ansi).with_filter(filter()))
            .init();
    }
}

#[cfg(test)]
mod tests {
    use super::SERVER_LOG;
    use corral_core::trace::PHASES;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::{EnvFilter, Layer};

    /// A task's phase spans cost a tenth of a small task when a subscriber
    /// records them: `corral serve`'s log must not, and the export must.
    #[test]
    fn the_server_log_leaves_the_phase_spans_out_and_the_export_takes_them() {
        let log = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::sink)
                .with_filter(EnvFilter::new(SERVER_LOG)),
        );
        tracing::subscriber::with_default(log, || {
            let phase = tracing::debug_span!(target: PHASES, "guest");
            assert!(phase.is_disabled(), "{phase:?}");
            // The same log still records corral's own info spans.
            let task = tracing::info_span!(target: "corral_core::session::task", "task");
            assert!(!task.is_disabled(), "{task:?}");
        });
        let exported = crate::telemetry::exported();
        assert!(exported.would_enable(PHASES, &tracing::Level::DEBUG));
        assert!(exported.would_enable("corral_core::session", &tracing::Level::INFO));
        assert!(!exported.would_enable("corral_core::session", &tracing::Level::DEBUG));
    }
}
