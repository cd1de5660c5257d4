//! Which component serves which activity type for which tenant, with the
//! tenant's aliases (Temporal users like short names such as `Greet`).
//!
//! The registry is live: the control plane replaces a tenant's routes when a
//! version is activated, and the next task is routed by the new table. A
//! task takes its route (and so its component) once, when it starts, so
//! tasks already running finish on the version they started with.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use super::canary::{Routed, Side, Split};
use crate::metrics::{Metrics, TypeCpu};
use crate::sandbox::{DeploymentReuse, LoadedComponent, Outcome, PreparedTenant, SecretShadows};
use crate::shown::Shown;

/// The longest name a [`RouteError`] quotes.
const SHOWN_NAME: usize = 256;

/// Where a task goes.
#[derive(Debug, Clone)]
pub struct Route {
    pub tenant: Arc<PreparedTenant>,
    pub component: Arc<LoadedComponent>,
    /// The full activity type name inside the component (shared: every
    /// task of the type carries it).
    pub activity: Arc<str>,
    /// Under a canary: its split, and the side this task was routed to.
    pub side: Option<(Arc<Split>, Side)>,
    /// The type's CPU counters, found in the metrics by its first task and
    /// kept for the rest (shared by every copy of the route).
    pub cpu: Arc<OnceLock<Arc<TypeCpu>>>,
}

impl Route {
    /// The counters its tasks' CPU is added to, in `metrics` (found by its
    /// first task: a registry serves one session, so one `metrics`).
    pub fn cpu_of(&self, metrics: &Metrics) -> Arc<TypeCpu> {
        self.cpu
            .get_or_init(|| metrics.cpu_of(&self.tenant.label, &self.activity))
            .clone()
    }

    /// Counts a task's outcome on its canary's side, under a canary.
    pub fn record(&self, outcome: &Outcome) {
        if let Some((split, side)) = &self.side {
            split.record(*side, outcome);
        }
    }
}

/// One tenant's policy and routes, replaced as a whole.
#[derive(Debug)]
struct TenantRoutes {
    tenant: Arc<PreparedTenant>,
    routes: HashMap<String, Route>,
    /// Full activity type name → its canary's split, candidate route and
    /// the type's count of routed tasks.
    canaries: HashMap<String, (Arc<Split>, Route, Routed)>,
}

/// A tenant's checked routes, ready to [`Registry::install`].
#[derive(Debug)]
pub struct TenantTable(TenantRoutes);

impl TenantTable {
    /// Whether a task may name `name` (an activity type or an alias).
    pub fn serves(&self, name: &str) -> bool {
        self.0.routes.contains_key(name)
    }
}

/// A tenant's routes that cannot be served. The names in it are a
/// tenant's or its component's (an alias's target is any text the tenant
/// sent): escaped and cut where they are shown, in the answer to the
/// tenant as in the host's log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error(
        "tenant `{tenant}`: activity type `{}` is exported by both {first} and {second}",
        Shown(.activity.as_str(), SHOWN_NAME)
    )]
    Duplicate {
        tenant: String,
        activity: String,
        first: String,
        second: String,
    },
    #[error(
        "tenant `{tenant}`: alias `{}` names `{}`, which no active component exports",
        Shown(.alias.as_str(), SHOWN_NAME),
        Shown(.target.as_str(), SHOWN_NAME)
    )]
    NoTarget {
        tenant: String,
        alias: String,
        target: String,
    },
    #[error(
        "tenant `{tenant}`: alias `{}` is already an activity type",
        Shown(.alias.as_str(), SHOWN_NAME)
    )]
    Shadows { tenant: String, alias: String },
    #[error("tenant `{tenant}`: a deployment's config: {source}")]
    Config {
        tenant: String,
        source: SecretShadows,
    },
}

