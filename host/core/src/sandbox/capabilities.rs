//! What a guest may reach, deny by default: directories only as explicitly
//! granted preopens, an explicit environment (nothing inherited from the
//! host), no stdin, no sockets, outbound HTTP only to granted hosts.
//! Clocks and random are always available.
//!
//! A tenant's policy is checked and its directories opened once
//! ([`Sandbox::prepare`](super::Sandbox::prepare)); each task then builds its
//! cheap WASI context from that.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use super::destination::HttpGrant;
use super::secrets::Secrets;

/// How a granted directory may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirMode {
    ReadOnly,
    ReadWrite,
}

/// A host directory visible to the guest at `guest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirGrant {
    pub host: PathBuf,
    pub guest: String,
    pub mode: DirMode,
}

/// Why a `HOST:GUEST[:ro|rw]` text is not a directory grant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirGrantError {
    #[error("`{0}` is not a directory grant: write HOST:GUEST[:ro|rw]")]
    Shape(String),
    #[error("`{text}`: unknown mode `{mode}` (use ro or rw)")]
    Mode { text: String, mode: String },
}

impl FromStr for DirGrant {
    type Err = DirGrantError;

    /// `HOST:GUEST[:ro|rw]`; read-only unless `rw` is given.
    fn from_str(text: &str) -> Result<Self, DirGrantError> {
        let usage = || DirGrantError::Shape(text.to_owned());
        let mut parts = text.split(':');
        let (Some(host), Some(guest)) = (parts.next(), parts.next()) else {
            return Err(usage());
        };
        let mode = match parts.next() {
            None | Some("ro") => DirMode::ReadOnly,
            Some("rw") => DirMode::ReadWrite,
            Some(other) => {
                return Err(DirGrantError::Mode {
                    text: text.to_owned(),
                    mode: other.to_owned(),
                });
            }
        };
        if host.is_empty() || guest.is_empty() || parts.next().is_some() {
            return Err(usage());
        }
        Ok(DirGrant {
            host: PathBuf::from(host),
            guest: guest.to_owned(),
            mode,
        })
    }
}

/// A tenant's capability policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub dirs: Vec<DirGrant>,
    /// The guest's whole environment.
    pub env: Vec<(String, String)>,
    /// Where the guest may send HTTP requests (`wasi:http`); every request
    /// is denied when empty.
    pub http_hosts: Arc<[HttpGrant]>,
    /// What the guest reads through `wasi:config/store`.
    pub config: Arc<BTreeMap<String, String>>,
    /// Secrets the guest sees only as placeholders (in `config` and the
    /// environment, under the secret's name).
    pub secrets: Arc<Secrets>,
}

/// Most random bytes one `wasi:random` call may ask for (wasmtime's default
/// is 64 MiB, built in host memory before the guest sees a byte). Language
/// runtimes ask for a few dozen bytes at a time.
pub(crate) const MAX_RANDOM_BYTES: u64 = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_grants_parse_with_read_only_default() {
        let grant: DirGrant = "./data:/data".parse().unwrap();
        assert_eq!(grant.host, PathBuf::from("./data"));
        assert_eq!(grant.guest, "/data");
        assert_eq!(grant.mode, DirMode::ReadOnly);
        let rw: DirGrant = "/tmp/x:/out:rw".parse().unwrap();
        assert_eq!(rw.mode, DirMode::ReadWrite);
        let err = "/tmp".parse::<DirGrant>().unwrap_err();
        assert_eq!(err, DirGrantError::Shape("/tmp".into()));
        assert!(err.to_string().contains("HOST:GUEST"), "{err}");
        let err = "/a:/b:rx".parse::<DirGrant>().unwrap_err();
        assert!(err.to_string().contains("unknown mode `rx`"), "{err}");
    }
}
