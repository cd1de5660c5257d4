//! Making a stored version the one that serves its deployment: a tenant's
//! `activate` (and deploy) through the roll-out gate and ramp, an
//! operator's `approve` past them.

use std::collections::BTreeSet;

use super::super::rollout::{HoldOn, Ramp, beyond_grants};
use super::super::shadow::ReplayReport;
use super::{Catalog, ControlError, State, StoredCanary, TenantSpec, VersionView, now_ms};
use crate::control::store::{TenantIndex, Version};
use corral_core::sandbox::{ChangeReport, Changed, LoadedComponent, breaking};

/// What a version's own aliases (`--alias`) change for callers that use
/// them: an alias it drops breaks them (`removed`), one it points at
/// another activity type changes what they call (`changed`, breaking as the
/// two types' signatures say). An alias kept on the same type changes with
/// the type, which the report compares already.
fn alias_changes(
    report: &mut ChangeReport,
    (old, before): (&Version, &LoadedComponent),
    (new, after): (&Version, &LoadedComponent),
) {
    for (alias, target) in &old.aliases {
        match new.aliases.get(alias) {
            None => report
                .removed
                .push(format!("{alias} (an alias of {target})")),
            Some(now) if now != target => {
                let (Some(was), Some(is)) = (before.activity(target), after.activity(now)) else {
                    continue;
                };
                report.changed.push(Changed {
                    name: format!("{alias} (an alias of {target}, now of {now})"),
                    old: was.signature(),
                    new: is.signature(),
                    breaking: breaking(was, is),
                });
            }
            Some(_) => {}
        }
    }
}

/// What callers of `version` (loaded as `component`) call: its activity
/// types and its own aliases.
pub(super) fn called(version: &Version, component: &LoadedComponent) -> Vec<String> {
    component
        .activities
        .iter()
        .map(|a| a.name.to_string())
        .chain(version.aliases.keys().cloned())
        .collect()
}

