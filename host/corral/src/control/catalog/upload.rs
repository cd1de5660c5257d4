//! Storing a new version: checked, compiled, counted against the tenant's
//! quota, put through its roll-out (gate or canary), written, and only then
//! served.

use super::{
    Catalog, ControlError, NewVersion, StoredCanary, StoredReuse, Uploaded, Version, VersionView,
    beyond_grants, metadata, now_ms,
};
use crate::staging::StagedComponent;
use corral_core::name::Name;
use corral_core::sandbox::ChangeReport;

impl Catalog {
    /// Validates, compiles, stores and (unless asked not to) activates a
    /// staged component. Returns the version, whether it was already
    /// stored, and what it changes against the active one.
    pub async fn upload(
        &self,
        tenant: &str,
        new: NewVersion,
        component: StagedComponent,
    ) -> Result<(VersionView, Uploaded), ControlError> {
        let spec = self.spec(tenant)?;
        Name::new(new.name.as_str()).map_err(ControlError::DeploymentName)?;
        metadata::check(&new.labels, &new.aliases, &new.config)?;
        let digest = component.digest.clone();
        let mut candidate = Version {
            name: new.name.clone(),
            digest: digest.clone(),
            size: component.size,
            uploaded_at_ms: now_ms(),
            aliases: new.aliases.clone(),
            labels: new.labels.clone(),
            from_config: false,
            config: new.config.clone(),
            compiled: 0,
            pulled: new.pulled.clone(),
            reuse: StoredReuse::of(new.reuse),
            held: Vec::new(),
            served: false,
        };
        // Refused before compiling, and again (with the compiled size, and
        // the index may have changed meanwhile) before anything is written.
        self.admit(&*self.state.lock().await, spec, &candidate)?;
        let loaded = match self.load(component.path(), &digest).await {
            Ok(loaded) => loaded,
            Err(e) => {
                // Compiled and cached before a later check refused it.
                self.store
                    .forget_bytes(&digest, &self.state.lock().await.index);
                return Err(e);
            }
        };
        candidate.compiled = self.sandbox.compiled_size(&digest).unwrap_or(0);
        let mut state = self.state.lock().await;
        let mut tenant_index = state.index.tenants.get(tenant).cloned().unwrap_or_default();
        let existing = tenant_index
            .versions
            .iter()
            .find(|v| v.digest == digest)
            .cloned();
        let already_stored = existing.is_some();
        let mut version = match existing {
            Some(v) if v.name != new.name => {
                return Err(ControlError::StoredAsAnother {
                    digest,
                    stored: v.name,
                    asked: new.name,
                });
            }
            Some(mut v) => {
                // The same bytes, deployed with other settings: the
                // settings are the version's, so they change with it.
                v.config = new.config.clone();
                v.reuse = StoredReuse::of(new.reuse);
                v
            }
            None => candidate,
        };
        if let Err(e) = self.admit(&state, spec, &version) {
            if !already_stored {
                self.store.forget_bytes(&digest, &state.index);
            }
            return Err(e);
        }
        let changes = tenant_index
            .active
            .get(&version.name)
            .filter(|active| **active != digest)
            .and_then(|active| {
                let before = state.loaded.get(active)?;
                Some((active.clone(), ChangeReport::between(before, &loaded)))
            });
        let beyond_grants = beyond_grants(&loaded.imports, &spec.tenant.capabilities);
        // The gate: a version that never served its deployment activates
        // by itself only when the tenant's roll-out lets it. One held
        // already (by the gate, or rolled back by its canary) stays held.
        if !new.inactive
            && !version.served
            && !tenant_index.is_active(&version)
            && version.held.is_empty()
        {
            version.held = spec
                .rollout
                .reasons(changes.as_ref().map(|(_, r)| r), &beyond_grants);
        }
        let mut activate = !new.inactive && version.held.is_empty();
        let replaces = tenant_index
            .active
            .get(&version.name)
            .is_some_and(|active| *active != digest);
        let ramp = new.canary.clone().or_else(|| spec.rollout.canary.clone());
        let canary = match ramp {
            Some(ramp) if activate && replaces => {
                activate = false;
                Some(StoredCanary {
                    candidate: digest.clone(),
                    ramp,
                    step: 0,
                    step_started_ms: now_ms(),
                })
            }
            _ => None,
        };
        version.served |= activate;
        match tenant_index
            .versions
            .iter_mut()
            .find(|s| s.digest == digest)
        {
            Some(stored) => *stored = version.clone(),
            None => tenant_index.versions.push(version.clone()),
        }
        if activate {
            tenant_index
                .active
                .insert(version.name.clone(), digest.clone());
        }
        let canary_percent = canary.as_ref().map(|c| c.ramp.steps()[0]);
        // A new version (active or a canary) ends the deployment's canary.
        if activate || canary.is_some() {
            tenant_index.canaries.remove(&version.name);
        }
        if let Some(canary) = canary {
            tenant_index.canaries.insert(version.name.clone(), canary);
        }
        state.loaded.insert(digest.clone(), loaded.clone());
        let stored = self
            .store
            .put_staged(component)
            .map_err(|e| ControlError::host("storing the component", e));
        if let Err(e) = match stored {
            Ok(()) => self.commit(&mut state, spec, tenant_index).await,
            Err(e) => Err(e),
        } {
            // A rejected upload stores nothing.
            if !already_stored {
                self.store.forget_bytes(&digest, &state.index);
                state.loaded.remove(&digest);
            }
            return Err(e);
        }
        if activate {
            self.metrics.activation(tenant);
        }
        if let Some(percent) = canary_percent {
            tracing::info!(tenant, digest = %digest, deployment = %version.name, percent, "stored, a canary: it takes {percent}% of its deployment's tasks");
        } else if version.held.is_empty() {
            tracing::info!(tenant, digest = %digest, deployment = %version.name, active = activate, "stored");
        } else {
            tracing::warn!(tenant, digest = %digest, deployment = %version.name, held = %version.held.join("; "), "stored, held for an operator's approval by the tenant's rollout");
        }
        Ok((
            VersionView {
                tenant: tenant.to_owned(),
                version,
                active: activate,
                component: Some(loaded),
                http_hosts: spec.http_hosts(),
                canary: canary_percent,
            },
            Uploaded {
                already_stored,
                changes,
                beyond_grants,
            },
        ))
    }
}
