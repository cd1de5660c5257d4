//! Shadow replay: before a new version serves, its tenant's recorded
//! attempts of each of its activity types run on it, and on the active
//! version beside it, in fresh sandboxes whose outbound HTTP is answered
//! from the recording (nothing goes out) and whose granted directories are
//! read-only (nothing changes). An attempt the active version does not end
//! as recorded depends on time, chance or state, and is not compared; the
//! others agree when the candidate ends them as recorded and makes the
//! recorded requests. With no active version (removed), the candidate is
//! compared with the recording alone.
//!
//! A tenant's replays run one at a time, on the host's guest threads under
//! its CPU share, one attempt at a time, each attempt's deadline the
//! budget's rest: a replay ends by [`REPLAY_BUDGET`] (and an attempt
//! already running, by its cancel grace).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Catalog, ControlError, TenantSpec, Version, now_ms};
use crate::control::shadow::{KEPT_DIFFERENCES, ReplayReport, TypeReplay};
use corral_core::sandbox::shadow::{Attempt, Ending, Tape};
use corral_core::sandbox::{DeploymentReuse, FailureClass, LoadedComponent, PreparedTenant, Task};
use corral_core::shown::shown;

/// The longest one candidate's replay runs.
const REPLAY_BUDGET: Duration = Duration::from_secs(60);

/// A version, ready to replay attempts on.
struct Side {
    component: Arc<LoadedComponent>,
    tenant: Arc<PreparedTenant>,
}

/// How one replayed attempt ended.
struct Replayed {
    ending: Ending,
    deviations: Vec<String>,
    fuel: u64,
    micros: u64,
}

impl Catalog {
    /// The replay of `version` (loaded as `candidate`) against the active
    /// version of its deployment (or the recording alone, with none), when
    /// its tenant records attempts and the gate will judge it: `None` for
    /// the active version itself, one that served before or one held.
    pub(super) async fn replay(
        &self,
        spec: &TenantSpec,
        version: &Version,
        candidate: &Arc<LoadedComponent>,
    ) -> Result<Option<ReplayReport>, ControlError> {
        let Some(one_at_a_time) = self.replays.get(&spec.tenant.name) else {
            return Ok(None);
        };
        let _replaying = one_at_a_time.lock().await;
        let active = {
            let mut state = self.state.lock().await;
            let tenant_index = state.index.tenants.get(&spec.tenant.name);
            let stored = tenant_index.and_then(|t| t.find(&version.digest).ok());
            if stored.is_some_and(|v| v.served || !v.held.is_empty())
                || tenant_index.and_then(|t| t.active.get(&version.name)) == Some(&version.digest)
            {
                return Ok(None);
            }
            let active = tenant_index.and_then(|t| {
                let digest = t.active.get(&version.name)?;
                t.versions.iter().find(|v| v.digest == *digest).cloned()
            });
            match active {
                Some(active) => Some((self.loaded(&mut state, &active.digest).await?, active)),
                None => None,
            }
        };
        let Some(candidate) = side(spec, version, candidate.clone()) else {
            return Ok(None);
        };
        let active = active.and_then(|(component, version)| side(spec, &version, component));
        Ok(Some(
            self.run_replay(spec, &candidate, active.as_ref()).await,
        ))
    }

