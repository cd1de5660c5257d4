//! corral's own log: text or JSON lines on stderr, filtered by `CORRAL_LOG`,
//! with room for a layer beside it (the OTLP export) that filters alone.

use std::io::Write;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::{Layer, Registry};

/// What a server logs by default. wasmtime's WASI crates warn about what
/// a guest did wrong (a malformed request, …), as often as the guest likes,
/// and `oci-client` about what a registry sent (a token it cannot read,
/// quoted whole: megabytes, a credential's claims): only their errors
/// reach the host's log. A task's phase spans (target `corral::phase`, at
/// `debug`) are left out: `CORRAL_LOG=corral=debug` shows them.
pub const SERVER_LOG: &str =
    "warn,corral=info,wasmtime_wasi=error,wasmtime_wasi_http=error,oci_client=error";
/// What the other commands log by default.
pub const CLI_LOG: &str = "warn,wasmtime_wasi=error,wasmtime_wasi_http=error,oci_client=error";

/// The most one log line takes, whatever logged it. corral bounds what it
/// logs of a guest's, a registry's or a network's text itself (4 KiB
/// pieces, 300-byte quotes); this bounds what another crate logs, at any
/// `CORRAL_LOG`.
pub const MAX_LINE: usize = 16 << 10;

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
    let log = tracing_subscriber::fmt::layer().with_writer(Bounded { json });
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

/// stderr, each event cut to [`MAX_LINE`] (the log's layer writes an
/// event in one write).
#[derive(Clone, Copy)]
struct Bounded {
    /// JSON lines: a cut event is still one.
    json: bool,
}

impl<'a> MakeWriter<'a> for Bounded {
    type Writer = Bounded;

    fn make_writer(&'a self) -> Bounded {
        *self
    }
}

impl Write for Bounded {
    fn write(&mut self, event: &[u8]) -> std::io::Result<usize> {
        let mut stderr = std::io::stderr().lock();
        if event.len() <= MAX_LINE {
            stderr.write_all(event)?;
        } else {
            stderr.write_all(cut(event, self.json).as_bytes())?;
        }
        Ok(event.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// An event too long to log: its start and its length, as one line (JSON
/// when the log is).
fn cut(event: &[u8], json: bool) -> String {
    // Room for the note and, in JSON, the start's escapes (at most six
    // bytes each: `\u001b`).
    let room = if json { MAX_LINE / 6 } else { MAX_LINE } - 128;
    let mut end = room.min(event.len());
    while end > 0 && event.get(end).is_some_and(|b| b & 0xc0 == 0x80) {
        end -= 1;
    }
    let start = String::from_utf8_lossy(&event[..end]);
    if json {
        // The event's own time and level (tracing's JSON writes them
        // first), so that the line sorts and filters with the others.
        let level = leading(&start, "level")
            .filter(|l| ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(l))
            .unwrap_or("WARN");
        let mut line = serde_json::json!({
            "level": level,
            "target": "corral::log",
            "fields": {
                "message": format!("a log event of {} bytes, cut", event.len()),
                "start": start,
            },
        });
        let time = leading(&start, "timestamp").filter(|t| {
            t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-:.+".contains(&b))
        });
        if let Some(time) = time {
            line["timestamp"] = time.into();
        }
        format!("{line}\n")
    } else {
        format!("{start}… [a log event of {} bytes, cut]\n", event.len())
    }
}

/// The string value of `field` at the start of a JSON event, where
/// tracing writes its own fields: a guest's text comes later, and escaped,
/// so it cannot be taken for one.
fn leading<'a>(event: &'a str, field: &str) -> Option<&'a str> {
    let head = event.get(..LEADING).unwrap_or(event);
    let key = format!("\"{field}\":\"");
    let at = head.find(&key)? + key.len();
    let len = head.get(at..)?.find('"')?;
    head.get(at..at + len)
}

/// How far into an event [`leading`] looks.
const LEADING: usize = 128;

#[cfg(test)]
mod tests {
    use super::{Bounded, MAX_LINE, SERVER_LOG, cut};
    use corral_core::trace::PHASES;
    use std::io::Write as _;
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

    #[test]
    fn a_log_event_is_cut_to_the_line_bound_and_stays_one_line_of_its_format() {
        let event = format!("WARN other: {}\n", "é\u{1b}".repeat(MAX_LINE));
        let text = cut(event.as_bytes(), false);
        assert!(text.len() <= MAX_LINE, "{} bytes", text.len());
        assert_eq!(text.matches('\n').count(), 1);
        assert!(text.starts_with("WARN other: é"), "{text:.40}");
        assert!(text.ends_with(&format!("[a log event of {} bytes, cut]\n", event.len())));
        let json = cut(event.as_bytes(), true);
        assert!(json.len() <= MAX_LINE, "{} bytes", json.len());
        assert_eq!(json.matches('\n').count(), 1);
        let line: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert!(
            line["fields"]["start"]
                .as_str()
                .unwrap()
                .starts_with("WARN other: é")
        );
        // A JSON event's own time and level are kept; text that only
        // looks like them, later in it, is not taken for them.
        let event = format!(
            "{{\"timestamp\":\"2026-12-05T10:00:00.123456Z\",\"level\":\"INFO\",\"fields\":{{\"message\":\"{}\"}}}}\n",
            "x".repeat(MAX_LINE)
        );
        let line: serde_json::Value = serde_json::from_str(&cut(event.as_bytes(), true)).unwrap();
        assert_eq!(line["timestamp"], "2026-12-05T10:00:00.123456Z");
        assert_eq!(line["level"], "INFO");
        let forged = format!(
            "{{\"fields\":{{\"message\":\"\\\"timestamp\\\":\\\"forged\\\"{}\"}}}}\n",
            "x".repeat(MAX_LINE)
        );
        let line: serde_json::Value = serde_json::from_str(&cut(forged.as_bytes(), true)).unwrap();
        assert_eq!(
            (line.get("timestamp"), &line["level"]),
            (None, &serde_json::json!("WARN"))
        );
        // Short events pass whole.
        let mut writer = Bounded { json: false };
        assert_eq!(writer.write(b"short\n").unwrap(), 6);
    }
}
