//! The catalog: every tenant's stored versions, which are active, and the
//! live registry that routes tasks to them. Every change (upload, activate,
//! remove) is checked in full — the component loads, the tenant's routes
//! stay unambiguous, the aliases resolve — then written to disk, and only
//! then swapped into the registry, so a rejected change leaves everything as
//! it was.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

mod activate;
pub mod canary;
mod replay;
mod seed;
mod signed;
mod upload;

use sha2::{Digest, Sha256};

pub use super::errors::{CatalogError, ControlError, Refusal};
use super::metadata::{self, Pulled};
use super::rollout::{Ramp, Rollout, beyond_grants};
use super::shadow::{ReplayReport, Samples};
use super::store::{Index, Store, StoredCanary, StoredReuse, TenantIndex, Version};
use crate::config::Quota;
use crate::oci::{Credential, RepositoryPrefix};
use crate::staging::Staging;
use corral_core::metrics::Metrics;
use corral_core::sandbox::{
    ChangeReport, CompileError, DeploymentReuse, LoadError, LoadedComponent, PreparedTenant,
    Sandbox,
};
use corral_core::session::cpu::CpuScheduler;
use corral_core::session::{Deployment, Permits, Registry, Split, TenantTable};

/// A tenant as configured: its policy and its configuration-wide aliases.
#[derive(Debug, Clone)]
pub struct TenantSpec {
    pub tenant: PreparedTenant,
    pub aliases: Vec<(String, String)>,
    /// What the tenant may keep stored.
    pub quota: Quota,
    /// Where the tenant may have the host pull components from.
    pub registries: Vec<RepositoryPrefix>,
    /// The tenant's own registry credentials (over the host's).
    pub credentials: BTreeMap<String, Credential>,
    /// What its new versions may activate by themselves.
    pub rollout: Rollout,
    /// The keys its versions must be signed by.
    pub trust: crate::trust::TrustPolicy,
}

impl TenantSpec {
    /// The tenant's outbound HTTP grants, as configured.
    fn http_hosts(&self) -> Vec<String> {
        self.tenant
            .capabilities
            .http_hosts
            .iter()
            .map(ToString::to_string)
            .collect()
    }
}

/// What an upload asks for.
#[derive(Debug, Clone, Default)]
pub struct NewVersion {
    pub name: String,
    pub aliases: BTreeMap<String, String>,
    /// The caller's labels (never under a host prefix: see `metadata`).
    pub labels: BTreeMap<String, String>,
    /// The deployment's own `wasi:config` keys.
    pub config: BTreeMap<String, String>,
    /// The deployment's own reuse.
    pub reuse: DeploymentReuse,
    /// Store without activating.
    pub inactive: bool,
    /// Ramp up as a canary (over the tenant's rollout's).
    pub canary: Option<Ramp>,
    /// Where the host pulled it from: set by the host only.
    pub pulled: Option<Pulled>,
    /// Who signed it, as the host verified: set by the host only.
    pub signer: Option<String>,
}

/// What an upload did besides storing its version.
#[derive(Debug, Clone)]
pub struct Uploaded {
    /// The same bytes were already stored for this deployment.
    pub already_stored: bool,
    /// What it changes against the deployment's version active before it
    /// (that version's digest, and the report); `None` for a deployment's
    /// first version or the same bytes again.
    pub changes: Option<(String, ChangeReport)>,
    /// The capabilities it imports that the tenant is not granted.
    pub beyond_grants: Vec<String>,
    /// Its replay of the tenant's recorded attempts, if it was replayed.
    pub replay: Option<ReplayReport>,
}

/// A stored version as the API shows it.
#[derive(Debug, Clone)]
pub struct VersionView {
    pub tenant: String,
    pub version: Version,
    pub active: bool,
    /// Loaded when it is active or was described; `None` otherwise.
    pub component: Option<Arc<LoadedComponent>>,
    /// The hosts the tenant may call over outbound HTTP.
    pub http_hosts: Vec<String>,
    /// The percent of its deployment's tasks it takes as a canary.
    pub canary: Option<u32>,
}

