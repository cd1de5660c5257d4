//! Canaries: a candidate version takes a share of its deployment's tasks,
//! ramped up step by step on a schedule, and is rolled back by itself when
//! its failures of any class pass the active version's by the ramp's
//! margin. Each side's outcomes are counted where the task ends (the
//! session's [`Split`]); this module moves the ramp on, once a second.
//!
//! A task takes its side when it is routed, so neither a step nor a
//! roll-back moves a running task: it finishes on the version it started
//! with, and its outcome is reported as any other's.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Catalog, ControlError, State, StoredCanary, TenantIndex, Version, now_ms};
use corral_core::metrics::escape;
use corral_core::sandbox::FailureClass;
use corral_core::session::canary::WHOLE;
use corral_core::session::{Counts, Deployment, Side, Split};
use corral_core::sync::lock;

/// A canary serving now, as `status` and `/metrics` show it.
#[derive(Debug, Clone)]
pub struct Live {
    pub tenant: String,
    pub deployment: String,
    pub canary: StoredCanary,
    pub split: Arc<Split>,
}

/// A canary's split as a change needs it: (deployment, candidate, split,
/// share), applied only once the change is written.
pub(super) type PendingSplit = (String, String, Arc<Split>, u32);

/// How often recorded attempts that changed are written: a host that
/// stops without draining loses at most this much of its sample.
pub const FLUSH_EVERY: Duration = Duration::from_secs(5);

impl Catalog {
    /// The candidate deployment of a canary, and its split: the one it had
    /// while the candidate stays the same (its counts go on), a new one for
    /// a new candidate; at the share of the ramp's current step.
    pub(super) async fn candidate(
        &self,
        state: &mut State,
        tenant: &str,
        deployment: &str,
        canary: &StoredCanary,
        candidate: &Version,
    ) -> Result<(Deployment, PendingSplit), ControlError> {
        // As read back from the index, checked again.
        canary.ramp.clone().checked()?;
        let split = match state
            .splits
            .get(&(tenant.to_owned(), deployment.to_owned()))
        {
            Some((digest, split)) if *digest == canary.candidate => split.clone(),
            _ => Arc::new(Split::new(0)),
        };
        let component = Deployment {
            component: self.loaded(state, &candidate.digest).await?,
            config: candidate.config.clone().into_iter().collect(),
            reuse: candidate.deployment_reuse()?,
            canary: None,
        };
        let pending = (
            deployment.to_owned(),
            canary.candidate.clone(),
            split,
            canary.percent() * WHOLE / 100,
        );
        Ok((component, pending))
    }

