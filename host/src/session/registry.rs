//! Which component serves which activity type for which tenant, with the
//! tenant's aliases (Temporal users like short names such as `Greet`).

use std::collections::HashMap;
use std::sync::Arc;

use crate::sandbox::{LoadedComponent, Tenant};

/// Where a task goes.
#[derive(Debug, Clone)]
pub struct Route {
    pub tenant: Arc<Tenant>,
    pub component: Arc<LoadedComponent>,
    /// The full activity type name inside the component.
    pub activity: String,
}

/// Every tenant's activity types.
#[derive(Debug, Default)]
pub struct Registry {
    routes: HashMap<(String, String), Route>,
    tenants: HashMap<String, Arc<Tenant>>,
}

impl Registry {
    /// Adds a tenant's components and aliases. Two components exporting the
    /// same activity type, or an alias to a type no component exports, are
    /// refused here, before anything is served.
    pub fn add_tenant(
        &mut self,
        tenant: Tenant,
        components: &[Arc<LoadedComponent>],
        aliases: &[(String, String)],
    ) -> Result<(), String> {
        let tenant = Arc::new(tenant);
        let name = tenant.name.clone();
        for component in components {
            for activity in &component.activities {
                let key = (name.clone(), activity.name.clone());
                if let Some(existing) = self.routes.get(&key) {
                    return Err(format!(
                        "tenant `{name}`: activity type `{}` is exported by both {} and {}",
                        activity.name, existing.component.digest, component.digest
                    ));
                }
                self.routes.insert(
                    key,
                    Route {
                        tenant: tenant.clone(),
                        component: component.clone(),
                        activity: activity.name.clone(),
                    },
                );
            }
        }
        for (alias, target) in aliases {
            let Some(route) = self.routes.get(&(name.clone(), target.clone())).cloned() else {
                return Err(format!(
                    "tenant `{name}`: alias `{alias}` names `{target}`, which no component exports"
                ));
            };
            if self.routes.contains_key(&(name.clone(), alias.clone())) {
                return Err(format!(
                    "tenant `{name}`: alias `{alias}` is already an activity type"
                ));
            }
            self.routes.insert((name.clone(), alias.clone()), route);
        }
        self.tenants.insert(name, tenant);
        Ok(())
    }

    /// The route of `activity_type` (a full name or an alias) for `tenant`.
    pub fn route(&self, tenant: &str, activity_type: &str) -> Option<&Route> {
        self.routes
            .get(&(tenant.to_owned(), activity_type.to_owned()))
    }

    /// A tenant's policy.
    pub fn tenant(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.tenants.get(name)
    }

    /// Every route of a tenant, by the name it is served under, sorted.
    pub fn routes(&self, tenant: &str) -> Vec<(&str, &Route)> {
        let mut routes: Vec<(&str, &Route)> = self
            .routes
            .iter()
            .filter(|((t, _), _)| t == tenant)
            .map(|((_, name), route)| (name.as_str(), route))
            .collect();
        routes.sort_unstable_by_key(|(name, _)| *name);
        routes
    }

    /// Every name a tenant serves (full names and aliases), sorted.
    pub fn activity_types(&self, tenant: &str) -> Vec<&str> {
        self.routes(tenant)
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }
}
