//! What an orchestrator's probes ask of a host, answered on the metrics
//! listener: is its runtime alive (`/livez`), and should it be sent work
//! (`/readyz`). A host is ready once it has loaded its configured
//! components, checked the tags it follows and connected every tenant to
//! its engine, while each tenant's engine answers and its polls do not
//! fail, and until it is told to stop: then it is not ready at once, and
//! drains.
//!
//! Both answers come from the host's own runtime, never from a guest's
//! threads, and take a lock for a few field reads: guests busy on every
//! core do not slow them (the runtime's threads run before the guests').

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use corral_core::shown::shown;
use corral_core::sync::lock;

/// How often the host's housekeeping ticks; `/livez` fails when the last
/// tick is older than [`STALE_TICK`].
pub const TICK: Duration = Duration::from_secs(1);
/// How old the last tick may be before the host is not live: its runtime
/// answers a probe, yet its timers or tasks do not run (a wedged runtime).
pub const STALE_TICK: Duration = Duration::from_secs(10);
/// How long a failed poll keeps a tenant not ready: an engine that refuses
/// a tenant's polls (a namespace that does not exist, a task queue the
/// tenant may not poll) fails each poll again within that.
pub const POLL_FAILURE_HOLDS: Duration = Duration::from_secs(30);
/// Not-ready tenants `/readyz?verbose` names; the rest are counted.
const MAX_NAMED: usize = 20;
/// The longest reason it quotes (an engine's words among them).
const MAX_REASON: usize = 300;

/// The host's liveness and readiness, shared by its start, its
/// connectors, its signal handler and the probes.
pub struct Health {
    started: Instant,
    /// When the last housekeeping tick ran, in milliseconds since
    /// `started`.
    ticked_ms: AtomicU64,
    state: Mutex<State>,
}

struct State {
    phase: Phase,
    tenants: BTreeMap<String, Arc<EngineLink>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// What the start is doing.
    Starting(String),
    Serving,
    /// Told to stop: tasks drain, no new work is wanted.
    Draining,
}

/// A tenant's link to its engine, as its connector and the host's check
/// of the engine see it.
pub struct EngineLink {
    state: Mutex<LinkState>,
}

#[derive(Default)]
struct LinkState {
    /// Why the engine does not serve the tenant (not connected yet, or its
    /// server does not answer); `None` once it does.
    down: Option<String>,
    /// The last poll that failed, and why.
    poll_failed: Option<(Instant, String)>,
}

impl EngineLink {
    fn new() -> Arc<EngineLink> {
        Arc::new(EngineLink {
            state: Mutex::new(LinkState {
                down: Some("not connected to its engine yet".to_owned()),
                poll_failed: None,
            }),
        })
    }

    /// Its engine answers.
    pub fn up(&self) {
        lock(&self.state).down = None;
    }

    /// Its engine does not answer, for the reason given (an engine's or a
    /// network's words: escaped and cut here).
    pub fn down(&self, why: &str) {
        lock(&self.state).down = Some(shown(why, MAX_REASON));
    }

    /// A poll for its work was answered: its engine serves it.
    pub fn polled(&self) {
        let mut state = lock(&self.state);
        state.down = None;
        state.poll_failed = None;
    }

    /// A poll for its work failed (the engine's words).
    pub fn poll_failed(&self, why: &str) {
        lock(&self.state).poll_failed = Some((Instant::now(), shown(why, MAX_REASON)));
    }

    fn not_ready(&self, now: Instant) -> Option<String> {
        let state = lock(&self.state);
        if let Some(why) = &state.down {
            return Some(why.clone());
        }
        state
            .poll_failed
            .as_ref()
            .filter(|(at, _)| now.duration_since(*at) < POLL_FAILURE_HOLDS)
            .map(|(_, why)| format!("its polls fail: {why}"))
    }
}

/// A probe's answer: its HTTP status and body.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub ok: bool,
    pub text: String,
}