/// A component to serve, with its deployment's own `wasi:config` laid
/// over the tenant's, and its own reuse.
#[derive(Debug, Clone)]
pub struct Deployment {
    pub component: Arc<LoadedComponent>,
    pub config: Vec<(String, String)>,
    pub reuse: DeploymentReuse,
    /// A candidate version taking a share of the tasks of the activity
    /// types it has in common with this one.
    pub canary: Option<(Box<Deployment>, Arc<Split>)>,
}

impl From<Arc<LoadedComponent>> for Deployment {
    fn from(component: Arc<LoadedComponent>) -> Self {
        Deployment {
            component,
            config: Vec::new(),
            reuse: DeploymentReuse::Tenant,
            canary: None,
        }
    }
}

impl Deployment {
    /// The policy its tasks run under: the tenant's, with the deployment's
    /// own config and reuse over it.
    fn runs_as(&self, tenant: &Arc<PreparedTenant>) -> Result<Arc<PreparedTenant>, RouteError> {
        if self.config.is_empty() && self.reuse == DeploymentReuse::Tenant {
            return Ok(tenant.clone());
        }
        let prepared = tenant
            .for_deployment(&self.config, self.reuse)
            .map_err(|source| RouteError::Config {
                tenant: tenant.name.clone(),
                source,
            })?;
        Ok(Arc::new(prepared))
    }

    /// A route to its component's `activity`.
    fn route(&self, runs_as: &Arc<PreparedTenant>, activity: &str) -> Route {
        Route {
            tenant: runs_as.clone(),
            component: self.component.clone(),
            activity: Arc::from(activity),
            side: None,
            cpu: Arc::default(),
        }
    }
}

/// Every tenant's activity types.
#[derive(Debug, Default)]
pub struct Registry {
    tenants: RwLock<HashMap<String, Arc<TenantRoutes>>>,
    /// Bumped whenever a tenant's routes are replaced, so connectors that
    /// announce activity types to their engine (Aion) can announce again.
    changes: tokio::sync::watch::Sender<u64>,
}

impl Registry {
    /// Sets (or replaces) a tenant's components and aliases. Two components
    /// exporting the same activity type, or an alias to a type no component
    /// exports, are refused, and the tenant keeps its previous routes.
    pub fn set_tenant(
        &self,
        tenant: PreparedTenant,
        components: &[Arc<LoadedComponent>],
        aliases: &[(String, String)],
    ) -> Result<(), RouteError> {
        self.install(Registry::prepare(tenant, components, aliases)?);
        Ok(())
    }

    /// Builds and checks a tenant's routes without serving them, so a
    /// caller can make its own change durable first, then [`install`] them.
    ///
    /// [`install`]: Registry::install
    pub fn prepare(
        tenant: PreparedTenant,
        components: &[Arc<LoadedComponent>],
        aliases: &[(String, String)],
    ) -> Result<TenantTable, RouteError> {
        let deployments: Vec<Deployment> =
            components.iter().cloned().map(Deployment::from).collect();
        Registry::prepare_deployments(tenant, &deployments, aliases)
    }

    /// [`Registry::prepare`] for deployments with their own config.
    pub fn prepare_deployments(
        tenant: PreparedTenant,
        deployments: &[Deployment],
        aliases: &[(String, String)],
    ) -> Result<TenantTable, RouteError> {
        Registry::build(Arc::new(tenant), deployments, aliases).map(TenantTable)
    }

    /// Serves a prepared table: the next task of the tenant is routed by it.
    pub fn install(&self, table: TenantTable) {
        let name = table.0.tenant.name.clone();
        self.write().insert(name, Arc::new(table.0));
        self.changes.send_modify(|generation| *generation += 1);
    }

