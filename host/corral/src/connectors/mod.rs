//! Engine connectors: each turns one engine's protocol into the session
//! loop's [`Connector`](corral_core::session::Connector) trait.

pub mod aion;
pub use corral_core::local;
pub mod temporal;

/// Most of an engine's or the network's text (a status, a refusal, a poll
/// error) the host's log keeps of one error, escaped.
const MAX_LOGGED: usize = 1024;

/// The identity this process reports to engines: `corral@<host>:<pid>`.
pub fn identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("corral@{host}:{}", std::process::id())
}
