//! The persistent component store under `[host] data_dir`:
//!
//! ```text
//! data_dir/
//!   index.json              tenants' versions and which one is active
//!   components/<hex>.wasm   the uploaded bytes, by SHA-256
//!   compiled/               precompiled artifacts (the sandbox's cache)
//! ```
//!
//! Every write is atomic (temporary file, fsync, rename, fsync of the
//! directory), and a component's bytes are written before the index that
//! names them, so a crash at any point leaves the old state or the new one,
//! never an index that names missing bytes.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

mod index;

pub use super::rollout::StoredCanary;
pub use index::{FindError, Index, StoredReuse, TenantIndex, Version};

use crate::staging::{StagedComponent, Staging};
use index::FORMAT;

/// A data directory that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("data directory `{}`: {what}", dir.display())]
    Io {
        dir: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("data directory `{}`: index.json is unreadable", dir.display())]
    Unreadable {
        dir: PathBuf,
        source: serde_json::Error,
    },
    #[error(
        "data directory `{dir}`: index.json: format {found} is not the format this corral reads ({FORMAT})"
    )]
    Format { dir: PathBuf, found: u32 },
}

/// Where the index and the bytes live; `None` keeps everything in memory
/// (a host without `data_dir`, which then has no admin API).
#[derive(Debug, Clone)]
pub struct Store {
    dir: Option<PathBuf>,
}

impl Store {
    pub fn in_memory() -> Self {
        Store { dir: None }
    }

    /// Opens (creating if needed) a data directory and reads its index. A
    /// corrupt index is an error: the host must not start and silently
    /// serve nothing.
    pub fn open(dir: &Path) -> Result<(Store, Index), OpenError> {
        let io = |what: &'static str| {
            move |source| OpenError::Io {
                dir: dir.to_owned(),
                what,
                source,
            }
        };
        // Owner-only: the index and the components are tenants' (a config
        // value, a label), and the directory holds the recordings too.
        for dir in [dir, &dir.join("components"), &dir.join("compiled")] {
            corral_core::private::dir(dir).map_err(io("creating it"))?;
        }
        remove_leftovers(dir);
        remove_leftovers(&dir.join("components"));
        remove_leftovers(&dir.join("compiled"));
        let path = dir.join("index.json");
        let index = match std::fs::read(&path) {
            Ok(bytes) => {
                let index: Index =
                    serde_json::from_slice(&bytes).map_err(|source| OpenError::Unreadable {
                        dir: dir.to_owned(),
                        source,
                    })?;
                if index.format != FORMAT {
                    return Err(OpenError::Format {
                        dir: dir.to_owned(),
                        found: index.format,
                    });
                }
                index
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Index {
                format: FORMAT,
                tenants: BTreeMap::new(),
            },
            Err(e) => return Err(io("reading index.json")(e)),
        };
        let store = Store {
            dir: Some(dir.to_owned()),
        };
        store.sweep(&index);
        Ok((store, index))
    }

