//! Components on their way in (an upload, a pull) are written to a file as
//! they arrive and hashed as they go: the host holds at most a chunk of one
//! in memory, whatever its size. A staged file becomes a stored version by
//! a rename into the store, or disappears when it is dropped (a refused
//! upload, a broken stream, a crash: leftovers are removed at start).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use sha2::{Digest, Sha256};
use tempfile::NamedTempFile;

/// Where components are staged: `data_dir/staging`, or a directory of its
/// own for a host without `data_dir`.
#[derive(Debug)]
pub struct Staging {
    dir: PathBuf,
    /// Holds the directory of a host without `data_dir`.
    _own: Option<tempfile::TempDir>,
}

/// Why a component could not be staged.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("staging the component: {0}")]
    Io(#[from] std::io::Error),
    #[error("the component is longer than the {limit} bytes announced")]
    Longer { limit: u64 },
}

impl Staging {
    /// `dir`, created if needed and emptied of what a crash left there.
    pub fn at(dir: PathBuf) -> std::io::Result<Staging> {
        corral_core::private::dir(&dir)?;
        for entry in std::fs::read_dir(&dir)? {
            let _ = std::fs::remove_file(entry?.path());
        }
        Ok(Staging { dir, _own: None })
    }

    /// A directory of its own, removed with it.
    pub fn temporary() -> std::io::Result<Staging> {
        let own = tempfile::tempdir()?;
        Ok(Staging {
            dir: own.path().to_path_buf(),
            _own: Some(own),
        })
    }

    /// A copy of the file at `path`, staged (and hashed) in pieces.
    pub fn copy_of(&self, path: &Path) -> Result<StagedComponent, StageError> {
        use std::io::Read as _;
        let mut file = std::fs::File::open(path)?;
        let mut staged = self.stage(u64::MAX)?;
        let mut buffer = vec![0u8; 64 << 10];
        loop {
            let n = file.read(&mut buffer)?;
            if n == 0 {
                break;
            }
            staged.write(&buffer[..n])?;
        }
        staged.finish()
    }

    /// A new staged file that takes at most `limit` bytes.
    pub fn stage(&self, limit: u64) -> std::io::Result<Staged> {
        Ok(Staged {
            file: NamedTempFile::new_in(&self.dir)?,
            hasher: Sha256::new(),
            size: 0,
            limit,
        })
    }
}

/// A component being written.
pub struct Staged {
    file: NamedTempFile,
    hasher: Sha256,
    size: u64,
    limit: u64,
}

impl Staged {
    /// Appends `bytes`, refusing to pass the limit.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), StageError> {
        let size = self.size.saturating_add(bytes.len() as u64);
        if size > self.limit {
            return Err(StageError::Longer { limit: self.limit });
        }
        self.file.write_all(bytes)?;
        self.hasher.update(bytes);
        self.size = size;
        Ok(())
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Flushes the file to disk: the component, named by its digest.
    pub fn finish(self) -> Result<StagedComponent, StageError> {
        self.file.as_file().sync_all()?;
        Ok(StagedComponent {
            digest: format!("sha256:{}", hex::encode(self.hasher.finalize())),
            size: self.size,
            file: self.file,
        })
    }
}

/// What an OCI pull writes the layer into, refusing more than the limit
/// (the layer's declared size).
impl tokio::io::AsyncWrite for Staged {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(match self.write(buf) {
            Ok(()) => Ok(buf.len()),
            Err(StageError::Longer { .. }) => Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                "the layer is larger than its manifest said",
            )),
            Err(StageError::Io(e)) => Err(e),
        })
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A component staged whole: its file (removed when dropped, unless
/// stored), digest and size.
#[derive(Debug)]
pub struct StagedComponent {
    file: NamedTempFile,
    pub digest: String,
    pub size: u64,
}

impl StagedComponent {
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Moves the file to `to` (in the same file system), which it replaces.
    pub fn persist(self, to: &Path) -> std::io::Result<()> {
        self.file.persist(to).map(drop).map_err(|e| e.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staged_component_is_hashed_bounded_and_gone_unless_stored() {
        let staging = Staging::temporary().unwrap();
        let mut staged = staging.stage(8).unwrap();
        staged.write(b"abcd").unwrap();
        staged.write(b"efgh").unwrap();
        assert!(matches!(
            staged.write(b"i"),
            Err(StageError::Longer { limit: 8 })
        ));
        let done = staged.finish().unwrap();
        assert_eq!(
            done.digest,
            format!("sha256:{}", hex::encode(Sha256::digest(b"abcdefgh")))
        );
        assert_eq!(done.size, 8);
        let path = done.path().to_path_buf();
        assert!(path.exists());
        drop(done);
        assert!(!path.exists(), "a dropped stage leaves nothing");

        let mut kept = staging.stage(8).unwrap();
        kept.write(b"kept").unwrap();
        let to = staging.dir.join("kept.wasm");
        kept.finish().unwrap().persist(&to).unwrap();
        assert_eq!(std::fs::read(&to).unwrap(), b"kept");
    }
}
