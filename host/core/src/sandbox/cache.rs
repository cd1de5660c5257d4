//! The compile cache on disk: artifacts written whole or not at all, and
//! the half-written ones of hosts that are gone swept away.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use wasmtime::component::Component;

/// Writes the compiled artifact atomically: a temporary file in the same
/// directory, synced, then renamed over the final name, so a crash never
/// leaves a half-written artifact under the name that is trusted.
pub(super) fn store_compiled(component: &Component, path: &Path) -> anyhow::Result<()> {
    let bytes = component.serialize().map_err(anyhow::Error::from)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile_in(dir)?;
    tmp.1.write_all(&bytes)?;
    tmp.1.sync_all()?;
    std::fs::rename(&tmp.0, path)?;
    Ok(())
}

/// A file removed when dropped (unless renamed away first).
pub(super) struct TempFile(pub(super) PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub(super) fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let name = format!(".tmp-{}-{:x}", std::process::id(), rand_suffix());
    let path = dir.join(name);
    let file = crate::private::new_file(&path)?;
    Ok((path, file))
}

/// Removes the half-written artifacts (`.tmp-<pid>-…`) of compiles whose
/// host exited mid-way (a host's stop does not wait for a compile). The
/// cache may be shared by several hosts at once, so only those of a
/// process no longer running, and older than any compile may take
/// (`older_than`): a live host's are its compiles under way, and a host in
/// another pid namespace (a container sharing the cache) is not seen.
/// (Another host removing one first is fine.)
pub(crate) fn remove_abandoned_artifacts(dir: &Path, older_than: Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let old = |entry: &std::fs::DirEntry| {
        entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|at| at.elapsed().is_ok_and(|age| age > older_than))
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(".tmp-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<libc::pid_t>().ok())
            .filter(|pid| *pid > 0)
        else {
            continue;
        };
        // SAFETY: signal 0 sends nothing: it only asks whether `pid` exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone
            && old(&entry)
            && let Err(e) = std::fs::remove_file(entry.path())
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %entry.path().display(), "could not remove an abandoned artifact: {e}");
        }
    }
}

fn rand_suffix() -> u64 {
    let mut hasher = DefaultHasher::new();
    std::time::SystemTime::now().hash(&mut hasher);
    std::thread::current().id().hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_new_host_removes_the_artifacts_only_of_hosts_that_are_gone() {
        let dir = tempfile::tempdir().unwrap();
        // A process that has exited (and been reaped): its pid names no one.
        let mut exited = std::process::Command::new("true").spawn().unwrap();
        exited.wait().unwrap();
        let gone = dir.path().join(format!(".tmp-{}-1f", exited.id()));
        // Of a process this host cannot see (one in another pid namespace)
        // that may be compiling still.
        let recent = dir.path().join(format!(".tmp-{}-3f", exited.id()));
        let live = dir.path().join(format!(".tmp-{}-2f", std::process::id()));
        let other = dir.path().join("0123-abcd.cwasm");
        let long_ago = std::time::SystemTime::now() - Duration::from_secs(48 * 3600);
        for file in [&gone, &recent, &live, &other] {
            let written = std::fs::File::create(file).unwrap();
            if file != &recent {
                written.set_modified(long_ago).unwrap();
            }
        }
        let config = crate::sandbox::SandboxConfig {
            cache_dir: Some(dir.path().to_path_buf()),
            ..Default::default()
        };
        crate::sandbox::Sandbox::new(config).unwrap();
        assert!(!gone.exists(), "an exited host's artifact is removed");
        assert!(recent.exists(), "a compile that may be under way is left");
        assert!(live.exists(), "a running host's compile is left alone");
        assert!(other.exists());
    }
}