struct State {
    index: Index,
    /// Loaded components by digest.
    loaded: HashMap<String, Arc<LoadedComponent>>,
    /// (Tenant, deployment) → its canary's candidate and split.
    splits: HashMap<(String, String), (String, Arc<Split>)>,
}

impl State {
    /// Only what serves (an active version or a canary's candidate) stays
    /// compiled in memory; the rest is loaded from the compile cache when
    /// asked for.
    fn sweep(&mut self) {
        let serving: std::collections::HashSet<&String> = self
            .index
            .tenants
            .values()
            .flat_map(|t| {
                t.active
                    .values()
                    .chain(t.canaries.values().map(|c| &c.candidate))
            })
            .collect();
        self.loaded.retain(|digest, _| serving.contains(digest));
    }

    /// A copy of the tenant's index, and its version matching `digest`.
    fn version(&self, tenant: &str, digest: &str) -> Result<(TenantIndex, Version), ControlError> {
        let tenant_index = self.index.tenants.get(tenant).cloned().unwrap_or_default();
        let version = tenant_index.find(digest)?.clone();
        Ok((tenant_index, version))
    }
}

pub struct Catalog {
    sandbox: Arc<Sandbox>,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    store: Store,
    /// Where uploads and pulls arrive, before they are stored.
    staging: Staging,
    tenants: BTreeMap<String, TenantSpec>,
    /// One change at a time; held across validation and the disk write.
    state: tokio::sync::Mutex<State>,
    /// Compiles at once (`host.max_compiles`): each takes a core and memory
    /// in proportion to the component, and serving goes on beside them.
    compiles: tokio::sync::Semaphore,
    /// The canaries serving now, for `/metrics` (read without the state).
    canaries: std::sync::Mutex<Vec<canary::Live>>,
    /// Every tenant's recorded attempts, for shadow replay.
    samples: Arc<Samples>,
    /// Where replays run guests: the session's scheduler and host slots,
    /// once they exist.
    guests: std::sync::OnceLock<(Arc<CpuScheduler>, Permits)>,
    /// Per tenant that records attempts: one replay at a time.
    replays: BTreeMap<String, tokio::sync::Mutex<()>>,
}

