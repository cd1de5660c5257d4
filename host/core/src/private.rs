//! Files and directories only the host's own user can read: whatever may
//! hold what a tenant sent or a guest received (components, compiled code,
//! the index, recorded responses) is created owner-only, whatever the
//! process's umask, so another user of the machine reads none of it.

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

/// `dir` (and the parents it needs) created `0700`; an existing `dir` is
/// made `0700` too (its parents are left as they are), unless another user
/// owns it (a volume an orchestrator mounted for the host, group-writable
/// for it): that one keeps its mode, and what corral makes inside it is
/// owner-only all the same.
pub fn dir(dir: &Path) -> std::io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    match std::fs::set_permissions(dir, Permissions::from_mode(0o700)) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Ok(()),
        done => done,
    }
}

/// A new file at `path`, `0600`, for writing; an error if it exists.
pub fn new_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_host_keeps_is_its_users_alone() {
        let root = tempfile::tempdir().unwrap();
        let loose = root.path().join("loose");
        std::fs::create_dir(&loose).unwrap();
        std::fs::set_permissions(&loose, Permissions::from_mode(0o777)).unwrap();
        let nested = root.path().join("a/b");
        dir(&loose).unwrap();
        dir(&nested).unwrap();
        new_file(&nested.join("f")).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&loose), 0o700);
        assert_eq!(mode(&nested), 0o700);
        assert_eq!(mode(&root.path().join("a")), 0o700);
        assert_eq!(mode(&nested.join("f")), 0o600);
        assert!(new_file(&nested.join("f")).is_err(), "an existing file");
    }
}
