//! Making a stored version the one that serves its deployment: a tenant's
//! `activate` through the roll-out gate, an operator's `approve` past it.

use super::super::rollout::beyond_grants;
use super::{Catalog, ControlError, State, TenantSpec, VersionView};
use crate::control::store::{TenantIndex, Version};

impl Catalog {
    /// Makes a stored version the active one of its deployment, if the
    /// tenant's roll-out lets it (a version that served before always
    /// may). A held version is marked so, and refused with the reasons.
    pub async fn activate(
        &self,
        tenant: &str,
        digest: &str,
    ) -> Result<(VersionView, Option<String>), ControlError> {
        self.make_active(tenant, digest, false).await
    }

    /// The operator's approval: activates a version whatever the tenant's
    /// roll-out holds it for, and clears its hold.
    pub async fn approve(
        &self,
        tenant: &str,
        digest: &str,
    ) -> Result<(VersionView, Option<String>), ControlError> {
        self.make_active(tenant, digest, true).await
    }

    async fn make_active(
        &self,
        tenant: &str,
        digest: &str,
        approved: bool,
    ) -> Result<(VersionView, Option<String>), ControlError> {
        let spec = self.spec(tenant)?;
        let mut state = self.state.lock().await;
        let (mut tenant_index, mut version) = state.version(tenant, digest)?;
        if !approved && !version.served && !tenant_index.is_active(&version) {
            let held = if version.held.is_empty() {
                self.gate(&mut state, spec, &tenant_index, &version).await?
            } else {
                version.held.clone()
            };
            if !held.is_empty() {
                version.held.clone_from(&held);
                replace(&mut tenant_index, &version);
                self.commit(&mut state, spec, tenant_index).await?;
                tracing::warn!(tenant, digest = %version.digest, deployment = %version.name, held = %held.join("; "), "activation held for an operator's approval by the tenant's rollout");
                return Err(ControlError::Held {
                    digest: version.digest,
                    deployment: version.name,
                    reasons: held,
                });
            }
        }
        let was_held = !version.held.is_empty();
        version.held.clear();
        version.served = true;
        replace(&mut tenant_index, &version);
        let previous = tenant_index
            .active
            .insert(version.name.clone(), version.digest.clone())
            .filter(|p| *p != version.digest);
        // An activation ends the deployment's canary: it promotes the
        // candidate, or chooses another version over it.
        tenant_index.canaries.remove(&version.name);
        self.commit(&mut state, spec, tenant_index).await?;
        self.metrics.activation(tenant);
        tracing::info!(tenant, digest = %version.digest, deployment = %version.name, previous = ?previous, approved, was_held, "activated");
        let component = state.loaded.get(&version.digest).cloned();
        Ok((
            VersionView {
                tenant: tenant.to_owned(),
                version,
                active: true,
                component,
                http_hosts: spec.http_hosts(),
                canary: None,
            },
            previous,
        ))
    }

    /// Why the tenant's roll-out holds `version` against its deployment's
    /// active one; empty: it may activate.
    async fn gate(
        &self,
        state: &mut State,
        spec: &TenantSpec,
        tenant_index: &TenantIndex,
        version: &Version,
    ) -> Result<Vec<String>, ControlError> {
        if spec.rollout == Default::default() {
            return Ok(Vec::new());
        }
        let candidate = self.loaded(state, &version.digest).await?;
        let report = match tenant_index.active.get(&version.name) {
            Some(active) => {
                let before = self.loaded(state, active).await?;
                Some(corral_core::sandbox::ChangeReport::between(
                    &before, &candidate,
                ))
            }
            None => None,
        };
        let beyond = beyond_grants(&candidate.imports, &spec.tenant.capabilities);
        Ok(spec.rollout.reasons(report.as_ref(), &beyond))
    }

    /// Sets the `corral_versions_held` gauge of `tenant` from its index.
    pub(super) fn count_held(&self, tenant: &str, tenant_index: Option<&TenantIndex>) {
        let held = tenant_index.map_or(0, |t| {
            t.versions.iter().filter(|v| !v.held.is_empty()).count()
        });
        self.metrics.versions_held(tenant, held);
    }
}

/// `version` in place of the stored one with its digest.
fn replace(tenant_index: &mut TenantIndex, version: &Version) {
    if let Some(stored) = tenant_index
        .versions
        .iter_mut()
        .find(|v| v.digest == version.digest)
    {
        *stored = version.clone();
    }
}
