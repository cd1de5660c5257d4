//! A loaded component (compiled, linked, its activity types found), why a
//! component does not load, and what a load checks of its bytes and
//! imports. Loading itself is the sandbox's (`load`).

use std::fmt;
use std::path::Path;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, InstancePre};

use super::compile::{CompileError, MAX_REASON};
use super::context::TaskState;
use super::signature::{ActivityType, UnsupportedExport};
use crate::shown::Shown;

/// A component ready to run tasks: compiled, linked, its exports indexed.
#[derive(Clone)]
pub struct LoadedComponent {
    /// `sha256:<hex>` of the component bytes.
    pub digest: String,
    pub activities: Vec<ActivityType>,
    /// Exported functions that cannot be activity types, with the reason.
    pub unsupported: Vec<UnsupportedExport>,
    /// Every import, by name.
    pub imports: Vec<String>,
    /// Whether the compiled code came from the on-disk cache.
    pub from_cache: bool,
    pub(crate) pre: InstancePre<TaskState>,
    /// Which compilation this is, never reused by another: what a warm
    /// instance is an instance of (see `warm`).
    pub(crate) id: u64,
}

/// The next [`LoadedComponent::id`].
pub(super) static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl fmt::Debug for LoadedComponent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedComponent")
            .field("digest", &self.digest)
            .field(
                "activities",
                &self.activities.iter().map(|a| &a.name).collect::<Vec<_>>(),
            )
            .field("from_cache", &self.from_cache)
            .finish_non_exhaustive()
    }
}

impl LoadedComponent {
    /// The compiled wasmtime component.
    pub fn component(&self) -> &Component {
        self.pre.component()
    }

    /// The activity type called `name`.
    pub fn activity(&self, name: &str) -> Option<&ActivityType> {
        self.activities.iter().find(|a| *a.name == *name)
    }
}

/// Why a component was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    NotWasm,
    CoreModule,
    Invalid(String),
    UnsatisfiedImports(Vec<String>),
    Link(String),
    NoActivities(Vec<UnsupportedExport>),
    Io(String),
    /// Compiling in the worker failed or passed its limits.
    Compile(CompileError),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NotWasm => f.write_str("not a WebAssembly binary (no `\\0asm` header)"),
            LoadError::CoreModule => f.write_str(
                "this is a core WebAssembly module, not a component: build for \
                 `wasm32-wasip2`, or wrap it with `wasm-tools component new`",
            ),
            LoadError::Invalid(reason) | LoadError::Compile(CompileError::Invalid(reason)) => {
                write!(f, "invalid component: {}", Shown(reason, MAX_REASON))
            }
            LoadError::UnsatisfiedImports(names) => {
                f.write_str("the component imports what this host does not provide: ")?;
                let shown: Vec<String> = names
                    .iter()
                    .take(MAX_LISTED_EXPORTS)
                    .map(|n| format!("`{}`", super::classify::shown_name(n)))
                    .collect();
                f.write_str(&shown.join(", "))?;
                match names.len().checked_sub(MAX_LISTED_EXPORTS) {
                    Some(more) if more > 0 => write!(f, " and {more} more"),
                    _ => Ok(()),
                }
            }
            LoadError::Link(reason) => {
                write!(
                    f,
                    "the component's imports do not match the host: {}",
                    Shown(reason, MAX_REASON)
                )
            }
            LoadError::NoActivities(unsupported) => {
                f.write_str("the component exports no function usable as an activity type")?;
                for u in unsupported.iter().take(MAX_LISTED_EXPORTS) {
                    let name = super::classify::shown_name(&u.name);
                    write!(f, "; `{name}`: {}", u.reason)?;
                }
                if let Some(more) = unsupported.len().checked_sub(MAX_LISTED_EXPORTS)
                    && more > 0
                {
                    write!(f, "; and {more} more")?;
                }
                Ok(())
            }
            LoadError::Io(reason) => write!(f, "{reason}"),
            LoadError::Compile(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for LoadError {}

/// The WASI 0.2 interfaces every guest may import (any 0.2.x version). What
/// they can do is decided per tenant at run time (sockets are denied,
/// directories only as granted).
const BASE_WASI: &[&str] = &[
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:clocks/monotonic-clock",
    "wasi:clocks/wall-clock",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:sockets/network",
    "wasi:sockets/instance-network",
    "wasi:sockets/tcp",
    "wasi:sockets/tcp-create-socket",
    "wasi:sockets/udp",
    "wasi:sockets/udp-create-socket",
    "wasi:sockets/ip-name-lookup",
    // Loaded for every tenant; each request is checked against the
    // tenant's `http_hosts` (none: every request is denied in the guest).
    "wasi:http/outgoing-handler",
    "wasi:http/types",
];

const CORRAL: &[&str] = &["corral:activity/context", "corral:activity/types"];

/// `wasi:config/store`, at the one version wasmtime implements.
const CONFIG: &str = "wasi:config/store@0.2.0-rc.1";

/// Whether the host links an import of this name.
pub(super) fn is_linked(import: &str) -> bool {
    let (name, version) = import.split_once('@').unwrap_or((import, ""));
    (BASE_WASI.contains(&name) && version.starts_with("0.2."))
        || (CORRAL.contains(&name) && version.starts_with("0.1."))
        || import == CONFIG
}

/// Imports or exports a load error lists before "and N more".
const MAX_LISTED_EXPORTS: usize = 20;

/// Checks the header: a component, not a core module or something else.
pub(super) fn check_header(header: &[u8]) -> Result<(), LoadError> {
    match header {
        [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, ..] => Err(LoadError::CoreModule),
        [0x00, 0x61, 0x73, 0x6d, _, _, 0x01, 0x00, ..] => Ok(()),
        [0x00, 0x61, 0x73, 0x6d, ..] => Err(LoadError::Invalid(
            "unknown WebAssembly version or layer".into(),
        )),
        _ => Err(LoadError::NotWasm),
    }
}

/// The SHA-256 of a file, read in pieces.
pub(super) fn file_digest(path: &Path) -> std::io::Result<(String, [u8; 8])> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut header = [0u8; 8];
    let mut buffer = vec![0u8; 64 << 10];
    let mut seen = 0usize;
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        if seen < header.len() {
            let take = (header.len() - seen).min(n);
            header[seen..seen + take].copy_from_slice(&buffer[..take]);
        }
        seen = seen.saturating_add(n);
        hasher.update(&buffer[..n]);
    }
    Ok((format!("sha256:{}", hex::encode(hasher.finalize())), header))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wasi_0_2_any_patch_and_corral_0_1_are_linked() {
        assert!(is_linked("wasi:io/streams@0.2.0"));
        assert!(is_linked("wasi:sockets/tcp@0.2.9"));
        assert!(is_linked("corral:activity/context@0.1.0"));
        assert!(is_linked("wasi:http/outgoing-handler@0.2.0"));
        assert!(!is_linked("wasi:http/incoming-handler@0.2.0"));
        assert!(!is_linked("wasi:io/streams@0.3.0"));
        assert!(!is_linked("acme:secret/vault@1.0.0"));
    }
}
