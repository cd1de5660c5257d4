//! Loading a component into the sandbox: validate the bytes, compile once
//! (in a worker, or reuse the artifact cached on disk), check every import
//! against what the host links, pre-instantiate, and find the activity
//! types. Tenants that load the same bytes share one loaded component.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError};

use sha2::{Digest, Sha256};
use wasmtime::component::Component;

use super::cache::{TempFile, store_compiled, tempfile_in};
use super::compile::{CompileError, ComponentBytes, compile_in_worker};
use super::component::{LoadError, LoadedComponent, NEXT_ID, check_header, file_digest, is_linked};
use super::engine::Sandbox;
use super::signature::exported_functions;

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
