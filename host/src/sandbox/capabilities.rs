//! What a guest may reach, deny by default: directories only as explicitly
//! granted preopens, an explicit environment (nothing inherited from the
//! host), no stdin, no sockets, outbound HTTP only to granted hosts.
//! Clocks and random are always available.
//!
//! A tenant's policy is validated once ([`Capabilities::validate`]); each
//! task then builds its cheap WASI context from it.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder};

use super::http::HttpHost;
use super::stdio::GuestOutput;

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

impl FromStr for DirGrant {
    type Err = String;

    /// `HOST:GUEST[:ro|rw]`; read-only unless `rw` is given.
    fn from_str(text: &str) -> Result<Self, String> {
        let usage = || format!("`{text}` is not a directory grant: write HOST:GUEST[:ro|rw]");
        let mut parts = text.split(':');
        let (Some(host), Some(guest)) = (parts.next(), parts.next()) else {
            return Err(usage());
        };
        let mode = match parts.next() {
            None | Some("ro") => DirMode::ReadOnly,
            Some("rw") => DirMode::ReadWrite,
            Some(other) => return Err(format!("`{text}`: unknown mode `{other}` (use ro or rw)")),
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
    /// Where the guest may send HTTP requests (`wasi:http`); none when
    /// empty, and a component importing `wasi:http` is then refused.
    pub http_hosts: Arc<[HttpHost]>,
}

/// The import prefix that needs an `http_hosts` grant.
/// Most random bytes one `wasi:random` call may ask for (wasmtime's default
/// is 64 MiB, built in host memory before the guest sees a byte). Language
/// runtimes ask for a few dozen bytes at a time.
pub(crate) const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// A policy that cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError(pub String);

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PolicyError {}

impl Capabilities {
    /// Checks the policy once, before any task runs, so that no policy error
    /// can surface mid-task: every granted host directory exists, guest
    /// paths are absolute and distinct, env names are well-formed.
    pub fn validate(&self) -> Result<(), PolicyError> {
        for (i, grant) in self.dirs.iter().enumerate() {
            let meta = std::fs::metadata(&grant.host).map_err(|e| {
                PolicyError(format!(
                    "granted directory `{}` cannot be opened: {e}",
                    grant.host.display()
                ))
            })?;
            if !meta.is_dir() {
                return Err(PolicyError(format!(
                    "granted path `{}` is not a directory",
                    grant.host.display()
                )));
            }
            if !grant.guest.starts_with('/') {
                return Err(PolicyError(format!(
                    "guest path `{}` must be absolute (e.g. /data)",
                    grant.guest
                )));
            }
            if self.dirs[..i].iter().any(|g| g.guest == grant.guest) {
                return Err(PolicyError(format!(
                    "guest path `{}` is granted twice",
                    grant.guest
                )));
            }
        }
        for (name, _) in &self.env {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err(PolicyError(format!(
                    "environment variable name `{name}` is not valid"
                )));
            }
        }
        Ok(())
    }

    /// The WASI context of one task. Sockets: TCP and UDP are off and no
    /// address passes the check; name lookup is off.
    pub(crate) fn wasi_ctx(
        &self,
        stdout: GuestOutput,
        stderr: GuestOutput,
    ) -> Result<WasiCtx, PolicyError> {
        let mut builder = WasiCtxBuilder::new();
        builder
            .stdout(stdout)
            .stderr(stderr)
            .envs(&self.env)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            // The host builds random bytes in full before the guest gets
            // them: a guest may not make it build more than this at once.
            .max_random_size(MAX_RANDOM_BYTES)
            .socket_addr_check(|_, _| Box::pin(async { false }));
        for grant in &self.dirs {
            let perms = match grant.mode {
                DirMode::ReadOnly => FsPerms::ReadOnly,
                DirMode::ReadWrite => FsPerms::ReadWrite,
            };
            builder
                .preopened_dir(&grant.host, &grant.guest, perms)
                .map_err(|e| {
                    PolicyError(format!(
                        "granted directory `{}` cannot be opened: {e}",
                        grant.host.display()
                    ))
                })?;
        }
        Ok(builder.build())
    }
}

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
        assert!(
            "/tmp"
                .parse::<DirGrant>()
                .unwrap_err()
                .contains("HOST:GUEST")
        );
        assert!(
            "/a:/b:rx"
                .parse::<DirGrant>()
                .unwrap_err()
                .contains("unknown mode `rx`")
        );
    }

    #[test]
    fn validation_names_the_bad_grant() {
        let missing = Capabilities {
            dirs: vec!["/no/such/dir:/data".parse().unwrap()],
            env: vec![],
            ..Capabilities::default()
        };
        let err = missing.validate().unwrap_err().to_string();
        assert!(err.contains("/no/such/dir"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().display().to_string();
        let relative = Capabilities {
            dirs: vec![format!("{host}:data").parse().unwrap()],
            env: vec![],
            ..Capabilities::default()
        };
        assert!(
            relative
                .validate()
                .unwrap_err()
                .0
                .contains("must be absolute")
        );

        let twice = Capabilities {
            dirs: vec![
                format!("{host}:/d").parse().unwrap(),
                format!("{host}:/d:rw").parse().unwrap(),
            ],
            env: vec![],
            ..Capabilities::default()
        };
        assert!(twice.validate().unwrap_err().0.contains("granted twice"));

        let env = Capabilities {
            dirs: vec![],
            env: vec![("A=B".into(), "x".into())],
            ..Capabilities::default()
        };
        assert!(env.validate().unwrap_err().0.contains("`A=B`"));
    }
}