    async fn run_replay(
        &self,
        spec: &TenantSpec,
        candidate: &Side,
        active: Option<&Side>,
    ) -> ReplayReport {
        let tenant = &spec.tenant.name;
        let started = Instant::now();
        let mut report = ReplayReport::default();
        for activity in &candidate.component.activities {
            let attempts = self.samples.of(tenant, &activity.name);
            if attempts.is_empty() {
                continue;
            }
            let baseline = active.filter(|a| a.component.activity(&activity.name).is_some());
            let mut kind = TypeReplay {
                name: activity.name.to_string(),
                ..TypeReplay::default()
            };
            let (mut fuel, mut micros) = ([0u64; 2], [0u64; 2]);
            for (i, attempt) in attempts.iter().enumerate() {
                let Some(left) = REPLAY_BUDGET.checked_sub(started.elapsed()) else {
                    report.cut_short = true;
                    break;
                };
                let mut on_active = None;
                if let Some(active) = baseline {
                    let replayed = self.replay_one(spec, active, attempt, left).await;
                    if started.elapsed() >= REPLAY_BUDGET {
                        report.cut_short = true;
                        kind.unsteady += 1;
                        break;
                    }
                    if replayed.ending != attempt.ending || !replayed.deviations.is_empty() {
                        kind.unsteady += 1;
                        continue;
                    }
                    on_active = Some(replayed);
                }
                let left = REPLAY_BUDGET.saturating_sub(started.elapsed());
                let replayed = self.replay_one(spec, candidate, attempt, left).await;
                if started.elapsed() >= REPLAY_BUDGET {
                    // Ended by the replay's budget, not by its own doing.
                    report.cut_short = true;
                    kind.unsteady += 1;
                    break;
                }
                if matches!(
                    replayed.ending.class,
                    Some(FailureClass::Host | FailureClass::Cancelled)
                ) {
                    // The host's doing, not the candidate's.
                    kind.unsteady += 1;
                    continue;
                }
                kind.replayed += 1;
                if let Some(on_active) = on_active {
                    fuel[0] += on_active.fuel;
                    micros[0] += on_active.micros;
                }
                fuel[1] += replayed.fuel;
                micros[1] += replayed.micros;
                match difference(attempt, &replayed) {
                    None => kind.agreed += 1,
                    Some(what) => {
                        if fails_anew(&attempt.ending, &replayed.ending) {
                            kind.new_failures += 1;
                        }
                        if kind.differences.len() < KEPT_DIFFERENCES {
                            // A request's path is the guest's text.
                            let what = spec.tenant.capabilities.secrets.redact(&what);
                            kind.differences.push(format!(
                                "attempt {} of {} (recorded {} ago): {}",
                                i + 1,
                                attempts.len(),
                                ago(attempt.at_ms),
                                shown(&what, 400)
                            ));
                        }
                    }
                }
            }
            let n = u64::from(kind.replayed.max(1));
            (kind.fuel_active, kind.fuel_candidate) = (fuel[0] / n, fuel[1] / n);
            (kind.micros_active, kind.micros_candidate) = (micros[0] / n, micros[1] / n);
            tracing::info!(
                tenant,
                activity_type = %corral_core::shown::Shown(&kind.name, corral_core::shown::MAX_NAME),
                replayed = kind.replayed,
                agreed = kind.agreed,
                unsteady = kind.unsteady,
                "shadow replay"
            );
            report.types.push(kind);
        }
        report
    }

    /// Runs `attempt` on `side` with its recorded HTTP, on the host's guest
    /// threads under the tenant's share, within `left`.
    async fn replay_one(
        &self,
        spec: &TenantSpec,
        side: &Side,
        attempt: &Attempt,
        left: Duration,
    ) -> Replayed {
        let tape = Tape::replay(attempt.exchanges.clone());
        let mut task = Task::new(attempt.activity_type.clone(), attempt.args.clone());
        task.tape = Some(tape.clone());
        task.deadline = Some(left.max(Duration::from_millis(1)));
        let (sandbox, component, tenant) = (
            self.sandbox.clone(),
            side.component.clone(),
            side.tenant.clone(),
        );
        let work = move || async move { sandbox.execute(&component, &tenant, task).await };
        let (outcome, started) = match self.guests.get() {
            Some((cpu, permits)) => {
                let _slot = permits.host_slot().await;
                let started = Instant::now();
                let label: Arc<str> = spec.tenant.name.as_str().into();
                let counters = self.metrics.cpu_of(&label, &attempt.activity_type);
                let outcome = cpu.execute(label, counters, spec.tenant.cpu, work).await.0;
                (outcome, started)
            }
            None => (work().await, Instant::now()),
        };
        Replayed {
            ending: Ending::of(&outcome),
            deviations: tape.deviations(),
            fuel: tape.fuel(),
            micros: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        }
    }
}

/// A version as its deployment runs it, but with its directories
/// read-only and no warm instances (a replayed task takes a fresh one
/// anyway); `None` when its configuration no longer applies (its routes
/// would refuse it too).
fn side(spec: &TenantSpec, version: &Version, component: Arc<LoadedComponent>) -> Option<Side> {
    let config: Vec<(String, String)> = version.config.clone().into_iter().collect();
    let tenant = spec
        .tenant
        .for_deployment(&config, DeploymentReuse::Off)
        .ok()?
        .read_only();
    Some(Side {
        component,
        tenant: Arc::new(tenant),
    })
}

/// How the replay differs from the recording, in the host's words.
fn difference(attempt: &Attempt, replayed: &Replayed) -> Option<String> {
    let (was, now) = (&attempt.ending, &replayed.ending);
    if was.class != now.class {
        return Some(format!("{} when recorded, {} now", was.name(), now.name()));
    }
    if was.digest != now.digest {
        let what = match was.class {
            None => "another result",
            Some(_) => "another error",
        };
        return Some(format!("{} both times, {what}", was.name()));
    }
    (!replayed.deviations.is_empty())
        .then(|| format!("outbound HTTP differs: {}", replayed.deviations.join("; ")))
}

/// Whether the candidate failed where the recording succeeded (or failed
/// only the guest's own way).
fn fails_anew(was: &Ending, now: &Ending) -> bool {
    let fine = |e: &Ending| matches!(e.class, None | Some(FailureClass::Application));
    fine(was) && !fine(now)
}

fn ago(at_ms: i64) -> String {
    let secs = now_ms().saturating_sub(at_ms).max(0) / 1000;
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}
