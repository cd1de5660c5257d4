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

use super::{Catalog, State, StoredCanary, now_ms};
use corral_core::metrics::escape;
use corral_core::sandbox::FailureClass;
use corral_core::session::canary::WHOLE;
use corral_core::session::{Counts, Split};
use corral_core::sync::lock;

/// A canary serving now, as `status` and `/metrics` show it.
#[derive(Debug, Clone)]
pub struct Live {
    pub tenant: String,
    pub deployment: String,
    pub candidate: String,
    /// The step of its ramp, and the percent of tasks it takes there.
    pub step: usize,
    pub steps: usize,
    pub percent: u32,
    pub split: Arc<Split>,
}

impl State {
    /// The split of `tenant`'s canary on `deployment`: the one it had while
    /// the candidate stays the same (its counts go on), a new one for a new
    /// candidate; at the share of the ramp's current step.
    pub(super) fn split(
        &mut self,
        tenant: &str,
        deployment: &str,
        canary: &StoredCanary,
    ) -> Arc<Split> {
        let percent = canary.ramp.steps().get(canary.step).copied().unwrap_or(0);
        let share = percent * WHOLE / 100;
        let key = (tenant.to_owned(), deployment.to_owned());
        match self.splits.get(&key) {
            Some((candidate, split)) if *candidate == canary.candidate => {
                split.set_share(share);
                split.clone()
            }
            _ => {
                let split = Arc::new(Split::new(share));
                self.splits
                    .insert(key, (canary.candidate.clone(), split.clone()));
                split
            }
        }
    }
}

impl Catalog {
    /// Moves every canary's ramp on once a second, until `shutdown`.
    pub async fn run_canaries(self: Arc<Self>, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(Duration::from_secs(1));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => self.advance_canaries(now_ms()).await,
            }
        }
    }

    /// Rolls back each canary whose candidate fails past its margin, steps
    /// on those whose step has run its time, and makes the candidate the
    /// active version after the last step.
    pub async fn advance_canaries(&self, now: i64) {
        for spec in self.tenants.values() {
            let name = &spec.tenant.name;
            let mut state = self.state.lock().await;
            let Some(before) = state.index.tenants.get(name) else {
                continue;
            };
            if before.canaries.is_empty() {
                continue;
            }
            let mut next = before.clone();
            let mut rolled_back = 0;
            for (deployment, canary) in &before.canaries {
                let key = (name.clone(), deployment.clone());
                let Some((_, split)) = state.splits.get(&key) else {
                    continue;
                };
                let (active, candidate) = split.counts();
                if let Some(why) = canary.ramp.rollback(&active, &candidate) {
                    tracing::warn!(tenant = %name, %deployment, candidate = %canary.candidate, "canary rolled back: {why}");
                    next.canaries.remove(deployment);
                    if let Some(v) = next
                        .versions
                        .iter_mut()
                        .find(|v| v.digest == canary.candidate)
                    {
                        v.held = vec![format!("rolled back by its canary: {why}")];
                    }
                    rolled_back += 1;
                    continue;
                }
                let elapsed =
                    u64::try_from(now.saturating_sub(canary.step_started_ms)).unwrap_or(0);
                if Duration::from_millis(elapsed) < canary.ramp.every() {
                    continue;
                }
                if canary.step + 1 < canary.ramp.steps().len() {
                    let step = canary.step + 1;
                    tracing::info!(tenant = %name, %deployment, candidate = %canary.candidate, percent = canary.ramp.steps()[step], "canary steps up");
                    if let Some(c) = next.canaries.get_mut(deployment) {
                        c.step = step;
                        c.step_started_ms = now;
                    }
                } else {
                    tracing::info!(tenant = %name, %deployment, candidate = %canary.candidate, "canary promoted: the candidate serves every task");
                    next.canaries.remove(deployment);
                    next.active
                        .insert(deployment.clone(), canary.candidate.clone());
                    if let Some(v) = next
                        .versions
                        .iter_mut()
                        .find(|v| v.digest == canary.candidate)
                    {
                        v.served = true;
                    }
                    self.metrics.activation(name);
                }
            }
            if next == *before {
                continue;
            }
            match self.commit(&mut state, spec, next).await {
                Ok(()) => self.metrics.canary_rolled_back(name, rolled_back),
                Err(e) => {
                    tracing::error!(tenant = %name, "moving a canary on: {}", crate::error_chain(&e))
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
                    candidate: canary.candidate.clone(),
                    step: canary.step,
                    steps: canary.ramp.steps().len(),
                    percent: canary.ramp.steps().get(canary.step).copied().unwrap_or(0),
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
                escape(&c.candidate),
                c.percent
            );
        }
        text.push_str("# TYPE corral_canary_tasks_total counter\n");
        for c in &live {
            let (active, candidate) = c.split.counts();
            for (side, counts) in [("active", active), ("candidate", candidate)] {
                for (outcome, n) in outcomes(&counts) {
                    let _ = writeln!(
                        text,
                        "corral_canary_tasks_total{{tenant=\"{}\",deployment=\"{}\",side=\"{side}\",outcome=\"{outcome}\"}} {n}",
                        escape(&c.tenant),
                        escape(&c.deployment),
                    );
                }
            }
        }
        text
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