    /// Wakes whenever any tenant's routes change.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn build(
        tenant: Arc<PreparedTenant>,
        deployments: &[Deployment],
        aliases: &[(String, String)],
    ) -> Result<TenantRoutes, RouteError> {
        let name = &tenant.name;
        let mut routes: HashMap<String, Route> = HashMap::new();
        let mut canaries = HashMap::new();
        for deployment in deployments {
            let runs_as = deployment.runs_as(&tenant)?;
            let component = &deployment.component;
            for activity in &component.activities {
                if let Some(existing) = routes.get(&*activity.name) {
                    return Err(RouteError::Duplicate {
                        tenant: name.clone(),
                        activity: activity.name.to_string(),
                        first: existing.component.digest.clone(),
                        second: component.digest.clone(),
                    });
                }
                routes.insert(
                    activity.name.to_string(),
                    deployment.route(&runs_as, &activity.name),
                );
            }
            if let Some((candidate, split)) = &deployment.canary {
                let candidate_runs_as = candidate.runs_as(&tenant)?;
                // Only the types both versions serve are split; the rest
                // stay on the active version until the candidate is.
                for activity in &candidate.component.activities {
                    if component.activity(&activity.name).is_some() {
                        canaries.insert(
                            activity.name.to_string(),
                            (
                                split.clone(),
                                candidate.route(&candidate_runs_as, &activity.name),
                                Routed::default(),
                            ),
                        );
                    }
                }
            }
        }
        for (alias, target) in aliases {
            let Some(route) = routes.get(target).cloned() else {
                return Err(RouteError::NoTarget {
                    tenant: name.clone(),
                    alias: alias.clone(),
                    target: target.clone(),
                });
            };
            if routes.contains_key(alias) {
                return Err(RouteError::Shadows {
                    tenant: name.clone(),
                    alias: alias.clone(),
                });
            }
            routes.insert(alias.clone(), route);
        }
        Ok(TenantRoutes {
            tenant,
            routes,
            canaries,
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<TenantRoutes>>> {
        self.tenants.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<TenantRoutes>>> {
        self.tenants.write().unwrap_or_else(|p| p.into_inner())
    }

    fn tenant_routes(&self, tenant: &str) -> Option<Arc<TenantRoutes>> {
        self.read().get(tenant).cloned()
    }

    /// The route of `activity_type` (a full name or an alias) for `tenant`;
    /// under a canary, the side the next task takes.
    pub fn route(&self, tenant: &str, activity_type: &str) -> Option<Route> {
        let tenants = self.read();
        let table = tenants.get(tenant)?;
        let mut route = table.routes.get(activity_type)?.clone();
        if let Some((split, candidate, routed)) = table.canaries.get(&*route.activity) {
            let side = split.take(routed);
            if side == Side::Candidate {
                route = candidate.clone();
            }
            route.side = Some((split.clone(), side));
        }
        Some(route)
    }

    /// Every name `activity_type` is served under for `tenant`: the name
    /// itself first, then its full name and every alias of that, so a
    /// limit set on any of them holds whichever name a task uses. Empty
    /// when the tenant does not serve it.
    pub fn names(&self, tenant: &str, activity_type: &str) -> Vec<String> {
        let Some(table) = self.tenant_routes(tenant) else {
            return Vec::new();
        };
        let Some(route) = table.routes.get(activity_type) else {
            return Vec::new();
        };
        let mut names = vec![activity_type.to_owned()];
        names.extend(
            table
                .routes
                .iter()
                .filter(|(name, other)| {
                    other.activity == route.activity && name.as_str() != activity_type
                })
                .map(|(name, _)| name.clone()),
        );
        names
    }

    /// A tenant's policy.
    pub fn tenant(&self, name: &str) -> Option<Arc<PreparedTenant>> {
        self.tenant_routes(name).map(|t| t.tenant.clone())
    }

    /// Every route of a tenant, by the name it is served under, sorted.
    pub fn routes(&self, tenant: &str) -> Vec<(String, Route)> {
        let Some(table) = self.tenant_routes(tenant) else {
            return Vec::new();
        };
        let mut routes: Vec<(String, Route)> = table
            .routes
            .iter()
            .map(|(name, route)| (name.clone(), route.clone()))
            .collect();
        routes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        routes
    }

    /// Every name a tenant serves (full names and aliases), sorted.
    pub fn activity_types(&self, tenant: &str) -> Vec<String> {
        self.routes(tenant)
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }
}