impl Catalog {
    /// Loads every tenant's active versions from the store; [`Catalog::seed`]
    /// then adds the configured components and routes each tenant. A stored version that no longer loads (its bytes are gone or this
    /// host cannot run it) is an error: the host must serve exactly what
    /// was active, or say why not.
    pub async fn open(
        sandbox: Arc<Sandbox>,
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        store: Store,
        index: Index,
        tenants: Vec<TenantSpec>,
        max_compiles: usize,
    ) -> Result<Catalog, CatalogError> {
        let policies = tenants
            .iter()
            .filter_map(|t| Some((t.tenant.name.clone(), t.rollout.shadow.clone()?)))
            .collect();
        let samples = Samples::open(store.dir(), policies);
        let replays = tenants
            .iter()
            .filter(|t| t.rollout.shadow.is_some())
            .map(|t| (t.tenant.name.clone(), tokio::sync::Mutex::new(())))
            .collect();
        // A recorded tenant's tasks carry its sampler (see `Recording` in
        // the session's task).
        let tenants: BTreeMap<String, TenantSpec> = tenants
            .into_iter()
            .map(|mut t| {
                t.tenant.shadow = samples.sampler(&t.tenant.name);
                (t.tenant.name.clone(), t)
            })
            .collect();
        for name in index.tenants.keys() {
            if !tenants.contains_key(name) {
                tracing::warn!(
                    "the data directory holds components of tenant `{name}`, which is not configured; they are kept, not served"
                );
            }
        }
        // A canary's step starts over with the host: its counts do too, so
        // a step it was in when the host stopped is not over at once.
        let mut index = index;
        let now = now_ms();
        for tenant_index in index.tenants.values_mut() {
            for canary in tenant_index.canaries.values_mut() {
                canary.step_started_ms = now;
            }
        }
        // What a tenant's trust policy refuses now is not served, however
        // it was stored (the policy may have changed since, a key gone).
        for (name, tenant_index) in &mut index.tenants {
            if let Some(spec) = tenants.get(name) {
                signed::distrust(name, spec, tenant_index);
            }
        }
        let staging = store
            .staging()
            .map_err(|e| ControlError::host("creating the staging directory", e))?;
        let catalog = Catalog {
            sandbox,
            registry,
            metrics,
            store,
            staging,
            tenants,
            state: tokio::sync::Mutex::new(State {
                index,
                loaded: HashMap::new(),
                splits: HashMap::new(),
            }),
            canaries: Default::default(),
            compiles: tokio::sync::Semaphore::new(max_compiles.max(1)),
            samples,
            guests: std::sync::OnceLock::new(),
            replays,
        };
        {
            let mut state = catalog.state.lock().await;
            for spec in catalog.tenants.values() {
                let name = &spec.tenant.name;
                let tenant_index = state.index.tenants.get(name).cloned().unwrap_or_default();
                catalog.count_held(name, Some(&tenant_index));
                catalog
                    .samples
                    .set_room(name, spec.quota.room(&tenant_index));
                for version in tenant_index.active_versions() {
                    let component =
                        catalog
                            .loaded(&mut state, &version.digest)
                            .await
                            .map_err(|source| CatalogError::ActiveVersion {
                                tenant: name.clone(),
                                digest: version.digest.clone(),
                                deployment: version.name.clone(),
                                source,
                            })?;
                    tracing::info!(tenant = %name, digest = %version.digest, deployment = %version.name, from_cache = component.from_cache, "loaded");
                }
            }
        }
        Ok(catalog)
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Replays run their guests on `cpu` from now on, under each tenant's
    /// share, each holding one of the host's slots as a task does (so the
    /// instance pool, sized by the slots, always has its instance); until
    /// then, on the caller's thread.
    pub fn run_guests_on(&self, cpu: Arc<CpuScheduler>, permits: Permits) {
        let _ = self.guests.set((cpu, permits));
    }

    /// Every tenant's recorded attempts.
    pub fn samples(&self) -> &Arc<Samples> {
        &self.samples
    }

    pub fn tenant_names(&self) -> impl Iterator<Item = &str> {
        self.tenants.keys().map(String::as_str)
    }

    /// Where an upload or a pull is written as it arrives.
    pub fn staging(&self) -> &Staging {
        &self.staging
    }

    pub(super) fn spec(&self, tenant: &str) -> Result<&TenantSpec, ControlError> {
        self.tenants
            .get(tenant)
            .ok_or_else(|| ControlError::UnknownTenant(tenant.to_owned()))
    }

    /// Deletes a stored version; the active one only with `force`, which
    /// stops serving its deployment.
    pub async fn remove(
        &self,
        tenant: &str,
        digest: &str,
        force: bool,
    ) -> Result<VersionView, ControlError> {
        let spec = self.spec(tenant)?;
        let mut state = self.state.lock().await;
        let (mut tenant_index, version) = state.version(tenant, digest)?;
        let active = tenant_index.is_active(&version);
        if active && !force {
            return Err(ControlError::RemovingActive {
                digest: version.digest,
                deployment: version.name,
            });
        }
        if active {
            // What its callers called, for the gate: a version serving any
            // of it next (under any deployment name) has nothing to be
            // compared with. Loaded already, as it serves.
            let names = match self.loaded(&mut state, &version.digest).await {
                Ok(component) => Some(activate::called(&version, &component)),
                Err(e) => {
                    tracing::warn!(tenant, digest = %version.digest, "the removed version's activity types are not known ({}): the gate holds the next new version", crate::error_chain(&e));
                    None
                }
            };
            tenant_index.active.remove(&version.name);
            tenant_index.canaries.remove(&version.name);
            tenant_index.removed_active(&version.name, names);
        }
        tenant_index
            .canaries
            .retain(|_, c| c.candidate != version.digest);
        if !version.held.is_empty() {
            tenant_index.rejected(&version.digest, version.held.clone());
        }
        tenant_index.versions.retain(|v| v.digest != version.digest);
        self.commit(&mut state, spec, tenant_index).await?;
        self.store.forget_bytes(&version.digest, &state.index);
        tracing::info!(tenant, digest = %version.digest, deployment = %version.name, "removed");
        Ok(VersionView {
            tenant: tenant.to_owned(),
            version,
            active,
            component: None,
            http_hosts: spec.http_hosts(),
            canary: None,
        })
    }

    /// Every stored version of a tenant, newest first.
    pub async fn list(&self, tenant: &str) -> Result<Vec<VersionView>, ControlError> {
        let spec = self.spec(tenant)?;
        let state = self.state.lock().await;
        let tenant_index = state.index.tenants.get(tenant).cloned().unwrap_or_default();
        let mut views: Vec<VersionView> = tenant_index
            .versions
            .iter()
            .map(|v| VersionView {
                tenant: tenant.to_owned(),
                version: v.clone(),
                active: tenant_index.is_active(v),
                component: state.loaded.get(&v.digest).cloned(),
                http_hosts: spec.http_hosts(),
                canary: tenant_index.canary_percent(&v.digest),
            })
            .collect();
        views.sort_by_key(|v| std::cmp::Reverse(v.version.uploaded_at_ms));
        Ok(views)
    }

    /// One stored version, loaded so its signatures can be shown.
    pub async fn describe(&self, tenant: &str, digest: &str) -> Result<VersionView, ControlError> {
        let spec = self.spec(tenant)?;
        let mut state = self.state.lock().await;
        let (tenant_index, version) = state.version(tenant, digest)?;
        // Nothing its tenant's trust refuses is compiled, not even to be
        // described: what the catalog holds loaded, if anything, is shown.
        let component = match spec.trust.admits(version.signer.as_deref()) {
            true => Some(self.loaded(&mut state, &version.digest).await?),
            false => state.loaded.get(&version.digest).cloned(),
        };
        Ok(VersionView {
            tenant: tenant.to_owned(),
            active: tenant_index.is_active(&version),
            canary: tenant_index.canary_percent(&version.digest),
            version,
            component,
            http_hosts: spec.http_hosts(),
        })
    }

    /// Checks the tenant's new index in full, writes it, then routes it.
    /// Whether the tenant may store `digest` (`size` bytes): always when it
    /// stores it already.
    fn admit(
        &self,
        state: &State,
        spec: &TenantSpec,
        candidate: &Version,
    ) -> Result<(), ControlError> {
        let name = &spec.tenant.name;
        let none = TenantIndex::default();
        let tenant_index = state.index.tenants.get(name).unwrap_or(&none);
        spec.quota
            .admit(name, tenant_index, candidate)
            .map_err(ControlError::from)
    }

    async fn commit(
        &self,
        state: &mut State,
        spec: &TenantSpec,
        mut tenant_index: TenantIndex,
    ) -> Result<(), ControlError> {
        let name = &spec.tenant.name;
        // A deployment serving again has an active version to compare with.
        let serving = tenant_index.active.clone();
        tenant_index
            .removed_active
            .retain(|d| !serving.contains_key(d));
        let (table, splits) = self.routes(state, spec, &mut tenant_index).await?;
        // A name served again has an active version to compare with.
        tenant_index.removed_names.retain(|n| !table.serves(n));
        let mut index = state.index.clone();
        if tenant_index == TenantIndex::default() {
            index.tenants.remove(name);
        } else {
            index.tenants.insert(name.clone(), tenant_index);
        }
        self.store
            .save(&index)
            .map_err(|e| ControlError::host("writing the index", e))?;
        self.count_held(name, index.tenants.get(name));
        let none = TenantIndex::default();
        let room = spec.quota.room(index.tenants.get(name).unwrap_or(&none));
        self.samples.set_room(name, room);
        state.index = index;
        self.registry.install(table);
        // The canaries' splits change only with a change that took.
        for (deployment, candidate, split, share) in splits {
            split.set_share(share);
            state
                .splits
                .insert((name.clone(), deployment), (candidate, split));
        }
        state.sweep();
        self.canaries_changed(state);
        Ok(())
    }

    /// The tenant's routes by `tenant_index`, checked, with the splits its
    /// canaries need (deployment, candidate, split, share). A canary whose
    /// candidate no longer loads, whose signer its tenant's trust refuses,
    /// or whose ramp reads back out of its bounds, is dropped with a
    /// warning, not a reason to serve nothing.
    async fn routes(
        &self,
        state: &mut State,
        spec: &TenantSpec,
        tenant_index: &mut TenantIndex,
    ) -> Result<(TenantTable, Vec<canary::PendingSplit>), ControlError> {
        let name = &spec.tenant.name;
        let mut deployments = Vec::new();
        let mut splits = Vec::new();
        let active: Vec<Version> = tenant_index
            .active_versions()
            .into_iter()
            .cloned()
            .collect();
        for version in active {
            // Whatever made it active, nothing its tenant's trust refuses
            // serves (a promoted canary's candidate included).
            Catalog::signed(spec, &version)?;
            let canary = match tenant_index.canary_of(&version.name) {
                Some((canary, candidate)) => {
                    let (canary, candidate) = (canary.clone(), candidate.clone());
                    let taken = match Catalog::signed(spec, &candidate) {
                        Ok(()) => {
                            self.candidate(state, name, &version.name, &canary, &candidate)
                                .await
                        }
                        Err(e) => Err(e),
                    };
                    match taken {
                        Ok((deployment, pending)) => {
                            splits.push(pending.clone());
                            Some((Box::new(deployment), pending.2))
                        }
                        Err(e) => {
                            tracing::warn!(tenant = %name, deployment = %version.name, candidate = %canary.candidate, "canary dropped: {}", crate::error_chain(&e));
                            tenant_index.canaries.remove(&version.name);
                            None
                        }
                    }
                }
                None => None,
            };
            deployments.push(Deployment {
                component: self.loaded(state, &version.digest).await?,
                config: version.config.clone().into_iter().collect(),
                reuse: version.deployment_reuse()?,
                canary,
            });
        }
        let aliases = aliases(spec, tenant_index);
        let table = Registry::prepare_deployments(spec.tenant.clone(), &deployments, &aliases)?;
        Ok((table, splits))
    }

    /// The loaded component of a stored digest, loading it from disk once.
    async fn loaded(
        &self,
        state: &mut State,
        digest: &str,
    ) -> Result<Arc<LoadedComponent>, ControlError> {
        if let Some(c) = state.loaded.get(digest) {
            return Ok(c.clone());
        }
        let path = self
            .store
            .path(digest)
            .map_err(|e| ControlError::host("reading the stored bytes", e))?;
        let component = self.load(&path, digest).await?;
        state.loaded.insert(digest.to_owned(), component.clone());
        Ok(component)
    }

    /// Validates and compiles the component in a file, whose digest the
    /// caller knows, on a blocking thread (compiling takes seconds).
    async fn load(
        &self,
        path: &std::path::Path,
        digest: &str,
    ) -> Result<Arc<LoadedComponent>, ControlError> {
        let sandbox = self.sandbox.clone();
        let _compiling = self
            .compiles
            .acquire()
            .await
            .map_err(|e| ControlError::host("waiting to compile", e))?;
        let (path, digest) = (path.to_path_buf(), digest.to_owned());
        let loaded = tokio::task::spawn_blocking(move || sandbox.load_known(&path, &digest))
            .await
            .map_err(|e| ControlError::host("compiling", e))?;
        match loaded {
            Ok(component) => {
                self.metrics.component_loaded(component.from_cache);
                Ok(component)
            }
            Err(LoadError::Compile(e @ (CompileError::TooSlow(_) | CompileError::TooBig(_)))) => {
                tracing::warn!("a component was refused: {e}");
                Err(ControlError::CompileLimit(e))
            }
            Err(LoadError::Compile(e @ CompileError::Worker(_))) => {
                tracing::warn!("a component could not be compiled: {e}");
                Err(ControlError::host("compiling", e))
            }
            Err(e) => Err(ControlError::Load(e)),
        }
    }
}

/// The configuration's aliases, then each active version's own.
fn aliases(spec: &TenantSpec, tenant_index: &TenantIndex) -> Vec<(String, String)> {
    let mut all = spec.aliases.clone();
    for version in tenant_index.active_versions() {
        all.extend(version.aliases.iter().map(|(a, t)| (a.clone(), t.clone())));
    }
    all
}

pub fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