/// What becomes of a version its tenant asks to serve.
pub(super) enum Admission {
    Activate,
    /// Held for the operator, with the reasons.
    Held(Vec<String>),
    /// Ramped up as its deployment's canary.
    Canary(StoredCanary),
}

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
        // Replayed before the catalog's lock is taken for the change: a
        // replay runs guests for a while.
        let replay = match approved {
            true => None,
            false => {
                let (version, candidate) = {
                    let mut state = self.state.lock().await;
                    let (_, version) = state.version(tenant, digest)?;
                    // Nothing unsigned is compiled or replayed.
                    Catalog::signed(spec, &version)?;
                    let candidate = self.loaded(&mut state, &version.digest).await?;
                    (version, candidate)
                };
                self.replay(spec, &version, &candidate).await?
            }
        };
        let mut state = self.state.lock().await;
        let (mut tenant_index, mut version) = state.version(tenant, digest)?;
        // Not even the operator's approval serves what is not signed.
        Catalog::signed(spec, &version)?;
        if !approved {
            let candidate = self.loaded(&mut state, &version.digest).await?;
            let report = self
                .report(&mut state, &tenant_index, &version, &candidate)
                .await?
                .map(|(_, report)| report);
            let admission = self
                .admission(
                    &mut state,
                    spec,
                    &tenant_index,
                    &version,
                    &candidate,
                    report.as_ref(),
                    spec.rollout.canary.as_ref(),
                    replay.as_ref(),
                )
                .await?;
            match admission {
                Admission::Activate => {}
                Admission::Held(held) => {
                    if version.held != held {
                        version.held.clone_from(&held);
                        tenant_index.put(&version);
                        self.commit(&mut state, spec, tenant_index).await?;
                    }
                    tracing::warn!(tenant, digest = %version.digest, deployment = %version.name, held = %held.join("; "), "activation held for an operator's approval");
                    return Err(ControlError::Held {
                        digest: version.digest,
                        deployment: version.name,
                        reasons: held,
                    });
                }
                Admission::Canary(canary) => {
                    // The operator's ramp: a version that never served
                    // starts as its deployment's canary.
                    let percent = Some(canary.percent());
                    tenant_index.canaries.insert(version.name.clone(), canary);
                    self.commit(&mut state, spec, tenant_index).await?;
                    tracing::info!(tenant, digest = %version.digest, deployment = %version.name, ?percent, "activated as a canary");
                    let component = state.loaded.get(&version.digest).cloned();
                    return Ok((
                        VersionView {
                            tenant: tenant.to_owned(),
                            version,
                            active: false,
                            component,
                            http_hosts: spec.http_hosts(),
                            canary: percent,
                        },
                        None,
                    ));
                }
            }
        }
        let was_held = !version.held.is_empty();
        version.held.clear();
        if approved {
            // The operator has looked: what the gate could not remember
            // holds nothing more.
            tenant_index.removed_unknown = false;
        }
        version.served = true;
        tenant_index.put(&version);
        if approved {
            tenant_index.rejected.retain(|(d, _)| *d != version.digest);
        }
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

    /// What `version` (loaded as `candidate`) changes against its
    /// deployment's active version: that version's digest and the report;
    /// `None` when nothing else of the deployment serves.
    pub(super) async fn report(
        &self,
        state: &mut State,
        tenant_index: &TenantIndex,
        version: &Version,
        candidate: &LoadedComponent,
    ) -> Result<Option<(String, ChangeReport)>, ControlError> {
        let Some(active) = tenant_index
            .active
            .get(&version.name)
            .filter(|active| **active != version.digest)
        else {
            return Ok(None);
        };
        let before = self.loaded(state, active).await?;
        let mut report = ChangeReport::between(&before, candidate);
        if let Ok(old) = tenant_index.find(active) {
            alias_changes(&mut report, (old, &before), (version, candidate));
        }
        Ok(Some((active.clone(), report)))
    }

    /// What becomes of `version` when its tenant asks it to serve: a held
    /// version stays held; one that served before activates; a new one goes
    /// through the tenant's gate, then (with a ramp, and a version of its
    /// deployment serving) starts as a canary, once its routes are known to
    /// hold when it is promoted.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn admission(
        &self,
        state: &mut State,
        spec: &TenantSpec,
        tenant_index: &TenantIndex,
        version: &Version,
        candidate: &LoadedComponent,
        report: Option<&ChangeReport>,
        ramp: Option<&Ramp>,
        replay: Option<&ReplayReport>,
    ) -> Result<Admission, ControlError> {
        if !version.held.is_empty() {
            return Ok(Admission::Held(version.held.clone()));
        }
        if version.served || tenant_index.is_active(version) {
            return Ok(Admission::Activate);
        }
        // `new-imports` holds on what nothing the tenant serves imports,
        // whichever deployment (a new name is no way around it).
        let mut served = BTreeSet::new();
        for active in tenant_index.active_versions() {
            let component = self.loaded(state, &active.digest).await?;
            served.extend(component.imports.iter().cloned());
        }
        let gate = ChangeReport {
            imports_added: candidate
                .imports
                .iter()
                .filter(|i| !served.contains(*i))
                .cloned()
                .collect(),
            ..report.cloned().unwrap_or_default()
        };
        let beyond = beyond_grants(&candidate.imports, &spec.tenant.capabilities);
        let mut held = spec.rollout.reasons(&gate, &beyond, replay);
        if spec.rollout.holds_on().any(|h| h == HoldOn::Breaking) {
            let names = called(version, candidate);
            held.extend(tenant_index.removed_callers(&version.name, &names, report.is_some()));
        }
        if !held.is_empty() {
            return Ok(Admission::Held(held));
        }
        let Some(ramp) = ramp else {
            return Ok(Admission::Activate);
        };
        if !tenant_index.active.contains_key(&version.name) {
            return Ok(Admission::Activate);
        }
        if let Some(running) = tenant_index
            .canaries
            .get(&version.name)
            .filter(|c| c.candidate == version.digest)
        {
            // The same candidate again (a restarted follower's pull): its
            // ramp goes on where it is.
            return Ok(Admission::Canary(running.clone()));
        }
        let mut promoted = tenant_index.clone();
        promoted
            .active
            .insert(version.name.clone(), version.digest.clone());
        promoted.canaries.remove(&version.name);
        self.routes(state, spec, &mut promoted).await?;
        Ok(Admission::Canary(StoredCanary {
            candidate: version.digest.clone(),
            ramp: ramp.clone(),
            step: 0,
            step_started_ms: now_ms(),
        }))
    }

    /// Sets the `corral_versions_held` gauge of `tenant` from its index.
    pub(super) fn count_held(&self, tenant: &str, tenant_index: Option<&TenantIndex>) {
        let held = tenant_index.map_or(0, |t| {
            t.versions.iter().filter(|v| !v.held.is_empty()).count()
        });
        self.metrics.versions_held(tenant, held);
    }
}
