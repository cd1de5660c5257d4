//! Storing a new version: checked, compiled, counted against the tenant's
//! quota, put through its roll-out (gate or canary), written, and only then
//! served.

use super::activate::Admission;
use super::{
    Catalog, ControlError, NewVersion, State, StoredCanary, StoredReuse, Uploaded, Version,
    VersionView, beyond_grants, metadata, now_ms,
};
use crate::staging::StagedComponent;
use corral_core::name::Name;

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
        // The operator's ramp, when set, is the tenant's only one.
        let ramp = match (&new.canary, &spec.rollout.canary) {
            (Some(_), Some(_)) => return Err(ControlError::CanarySet(tenant.to_owned())),
            (Some(ramp), None) | (None, Some(ramp)) => Some(ramp.clone()),
            (None, None) => None,
        };
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
            signer: new.signer.clone(),
        };
        // Nothing unsigned is compiled for a tenant that requires
        // signatures (the callers verified and refused with the reason).
        Catalog::signed(spec, &candidate)?;
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
        // Before the catalog's lock: a replay runs guests for a while.
        let replay = match new.inactive {
            true => None,
            false => match self.replay(spec, &candidate, &loaded).await {
                Ok(replay) => replay,
                Err(e) => {
                    self.store
                        .forget_bytes(&digest, &self.state.lock().await.index);
                    return Err(e);
                }
            },
        };
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
                if new.signer.is_some() {
                    // Signed by a key trusted now: held for want of one no more.
                    v.signer.clone_from(&new.signer);
                    v.held.retain(|h| h != super::signed::DISTRUSTED);
                }
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
        if !already_stored {
            // Bytes held before and removed: the hold comes back with them.
            if let Some((_, reasons)) = tenant_index.rejected.iter().find(|(d, _)| *d == digest) {
                version.held.clone_from(reasons);
                // But not for want of a signer it has now.
                if spec.trust.admits(version.signer.as_deref()) {
                    version.held.retain(|h| h != super::signed::DISTRUSTED);
                }
            }
        }
        let was_active = tenant_index.is_active(&version);
        state.loaded.insert(digest.clone(), loaded.clone());
        tenant_index.put(&version);
        let decided = async {
            let changes = self
                .report(&mut state, &tenant_index, &version, &loaded)
                .await?;
            let admission = match new.inactive {
                true => None,
                false => Some(
                    self.admission(
                        &mut state,
                        spec,
                        &tenant_index,
                        &version,
                        &loaded,
                        changes.as_ref().map(|(_, r)| r),
                        ramp.as_ref(),
                        replay.as_ref(),
                    )
                    .await?,
                ),
            };
            Ok::<_, ControlError>((changes, admission))
        }
        .await;
        let (changes, admission) = match decided {
            Ok(decided) => decided,
            Err(e) => {
                self.abandon(&mut state, &digest, already_stored);
                return Err(e);
            }
        };
        let beyond_grants = beyond_grants(&loaded.imports, &spec.tenant.capabilities);
        let (activate, canary) = match admission {
            None => (false, None),
            Some(Admission::Activate) => (true, None),
            Some(Admission::Held(reasons)) => {
                version.held = reasons;
                (false, None)
            }
            Some(Admission::Canary(canary)) => (false, Some(canary)),
        };
        version.served |= activate;
        tenant_index.put(&version);
        if activate {
            tenant_index
                .active
                .insert(version.name.clone(), digest.clone());
        }
        let canary_percent = canary.as_ref().map(StoredCanary::percent);
        // A new version (active or a canary) ends the deployment's canary;
        // the active bytes deployed again (a config change) do not.
        if (activate && !was_active) || canary.is_some() {
            tenant_index.canaries.remove(&version.name);
        }
        if let Some(canary) = canary {
            tenant_index.canaries.insert(version.name.clone(), canary);
        }
        let stored = self
            .store
            .put_staged(component)
            .map_err(|e| ControlError::host("storing the component", e));
        if let Err(e) = match stored {
            Ok(()) => self.commit(&mut state, spec, tenant_index).await,
            Err(e) => Err(e),
        } {
            self.abandon(&mut state, &digest, already_stored);
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
            tracing::warn!(tenant, digest = %digest, deployment = %version.name, held = %version.held.join("; "), "stored, held for an operator's approval");
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
                replay,
            },
        ))
    }

    /// A refused upload stores nothing: bytes it brought are forgotten,
    /// and its compiled copy too unless something serves those bytes.
    fn abandon(&self, state: &mut State, digest: &str, already_stored: bool) {
        if !already_stored {
            self.store.forget_bytes(digest, &state.index);
        }
        state.sweep();
    }
}