    /// Where precompiled artifacts go.
    /// The data directory; `None` in memory.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    pub fn compiled_dir(&self) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join("compiled"))
    }

    fn blob_path(&self, digest: &str) -> Option<PathBuf> {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .as_ref()
            .map(|d| d.join("components").join(format!("{hex}.wasm")))
    }

    /// Where uploads and pulls are staged: `data_dir/staging` (emptied of
    /// what a crash left), or a directory of their own without `data_dir`.
    pub fn staging(&self) -> std::io::Result<Staging> {
        match &self.dir {
            Some(dir) => Staging::at(dir.join("staging")),
            None => Staging::temporary(),
        }
    }

    /// Stores a staged component under its digest (once): a rename, then
    /// the directory synced so the rename survives a crash.
    pub fn put_staged(&self, component: StagedComponent) -> std::io::Result<()> {
        let Some(path) = self.blob_path(&component.digest) else {
            return Ok(());
        };
        if path.exists() {
            return Ok(());
        }
        component.persist(&path)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::File::open(dir)?.sync_all()
    }

    /// Where a stored component's bytes are.
    pub fn path(&self, digest: &str) -> std::io::Result<PathBuf> {
        match self.blob_path(digest) {
            Some(path) if path.exists() => Ok(path),
            Some(path) => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("`{}` is missing", path.display()),
            )),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no data directory",
            )),
        }
    }

    /// Deletes a component's bytes once no tenant's version names them.
    pub fn forget_bytes(&self, digest: &str, index: &Index) {
        let referenced = index
            .tenants
            .values()
            .any(|t| t.versions.iter().any(|v| v.digest == digest));
        if referenced {
            return;
        }
        if let Some(path) = self.blob_path(digest) {
            remove(&path);
        }
        self.forget_compiled(digest);
    }

    /// Deletes the compiled artifacts of a digest (one per engine build).
    fn forget_compiled(&self, digest: &str) {
        let Some(dir) = self.compiled_dir() else {
            return;
        };
        let prefix = format!("{}-", digest.trim_start_matches("sha256:"));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                remove(&entry.path());
            }
        }
    }

    /// Deletes stored bytes and compiled artifacts no version names: what a
    /// crash between writing them and writing the index left behind.
    fn sweep(&self, index: &Index) {
        let named: std::collections::HashSet<&str> = index
            .tenants
            .values()
            .flat_map(|t| t.versions.iter())
            .map(|v| v.digest.trim_start_matches("sha256:"))
            .collect();
        let Some(dir) = &self.dir else {
            return;
        };
        sweep_dir(&dir.join("components"), &named, |name| {
            name.strip_suffix(".wasm")
        });
        sweep_dir(&dir.join("compiled"), &named, |name| {
            name.split_once('-').map(|(hex, _)| hex)
        });
    }

    /// Replaces the index on disk.
    pub fn save(&self, index: &Index) -> std::io::Result<()> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        let bytes = serde_json::to_vec_pretty(index).map_err(std::io::Error::other)?;
        write_atomically(&dir.join("index.json"), &bytes)
    }
}

/// A temporary file in the same directory, synced, renamed over `path`,
/// then the directory synced so the rename itself survives a crash.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut suffix = [0u8; 8];
    getrandom::fill(&mut suffix).map_err(std::io::Error::other)?;
    let tmp = dir.join(format!(".tmp-{}", hex::encode(suffix)));
    let result = (|| {
        let mut file = corral_core::private::new_file(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Removes the files of `dir` whose digest (`hex_of` its name) is not
/// `named`.
fn sweep_dir(
    dir: &Path,
    named: &std::collections::HashSet<&str>,
    hex_of: fn(&str) -> Option<&str>,
) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if let Some(hex) = hex_of(&name.to_string_lossy())
            && !named.contains(hex)
        {
            tracing::info!(file = %entry.path().display(), "removing an orphaned file");
            remove(&entry.path());
        }
    }
}

/// Removes a file, logging why it could not be (gone already is fine).
fn remove(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), "could not delete: {e}");
    }
}

