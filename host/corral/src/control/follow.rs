//! Following a tag: a fleet's roll-out without a coordinator. Every host
//! resolves each followed `oci://…:tag` periodically (with jitter, so a
//! fleet does not ask the registry at once) and, when it names a new
//! manifest, pulls it by digest and activates it exactly as an upload
//! would: running tasks finish on their version. A digest that fails to
//! load is not activated; the previous version keeps serving and the
//! failure shows in `corral status` and `/metrics` until the tag moves.
//! A digest its tenant's trust refuses (no signature by a trusted key yet)
//! is neither pulled nor served, and is asked about again every interval:
//! a pipeline that signs after it pushes rolls out once it has signed.
//!
//! Each followed tag is checked on its own schedule, within the pull's own
//! deadline: a slow or hostile registry delays its own roll-outs, never
//! another tag's or another tenant's.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::ControlError;
use super::catalog::{Catalog, NewVersion};
use super::metadata::Pulled;
use crate::oci::{self, OciError, OciRef, Registries};
use corral_core::metrics::escape;
use corral_core::sync::lock;

/// One followed tag, as `status` and `/metrics` show it.
#[derive(Clone, Debug, Default)]
pub struct FollowState {
    pub reference: String,
    pub deployment: String,
    /// The manifest the tag named when last resolved.
    pub wanted: Option<String>,
    /// The component digest this follower last activated.
    pub active: Option<String>,
    /// Why the last check failed (cleared by a success).
    pub last_error: Option<String>,
    /// The component digest pulled last that the tenant's roll-out holds
    /// for an operator's approval (cleared when another activates).
    pub held: Option<String>,
    /// A manifest that failed to load: not tried again until the tag moves.
    failed: Option<String>,
    /// The manifest last refused for want of a trusted signature: checked
    /// again every interval (a pipeline signs after it pushes).
    unsigned: Option<String>,
}