impl Health {
    /// A host starting, with `tenants` (their links not up yet).
    pub fn new<'a>(tenants: impl IntoIterator<Item = &'a str>) -> Arc<Health> {
        Arc::new(Health {
            started: Instant::now(),
            ticked_ms: AtomicU64::new(0),
            state: Mutex::new(State {
                phase: Phase::Starting("starting".to_owned()),
                tenants: tenants
                    .into_iter()
                    .map(|t| (t.to_owned(), EngineLink::new()))
                    .collect(),
            }),
        })
    }

    /// The link of `tenant` (one the host was started with), for its
    /// connector and the engine check.
    pub fn link(&self, tenant: &str) -> Arc<EngineLink> {
        lock(&self.state)
            .tenants
            .entry(tenant.to_owned())
            .or_insert_with(EngineLink::new)
            .clone()
    }

    /// What the start is doing now; ignored once it serves or drains.
    pub fn starting(&self, what: impl Into<String>) {
        let mut state = lock(&self.state);
        if matches!(state.phase, Phase::Starting(_)) {
            state.phase = Phase::Starting(what.into());
        }
    }

    /// The start is done; ignored once draining.
    pub fn serving(&self) {
        let mut state = lock(&self.state);
        if state.phase != Phase::Draining {
            state.phase = Phase::Serving;
        }
    }

    /// Told to stop: not ready from now on.
    pub fn draining(&self) {
        lock(&self.state).phase = Phase::Draining;
    }

    /// The housekeeping tick ran (see [`Health::tick_forever`]).
    pub fn tick(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.ticked_ms.store(ms, Ordering::Relaxed);
    }

    /// Ticks every [`TICK`] on the host's runtime, until the process ends.
    pub async fn tick_forever(self: Arc<Self>) {
        let mut ticks = tokio::time::interval(TICK);
        loop {
            ticks.tick().await;
            self.tick();
        }
    }

    /// `/livez`: the host's runtime runs its timers and tasks.
    pub fn live(&self) -> Answer {
        let ticked = Duration::from_millis(self.ticked_ms.load(Ordering::Relaxed));
        let since = self.started.elapsed().saturating_sub(ticked);
        if since > STALE_TICK {
            return Answer {
                ok: false,
                text: format!(
                    "not live: the host's runtime last ticked {:.0} s ago\n",
                    since.as_secs_f64()
                ),
            };
        }
        Answer {
            ok: true,
            text: "live\n".to_owned(),
        }
    }

    /// `/readyz`, and with `verbose` its JSON detail.
    pub fn ready(&self, verbose: bool) -> Answer {
        let now = Instant::now();
        let state = lock(&self.state);
        let not_ready: Vec<(&String, String)> = state
            .tenants
            .iter()
            .filter_map(|(name, link)| link.not_ready(now).map(|why| (name, why)))
            .collect();
        let phase = match &state.phase {
            Phase::Starting(what) => Some(format!("starting: {what}")),
            Phase::Serving => None,
            Phase::Draining => Some("draining: told to stop, finishing its tasks".to_owned()),
        };
        let ok = phase.is_none() && not_ready.is_empty();
        if verbose {
            let named: Vec<Value> = not_ready
                .iter()
                .take(MAX_NAMED)
                .map(|(name, why)| json!({ "tenant": shown(name, 256), "why": why }))
                .collect();
            let detail = json!({
                "ready": ok,
                "phase": match &state.phase {
                    Phase::Starting(_) => "starting",
                    Phase::Serving => "serving",
                    Phase::Draining => "draining",
                },
                "why": phase,
                "tenants": state.tenants.len(),
                "tenants_not_ready": not_ready.len(),
                "not_ready": named,
            });
            return Answer {
                ok,
                text: format!("{detail}\n"),
            };
        }
        let text = match (&phase, not_ready.first()) {
            (Some(why), _) => format!("not ready: {why}\n"),
            (None, Some((name, why))) => format!(
                "not ready: tenant `{}`: {why}{}\n",
                shown(name, 256),
                match not_ready.len() {
                    1 => String::new(),
                    n => format!(" (and {} more tenant(s))", n - 1),
                }
            ),
            (None, None) => "ready\n".to_owned(),
        };
        Answer { ok, text }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_ready_only_once_started_with_every_tenant_connected_and_not_draining() {
        let health = Health::new(["acme", "beta"]);
        health.starting("loading components");
        let said = health.ready(false);
        assert!(!said.ok);
        assert_eq!(said.text, "not ready: starting: loading components\n");
        health.serving();
        let said = health.ready(false);
        assert!(!said.ok);
        assert_eq!(
            said.text,
            "not ready: tenant `acme`: not connected to its engine yet (and 1 more tenant(s))\n"
        );
        health.link("acme").up();
        health.link("beta").up();
        assert_eq!(
            health.ready(false),
            Answer {
                ok: true,
                text: "ready\n".to_owned()
            }
        );
        // An engine that stops answering, then a poll that fails.
        health.link("beta").down("connection refused\n\u{1b}[2J");
        let said = health.ready(false);
        assert!(
            !said.ok && said.text.contains("connection refused\\n\\u{1b}[2J"),
            "{said:?}"
        );
        health.link("beta").up();
        health.link("beta").poll_failed("namespace not found");
        let said = health.ready(true);
        assert!(!said.ok);
        let detail: Value = serde_json::from_str(&said.text).unwrap();
        assert_eq!(detail["phase"], "serving");
        assert_eq!(detail["not_ready"][0]["tenant"], "beta");
        assert_eq!(
            detail["not_ready"][0]["why"],
            "its polls fail: namespace not found"
        );
        // Told to stop: not ready at once, whatever the start does next.
        health.draining();
        health.serving();
        assert_eq!(
            health.ready(false).text,
            "not ready: draining: told to stop, finishing its tasks\n"
        );
    }

    #[test]
    fn verbose_readiness_names_a_few_tenants_and_counts_the_rest() {
        let names: Vec<String> = (0..500).map(|i| format!("tenant-{i}\n")).collect();
        let health = Health::new(names.iter().map(String::as_str));
        health.serving();
        let said = health.ready(true);
        assert!(said.text.len() < 8 << 10, "{} bytes", said.text.len());
        let detail: Value = serde_json::from_str(&said.text).unwrap();
        assert_eq!(detail["tenants_not_ready"], 500);
        assert_eq!(detail["not_ready"].as_array().unwrap().len(), MAX_NAMED);
        assert_eq!(said.text.trim_end().lines().count(), 1, "one line");
    }

    #[test]
    fn a_host_whose_runtime_stopped_ticking_is_not_live() {
        let health = Health::new([]);
        health.tick();
        assert!(health.live().ok);
        // Started long ago, and last ticked at its start.
        let started = Instant::now() - STALE_TICK - Duration::from_secs(1);
        let stale = Health {
            started,
            ticked_ms: AtomicU64::new(0),
            state: Mutex::new(State {
                phase: Phase::Serving,
                tenants: BTreeMap::new(),
            }),
        };
        let said = stale.live();
        assert!(!said.ok);
        assert!(
            said.text
                .starts_with("not live: the host's runtime last ticked")
        );
    }
}