/// Temporary files a crash left behind.
fn remove_leftovers(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(".tmp-") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(name: &str, hex: &str) -> Version {
        Version {
            name: name.into(),
            digest: format!("sha256:{hex}"),
            size: 1,
            uploaded_at_ms: 0,
            aliases: BTreeMap::new(),
            labels: BTreeMap::new(),
            from_config: false,
            config: BTreeMap::new(),
            compiled: 0,
            pulled: None,
            reuse: None,
            held: Vec::new(),
            served: false,
            signer: None,
        }
    }

    /// Stores `bytes` as if they had the digest `sha256:<hex>`.
    fn put(store: &Store, hex: &str, bytes: &[u8]) {
        let path = store.blob_path(&format!("sha256:{hex}")).unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    fn stored(store: &Store, hex: &str) -> std::io::Result<Vec<u8>> {
        std::fs::read(store.path(&format!("sha256:{hex}"))?)
    }

    #[test]
    fn the_index_survives_a_reopen_and_leftovers_are_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        let (store, mut index) = Store::open(dir.path()).unwrap();
        put(&store, "abcd", b"bytes");
        let mut tenant = TenantIndex::default();
        tenant.versions.push(version("greeter", "abcd"));
        tenant.active.insert("greeter".into(), "sha256:abcd".into());
        index.tenants.insert("acme".into(), tenant);
        store.save(&index).unwrap();
        std::fs::write(dir.path().join(".tmp-deadbeef"), b"half").unwrap();

        let (store, reopened) = Store::open(dir.path()).unwrap();
        assert_eq!(reopened, index);
        assert_eq!(stored(&store, "abcd").unwrap(), b"bytes");
        assert!(!dir.path().join(".tmp-deadbeef").exists());

        store.forget_bytes("sha256:abcd", &reopened);
        assert!(stored(&store, "abcd").is_ok(), "still referenced");
        store.forget_bytes("sha256:abcd", &Index::default());
        assert!(stored(&store, "abcd").is_err());
    }

    #[test]
    fn compiled_artifacts_go_with_their_bytes_and_orphans_are_swept_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let (store, mut index) = Store::open(dir.path()).unwrap();
        let compiled = store.compiled_dir().unwrap();
        for hex in ["abcd", "beef"] {
            put(&store, hex, b"bytes");
            std::fs::write(compiled.join(format!("{hex}-0123.cwasm")), b"code").unwrap();
        }
        let mut tenant = TenantIndex::default();
        tenant.versions.push(version("greeter", "abcd"));
        index.tenants.insert("acme".into(), tenant);
        store.save(&index).unwrap();

        // `beef` is named by nothing (a crash before its index was written).
        let (store, index) = Store::open(dir.path()).unwrap();
        assert!(stored(&store, "beef").is_err());
        assert!(!compiled.join("beef-0123.cwasm").exists());
        assert!(compiled.join("abcd-0123.cwasm").exists());

        store.forget_bytes("sha256:abcd", &Index::default());
        assert!(!compiled.join("abcd-0123.cwasm").exists());
        drop(index);
    }

    #[test]
    fn a_corrupt_index_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.json"), b"{\"format\": 1, \"ten").unwrap();
        let e = Store::open(dir.path()).unwrap_err();
        assert!(matches!(e, OpenError::Unreadable { .. }), "{e}");
        assert!(e.to_string().contains("index.json is unreadable"), "{e}");
    }

    #[test]
    fn versions_are_found_by_digest_or_unambiguous_prefix() {
        let mut t = TenantIndex::default();
        t.versions.push(version("a", "aaaaaaaa11"));
        t.versions.push(version("a", "aaaaaaaa22"));
        assert_eq!(
            t.find("sha256:aaaaaaaa11").unwrap().digest,
            "sha256:aaaaaaaa11"
        );
        assert_eq!(t.find("AAAAAAAA2").unwrap().digest, "sha256:aaaaaaaa22");
        assert_eq!(
            t.find("aaaaaaaa").unwrap_err(),
            FindError::Ambiguous("aaaaaaaa".into(), 2)
        );
        let not_a_digest = t.find("abc").unwrap_err();
        assert!(not_a_digest.to_string().contains("at least 8"));
        assert_eq!(
            t.find("bbbbbbbb").unwrap_err(),
            FindError::NoMatch("bbbbbbbb".into())
        );
    }

    #[test]
    fn a_stored_reuse_is_checked_again_when_read() {
        use corral_core::sandbox::{DeploymentReuse, Reuse};
        let on = DeploymentReuse::On(Reuse::new(10, std::time::Duration::from_secs(60)).unwrap());
        for reuse in [DeploymentReuse::Tenant, DeploymentReuse::Off, on] {
            let stored = StoredReuse::of(reuse);
            let read = stored.map_or(Ok(DeploymentReuse::Tenant), StoredReuse::get);
            assert_eq!(read, Ok(reuse));
        }
        // An index edited by hand: refused by name, not served.
        let forged = StoredReuse {
            max_tasks: 1,
            idle_ms: 1000,
        };
        let err = forged.get().unwrap_err().to_string();
        assert!(err.contains("max_tasks"), "{err}");
    }
}