/// Why a followed tag's new manifest was not activated.
#[derive(Debug, thiserror::Error)]
enum ActivateError {
    #[error(transparent)]
    Pull(#[from] OciError),
    #[error(transparent)]
    Upload(#[from] ControlError),
}

/// What became of a followed tag's new manifest: its component digest.
enum Landed {
    Active(String),
    Held(String),
    /// Ramping up as its deployment's canary, at this percent.
    Canary(String, u32),
}

/// The followed tags of every tenant, and their state.
pub struct Follower {
    catalog: Arc<Catalog>,
    interval: Duration,
    /// (Tenant, reference, the registries with the tenant's credentials).
    follows: Vec<(String, OciRef, Registries)>,
    states: Mutex<BTreeMap<(String, String), FollowState>>,
}

impl Follower {
    pub fn new(
        catalog: Arc<Catalog>,
        interval: Duration,
        follows: Vec<(String, OciRef, Registries)>,
    ) -> Self {
        let states = follows
            .iter()
            .map(|(tenant, reference, _)| {
                let state = FollowState {
                    reference: reference.to_string(),
                    deployment: reference.repository_name().to_owned(),
                    ..FollowState::default()
                };
                ((tenant.clone(), reference.to_string()), state)
            })
            .collect();
        Follower {
            catalog,
            interval,
            follows,
            states: Mutex::new(states),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.follows.is_empty()
    }

    /// Follows every tag, each on its own: checked at once, then every
    /// interval (plus up to a fifth of it at random), until `shutdown`.
    /// Returns once every tag has been checked once, or after `wait`, so a
    /// host on an empty disk serves its tags from the start, and a slow
    /// registry holds up no more than `wait` of the start.
    pub async fn start(self: Arc<Self>, shutdown: CancellationToken, wait: Duration) {
        let checked = Arc::new(tokio::sync::Semaphore::new(0));
        for i in 0..self.follows.len() {
            let (this, shutdown, checked) = (self.clone(), shutdown.clone(), checked.clone());
            tokio::spawn(async move {
                let (tenant, reference, registries) = &this.follows[i];
                let mut next = Duration::ZERO;
                loop {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(next) => {
                            this.check(tenant, reference, registries).await;
                        }
                    }
                    if next.is_zero() {
                        checked.add_permits(1);
                    }
                    next = this.interval + jitter(this.interval);
                }
            });
        }
        let all = u32::try_from(self.follows.len()).unwrap_or(u32::MAX);
        if tokio::time::timeout(wait, checked.acquire_many(all))
            .await
            .is_err()
        {
            tracing::warn!(
                "followed tags not all checked within {wait:?} (a slow registry?); serving meanwhile, and they go on"
            );
        }
    }

    async fn check(&self, tenant: &str, reference: &OciRef, registries: &Registries) {
        let key = (tenant.to_owned(), reference.to_string());
        let update = |change: &dyn Fn(&mut FollowState)| {
            if let Some(state) = lock(&self.states).get_mut(&key) {
                change(state);
            }
        };
        let wanted = match oci::resolve(reference, registries).await {
            Ok(digest) => digest,
            Err(e) => {
                let message = crate::error_chain(&e);
                tracing::warn!(tenant, "following {reference}: {message}");
                update(&|s| s.last_error = Some(message.clone()));
                return;
            }
        };
        let (known, failed, unsigned, said) = {
            let states = lock(&self.states);
            let state = states.get(&key);
            (
                state.and_then(|s| s.wanted.clone()),
                state.and_then(|s| s.failed.clone()),
                state.and_then(|s| s.unsigned.clone()),
                state.and_then(|s| s.last_error.clone()),
            )
        };
        let awaiting_signature = unsigned.as_deref() == Some(&wanted);
        if failed.as_deref() == Some(&wanted)
            || (known.as_deref() == Some(&wanted) && failed.is_none() && !awaiting_signature)
        {
            return;
        }
        update(&|s| s.wanted = Some(wanted.clone()));
        match self.activate(tenant, reference, &wanted, registries).await {
            Ok(Landed::Active(active)) => {
                tracing::info!(
                    tenant,
                    "following {reference}: activated {active} ({wanted})"
                );
                update(&|s| {
                    s.active = Some(active.clone());
                    s.held = None;
                    s.last_error = None;
                    s.failed = None;
                    s.unsigned = None;
                });
            }
            Ok(Landed::Canary(digest, percent)) => {
                // The catalog ramps it on (status shows it as a canary).
                tracing::info!(
                    tenant,
                    "following {reference}: {digest} ({wanted}) ramps up as a canary from {percent}%"
                );
                update(&|s| {
                    s.held = None;
                    s.last_error = None;
                    s.failed = None;
                    s.unsigned = None;
                });
            }
            Ok(Landed::Held(digest)) => {
                // The catalog logged why; it waits for `corral approve`.
                tracing::warn!(
                    tenant,
                    "following {reference}: {digest} ({wanted}) is held for an operator's approval"
                );
                update(&|s| {
                    s.held = Some(digest.clone());
                    s.last_error = None;
                    s.failed = None;
                    s.unsigned = None;
                });
            }
            Err(ActivateError::Upload(error @ ControlError::Unsigned { .. })) => {
                // Asked again each interval, said when the reason changes.
                let message = crate::error_chain(&error);
                if !awaiting_signature || said.as_deref() != Some(message.as_str()) {
                    tracing::warn!(
                        tenant,
                        "following {reference}: {wanted} not activated (checked again every interval): {message}"
                    );
                }
                update(&|s| {
                    s.last_error = Some(message.clone());
                    s.unsigned = Some(wanted.clone());
                });
            }
            Err(error) => {
                let message = crate::error_chain(&error);
                tracing::warn!(
                    tenant,
                    "following {reference}: {wanted} not activated: {message}"
                );
                update(&|s| {
                    s.last_error = Some(message.clone());
                    s.failed = Some(wanted.clone());
                    s.unsigned = None;
                });
            }
        }
    }

    /// Pulls `reference` at `manifest` and activates it, as the tenant's
    /// roll-out lets it; the component's digest, or why not.
    async fn activate(
        &self,
        tenant: &str,
        reference: &OciRef,
        manifest: &str,
        registries: &Registries,
    ) -> Result<Landed, ActivateError> {
        // A new digest no trusted key signed is not pulled, nor served:
        // the last good version serves on, and the follow says why. (The
        // pull is pinned to the digest verified.)
        let signer = self
            .catalog
            .pulled_signer(tenant, reference, manifest, registries)
            .await?;
        let pinned = reference.at_digest(manifest);
        let pulled = oci::pull(&pinned, registries, self.catalog.staging()).await?;
        let new = NewVersion {
            name: reference.repository_name().to_owned(),
            aliases: BTreeMap::new(),
            labels: BTreeMap::new(),
            config: BTreeMap::new(),
            reuse: Default::default(),
            inactive: false,
            canary: None,
            pulled: Some(Pulled {
                reference: reference.to_string(),
                manifest: pulled.manifest_digest,
            }),
            signer,
        };
        let (view, uploaded) = self.catalog.upload(tenant, new, pulled.component).await?;
        if let Some((against, report)) = &uploaded.changes {
            // Counts only: the names are the component's.
            tracing::info!(
                tenant,
                deployment = %view.version.name,
                %against,
                added = report.added.len(),
                removed = report.removed.len(),
                changed = report.changed.len(),
                breaks_callers = report.breaks_callers(),
                "followed tag: what the new version changes"
            );
        }
        Ok(match (view.active, view.canary) {
            (true, _) => Landed::Active(view.version.digest),
            (false, Some(percent)) => Landed::Canary(view.version.digest, percent),
            (false, None) => Landed::Held(view.version.digest),
        })
    }

    /// The state of `tenant`'s followed tags.
    pub fn states(&self, tenant: &str) -> Vec<FollowState> {
        lock(&self.states)
            .iter()
            .filter(|((t, _), _)| t == tenant)
            .map(|(_, state)| state.clone())
            .collect()
    }

    /// Prometheus lines: per followed tag, what it names and what this host
    /// activated (`corral_follow_info`), and whether its last check failed.
    pub fn render(&self) -> String {
        let mut text = String::new();
        let states = lock(&self.states);
        if states.is_empty() {
            return text;
        }
        text.push_str("# TYPE corral_follow_info gauge\n");
        for ((tenant, _), s) in states.iter() {
            let _ = writeln!(
                text,
                "corral_follow_info{{tenant=\"{}\",deployment=\"{}\",reference=\"{}\",wanted=\"{}\",active=\"{}\"}} 1",
                escape(tenant),
                escape(&s.deployment),
                escape(&s.reference),
                escape(s.wanted.as_deref().unwrap_or("")),
                escape(s.active.as_deref().unwrap_or("")),
            );
        }
        text.push_str("# TYPE corral_follow_failing gauge\n");
        for ((tenant, _), s) in states.iter() {
            let _ = writeln!(
                text,
                "corral_follow_failing{{tenant=\"{}\",deployment=\"{}\",reference=\"{}\"}} {}",
                escape(tenant),
                escape(&s.deployment),
                escape(&s.reference),
                u8::from(s.last_error.is_some()),
            );
        }
        text
    }
}

/// Up to a fifth of `interval`, at random: a fleet does not ask a registry
/// all at once.
fn jitter(interval: Duration) -> Duration {
    let mut bytes = [0u8; 4];
    match getrandom::fill(&mut bytes) {
        Ok(()) => {
            interval.mul_f64(f64::from(u32::from_le_bytes(bytes)) / f64::from(u32::MAX) / 5.0)
        }
        Err(_) => Duration::ZERO,
    }
}
