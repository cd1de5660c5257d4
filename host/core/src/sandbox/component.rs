//! Loading a component: validate the bytes, compile once (or reuse the
//! compiled artifact cached on disk), check every import against what the
//! host links, pre-instantiate, and find the activity types.

use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, InstancePre};

use super::compile::{CompileError, ComponentBytes, MAX_REASON, compile_in_worker};
use super::context::TaskState;
use super::engine::Sandbox;
use super::signature::{ActivityType, UnsupportedExport, exported_functions};
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
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

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
fn is_linked(import: &str) -> bool {
    let (name, version) = import.split_once('@').unwrap_or((import, ""));
    (BASE_WASI.contains(&name) && version.starts_with("0.2."))
        || (CORRAL.contains(&name) && version.starts_with("0.1."))
        || import == CONFIG
}

/// Imports or exports a load error lists before "and N more".
const MAX_LISTED_EXPORTS: usize = 20;

/// Checks the header: a component, not a core module or something else.
fn check_header(header: &[u8]) -> Result<(), LoadError> {
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
fn file_digest(path: &Path) -> std::io::Result<(String, [u8; 8])> {
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

impl Sandbox {
    /// Loads a component from its bytes. The compiled code is cached on disk
    /// (when the sandbox has a cache directory) under the component's SHA-256
    /// and the engine's compatibility hash, so the same bytes are compiled
    /// once, also across restarts.
    pub fn load(&self, bytes: &[u8]) -> Result<Arc<LoadedComponent>, LoadError> {
        check_header(bytes)?;
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(bytes)));
        self.load_checked(&digest, ComponentBytes::Memory(bytes))
    }

    /// Loads the component in a file whose SHA-256 the caller knows (it
    /// hashed the bytes as they arrived, or stored them under it). The host
    /// never reads the whole file: a compile worker reads it, or the
    /// compiled artifact is taken from the cache.
    pub fn load_known(&self, path: &Path, digest: &str) -> Result<Arc<LoadedComponent>, LoadError> {
        use std::io::Read as _;
        // It names the compiled artifact's file.
        let hex = digest.strip_prefix("sha256:").unwrap_or_default();
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(LoadError::Io(format!(
                "`{}` is not a sha256 digest",
                crate::shown::shown(digest, 80)
            )));
        }
        let mut header = [0u8; 8];
        let read = std::fs::File::open(path)
            .and_then(|mut file| file.read(&mut header))
            .map_err(|e| LoadError::Io(format!("reading `{}`: {e}", path.display())))?;
        check_header(&header[..read])?;
        self.load_checked(digest, ComponentBytes::File(path))
    }

    fn load_checked(
        &self,
        digest: &str,
        bytes: ComponentBytes<'_>,
    ) -> Result<Arc<LoadedComponent>, LoadError> {
        let digest = digest.to_owned();
        if let Some(shared) = self.already_loaded(&digest) {
            return Ok(shared);
        }
        let (component, from_cache) = self.compile_cached(&digest, bytes)?;

        let ty = component.component_type();
        let imports: Vec<String> = ty
            .imports(&self.engine)
            .map(|(n, _)| n.to_owned())
            .collect();
        let missing: Vec<String> = imports.iter().filter(|n| !is_linked(n)).cloned().collect();
        if !missing.is_empty() {
            return Err(LoadError::UnsatisfiedImports(missing));
        }
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::Link(format!("{e:#}")))?;
        let (activities, unsupported) = exported_functions(&self.engine, &component);
        if activities.is_empty() {
            return Err(LoadError::NoActivities(unsupported));
        }
        let loaded = Arc::new(LoadedComponent {
            digest,
            activities,
            unsupported,
            imports,
            from_cache,
            pre,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        });
        let mut by_digest = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        by_digest.retain(|_, component| component.strong_count() > 0);
        by_digest.insert(loaded.digest.clone(), Arc::downgrade(&loaded));
        Ok(loaded)
    }

    /// The component of `digest` if it is loaded and in use: its compiled
    /// code, memory image and instance template are shared, not loaded
    /// again.
    fn already_loaded(&self, digest: &str) -> Option<Arc<LoadedComponent>> {
        let by_digest = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        let shared = by_digest.get(digest)?.upgrade()?;
        Some(if shared.from_cache {
            shared
        } else {
            // Not compiled by this load: say so, as a load from the cache would.
            Arc::new(LoadedComponent {
                from_cache: true,
                ..LoadedComponent::clone(&shared)
            })
        })
    }

    /// Loads a component from a file.
    pub fn load_file(&self, path: &Path) -> Result<Arc<LoadedComponent>, LoadError> {
        let (digest, header) = file_digest(path)
            .map_err(|e| LoadError::Io(format!("reading `{}`: {e}", path.display())))?;
        check_header(&header)?;
        self.load_checked(&digest, ComponentBytes::File(path))
    }

    fn compile_cached(
        &self,
        digest: &str,
        bytes: ComponentBytes<'_>,
    ) -> Result<(Component, bool), LoadError> {
        let cached = self.cache_path(digest);
        if let Some(path) = &cached
            && path.exists()
        {
            // SAFETY: the file was written by `store_compiled` below from
            // `Component::serialize` of this very engine configuration:
            // its name binds the content digest and the engine's
            // compatibility hash, and the cache directory belongs to the
            // host. wasmtime also checks the artifact's header against the
            // engine before using it.
            match unsafe { Component::deserialize_file(&self.engine, path) } {
                Ok(component) => return Ok((component, true)),
                Err(e) => tracing::warn!(
                    path = %path.display(),
                    "ignoring an unusable compiled component in the cache: {e}"
                ),
            }
        }
        let Some(limits) = &self.config.compile else {
            // In this process: the user's own component (`corral run`,
            // `test`, the harness).
            let component = match bytes {
                ComponentBytes::Memory(bytes) => Component::new(&self.engine, bytes),
                ComponentBytes::File(path) => Component::from_file(&self.engine, path),
            }
            .map_err(|e| LoadError::Invalid(format!("{e:#}")))?;
            if let Some(path) = &cached
                && let Err(e) = store_compiled(&component, path)
            {
                tracing::warn!(path = %path.display(), "could not cache the compiled component: {e}");
            }
            return Ok((component, false));
        };
        // In a worker, which writes the artifact straight to a file beside
        // where it is cached: the host maps it, never reads it whole.
        let dir = cached
            .as_deref()
            .and_then(Path::parent)
            .map_or_else(std::env::temp_dir, Path::to_path_buf);
        let worker_error = |what: &str, e: std::io::Error| {
            LoadError::Compile(CompileError::Worker(format!("{what}: {e}")))
        };
        let (artifact_path, artifact) =
            tempfile_in(&dir).map_err(|e| worker_error("creating the artifact file", e))?;
        let artifact_path = TempFile(artifact_path);
        compile_in_worker(limits, self.config.max_wasm_stack, bytes, &artifact)
            .map_err(LoadError::Compile)?;
        // Synced before it is renamed to the name that is trusted.
        artifact
            .sync_all()
            .map_err(|e| worker_error("writing the artifact", e))?;
        // SAFETY: the artifact is what our own binary, as the compile worker,
        // wrote from `Engine::precompile_component` with this engine's code
        // settings (`wasm_config`) into a file this host created; wasmtime
        // checks its header against this engine before using it.
        let component = unsafe { Component::deserialize_file(&self.engine, &artifact_path.0) }
            .map_err(|e| {
                LoadError::Compile(CompileError::Worker(format!(
                    "its artifact does not load: {e:#}"
                )))
            })?;
        if let Some(path) = &cached
            && let Err(e) = std::fs::rename(&artifact_path.0, path)
        {
            tracing::warn!(path = %path.display(), "could not cache the compiled component: {e}");
        }
        Ok((component, false))
    }

    /// The size of the compiled artifact cached for `digest`, if any: what a
    /// stored version costs on disk besides its bytes.
    pub fn compiled_size(&self, digest: &str) -> Option<u64> {
        let path = self.cache_path(digest)?;
        std::fs::metadata(path).ok().map(|m| m.len())
    }

    fn cache_path(&self, digest: &str) -> Option<PathBuf> {
        let dir = self.config.cache_dir.as_ref()?;
        let mut hasher = DefaultHasher::new();
        self.engine
            .precompile_compatibility_hash()
            .hash(&mut hasher);
        let hex = digest.trim_start_matches("sha256:");
        Some(dir.join(format!("{hex}-{:016x}.cwasm", hasher.finish())))
    }
}

/// Writes the compiled artifact atomically: a temporary file in the same
/// directory, synced, then renamed over the final name, so a crash never
/// leaves a half-written artifact under the name that is trusted.
fn store_compiled(component: &Component, path: &Path) -> anyhow::Result<()> {
    let bytes = component.serialize().map_err(anyhow::Error::from)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile_in(dir)?;
    tmp.1.write_all(&bytes)?;
    tmp.1.sync_all()?;
    std::fs::rename(&tmp.0, path)?;
    Ok(())
}

/// A file removed when dropped (unless renamed away first).
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let name = format!(".tmp-{}-{:x}", std::process::id(), rand_suffix());
    let path = dir.join(name);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
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
        let config = super::super::SandboxConfig {
            cache_dir: Some(dir.path().to_path_buf()),
            ..Default::default()
        };
        super::super::Sandbox::new(config).unwrap();
        assert!(!gone.exists(), "an exited host's artifact is removed");
        assert!(recent.exists(), "a compile that may be under way is left");
        assert!(live.exists(), "a running host's compile is left alone");
        assert!(other.exists());
    }
}