    /// Moves every canary's ramp on once a second, and writes the recorded
    /// attempts that changed every [`FLUSH_EVERY`], until `shutdown`.
    pub async fn run_canaries(self: Arc<Self>, shutdown: CancellationToken) {
        let mut flushed = std::time::Instant::now();
        let mut ticks = tokio::time::interval(Duration::from_secs(1));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => {
                    self.advance_canaries(now_ms()).await;
                    if flushed.elapsed() >= FLUSH_EVERY {
                        flushed = std::time::Instant::now();
                        let samples = self.samples.clone();
                        // Serializing and writing a sample takes a while:
                        // off the host's runtime.
                        let _ = tokio::task::spawn_blocking(move || samples.flush()).await;
                    }
                }
            }
        }
    }

    /// Rolls back each canary whose candidate fails past its margin, steps
    /// on those whose step has run its time, and makes the candidate the
    /// active version after the last step, once it has run `min_tasks` of
    /// its own. Each canary's change is written on its own: one that cannot
    /// be promoted (its routes no longer hold) is held with the reason, and
    /// holds up no other.
    pub async fn advance_canaries(&self, now: i64) {
        for spec in self.tenants.values() {
            let name = &spec.tenant.name;
            let mut state = self.state.lock().await;
            let Some(index) = state.index.tenants.get(name) else {
                continue;
            };
            let canaries: Vec<(String, StoredCanary)> = index
                .canaries
                .iter()
                .map(|(d, c)| (d.clone(), c.clone()))
                .collect();
            for (deployment, canary) in canaries {
                let key = (name.clone(), deployment.clone());
                let Some((_, split)) = state.splits.get(&key) else {
                    continue;
                };
                let (active, candidate) = split.counts();
                let Some(change) = Change::due(&canary, &active, &candidate, now) else {
                    continue;
                };
                let Some(mut next) = state.index.tenants.get(name).cloned() else {
                    continue;
                };
                change.apply(&mut next, &deployment, &canary, now);
                match self.commit(&mut state, spec, next).await {
                    Ok(()) => change.done(self, name, &deployment, &canary),
                    Err(e) => {
                        let why = crate::error_chain(&e);
                        tracing::error!(tenant = %name, %deployment, candidate = %canary.candidate, "moving a canary on: {why}");
                        // It cannot go on as it is: held, with the reason.
                        let Some(mut next) = state.index.tenants.get(name).cloned() else {
                            continue;
                        };
                        Change::RollBack(format!("its canary could not go on: {why}")).apply(
                            &mut next,
                            &deployment,
                            &canary,
                            now,
                        );
                        if let Err(e) = self.commit(&mut state, spec, next).await {
                            tracing::error!(tenant = %name, %deployment, "ending a canary: {}", crate::error_chain(&e));
                        }
                    }
                }
            }
        }
    }

    /// After a commit: the canaries serving now, for `/metrics`.
    pub(super) fn canaries_changed(&self, state: &mut State) {
        let mut live = Vec::new();
        let mut kept = std::collections::HashSet::new();
        for (tenant, index) in &state.index.tenants {
            for (deployment, canary) in &index.canaries {
                let key = (tenant.clone(), deployment.clone());
                let Some((_, split)) = state.splits.get(&key) else {
                    continue;
                };
                live.push(Live {
                    tenant: tenant.clone(),
                    deployment: deployment.clone(),
                    canary: canary.clone(),
                    split: split.clone(),
                });
                kept.insert(key);
            }
        }
        state.splits.retain(|key, _| kept.contains(key));
        *lock(&self.canaries) = live;
    }

    /// `tenant`'s canaries serving now.
    pub fn canaries(&self, tenant: &str) -> Vec<Live> {
        lock(&self.canaries)
            .iter()
            .filter(|c| c.tenant == tenant)
            .cloned()
            .collect()
    }

    /// Prometheus lines: each canary's share, and each side's finished
    /// tasks by outcome.
    pub fn render_canaries(&self) -> String {
        let live = lock(&self.canaries).clone();
        let mut text = String::new();
        if live.is_empty() {
            return text;
        }
        text.push_str("# TYPE corral_canary_percent gauge\n");
        for c in &live {
            let _ = writeln!(
                text,
                "corral_canary_percent{{tenant=\"{}\",deployment=\"{}\",candidate=\"{}\"}} {}",
                escape(&c.tenant),
                escape(&c.deployment),
                escape(&c.canary.candidate),
                c.canary.percent()
            );
        }
        text.push_str("# TYPE corral_canary_tasks_total counter\n");
        for c in &live {
            let (active, candidate) = c.split.counts();
            for (side, counts) in [(Side::Active, active), (Side::Candidate, candidate)] {
                for (outcome, n) in outcomes(&counts) {
                    let _ = writeln!(
                        text,
                        "corral_canary_tasks_total{{tenant=\"{}\",deployment=\"{}\",side=\"{}\",outcome=\"{outcome}\"}} {n}",
                        escape(&c.tenant),
                        escape(&c.deployment),
                        side.as_str(),
                    );
                }
            }
        }
        text
    }
}

/// What a tick does to one canary.
enum Change {
    /// Held with the reason; the active version takes every task.
    RollBack(String),
    /// On to this step of the ramp.
    Step(usize),
    /// The candidate becomes the active version.
    Promote,
}

impl Change {
    /// What is due for `canary` whose sides finished these tasks, at `now`:
    /// a roll-back whenever it fails past its margin; when its step's time
    /// is over, the next step, or after the last one a promotion once it
    /// has run enough tasks to judge (until then it stays where it is).
    fn due(canary: &StoredCanary, active: &Counts, candidate: &Counts, now: i64) -> Option<Change> {
        if let Some(why) = canary.ramp.rollback(active, candidate) {
            return Some(Change::RollBack(format!(
                "rolled back by its canary: {why}"
            )));
        }
        let step_over = u64::try_from(now.saturating_sub(canary.step_started_ms))
            .map(Duration::from_millis)
            .is_ok_and(|elapsed| elapsed >= canary.ramp.every());
        if !step_over {
            None
        } else if canary.step + 1 < canary.ramp.steps().len() {
            Some(Change::Step(canary.step + 1))
        } else if canary.ramp.judged(candidate) {
            Some(Change::Promote)
        } else {
            None
        }
    }

    fn apply(&self, index: &mut TenantIndex, deployment: &str, canary: &StoredCanary, now: i64) {
        let candidate = index
            .versions
            .iter_mut()
            .find(|v| v.digest == canary.candidate);
        match self {
            Change::RollBack(why) => {
                index.canaries.remove(deployment);
                if let Some(v) = candidate {
                    v.held = vec![why.clone()];
                }
            }
            Change::Step(step) => {
                if let Some(c) = index.canaries.get_mut(deployment) {
                    c.step = *step;
                    c.step_started_ms = now;
                }
            }
            Change::Promote => {
                index.canaries.remove(deployment);
                index
                    .active
                    .insert(deployment.to_owned(), canary.candidate.clone());
                if let Some(v) = candidate {
                    v.served = true;
                }
            }
        }
    }

    fn done(&self, catalog: &Catalog, tenant: &str, deployment: &str, canary: &StoredCanary) {
        let candidate = &canary.candidate;
        match self {
            Change::RollBack(why) => {
                tracing::warn!(%tenant, %deployment, %candidate, "canary {why}");
                catalog.metrics.canary_rolled_back(tenant, 1);
            }
            Change::Step(step) => {
                let percent = canary.ramp.percent(*step);
                tracing::info!(%tenant, %deployment, %candidate, percent, "canary steps up");
            }
            Change::Promote => {
                tracing::info!(%tenant, %deployment, %candidate, "canary promoted: the candidate serves every task");
                catalog.metrics.activation(tenant);
            }
        }
    }
}

/// `Completed` and each failure class with its count (those above 0).
pub fn outcomes(counts: &Counts) -> Vec<(&'static str, u64)> {
    std::iter::once(("Completed", counts.completed))
        .chain(
            FailureClass::ALL
                .into_iter()
                .map(|class| (class.as_str(), counts.of(class))),
        )
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::rollout::Ramp;

    fn canary(step: usize) -> StoredCanary {
        StoredCanary {
            candidate: "sha256:c".to_owned(),
            ramp: Ramp::parse("10,50/1m")
                .unwrap()
                .with_rollback(10, 3)
                .unwrap(),
            step,
            step_started_ms: 0,
        }
    }

    fn done(completed: u64, panics: u64) -> Counts {
        let mut counts = Counts {
            completed,
            ..Counts::default()
        };
        counts.failed[1] = panics;
        counts
    }

    fn due(step: usize, candidate: Counts, at_s: i64) -> Option<String> {
        Change::due(&canary(step), &done(10, 0), &candidate, at_s * 1000).map(|c| match c {
            Change::RollBack(why) => why,
            Change::Step(step) => format!("step {step}"),
            Change::Promote => "promote".to_owned(),
        })
    }

    #[test]
    fn a_canary_steps_on_its_schedule_is_promoted_once_judged_and_rolled_back_any_time() {
        // Within its step's time: nothing, however well it does.
        assert_eq!(due(0, done(50, 0), 59), None);
        assert_eq!(due(0, done(50, 0), 60).as_deref(), Some("step 1"));
        // After the last step: promoted only with min_tasks of its own.
        assert_eq!(due(1, done(2, 0), 600), None);
        assert_eq!(due(1, done(3, 0), 600).as_deref(), Some("promote"));
        // Failing past its margin: rolled back at once, at any step.
        let rolled = due(0, done(1, 2), 1).unwrap_or_default();
        assert!(
            rolled.starts_with("rolled back by its canary: Panic: 2 of 3 tasks (66%)"),
            "{rolled}"
        );
    }
}
