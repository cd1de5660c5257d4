//! Roll-outs: what a tenant's new version may activate by itself, what
//! waits for an operator's `corral approve`, and how a canary ramps up.
//!
//! A tenant's `rollout = { hold = [...] }` names the changes that hold a
//! version: `breaking` (a caller of the active version breaks),
//! `new-imports` (it imports what nothing the tenant serves imports; the
//! catalog passes those as the report's `imports_added`), `beyond-grants`
//! (it imports a capability the tenant is not granted) and `every` (every
//! new version). A held version is stored, not served; it shows in `status`
//! and `/metrics` until the operator approves it, and stays held however
//! the tenant asks it to serve again (removed and deployed again too). The
//! gate applies to every way a version becomes active on the tenant's
//! token: a deploy, an `activate` and a followed tag's new manifest. A
//! version that served its deployment before (a roll-back) passes unless
//! it is held, and nothing on the operator's side (the configuration's own
//! components, `approve`) is held. `rollout.canary` (a [`Ramp`]) makes
//! every new version a canary first.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use corral_core::sandbox::{Capabilities, ChangeReport, FailureClass};
use corral_core::session::Counts;
use corral_core::shown::shown;

/// A change that holds a version for approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HoldOn {
    Every,
    Breaking,
    NewImports,
    BeyondGrants,
}

impl HoldOn {
    const ALL: [HoldOn; 4] = [
        HoldOn::Every,
        HoldOn::Breaking,
        HoldOn::NewImports,
        HoldOn::BeyondGrants,
    ];

    fn as_str(self) -> &'static str {
        match self {
            HoldOn::Every => "every",
            HoldOn::Breaking => "breaking",
            HoldOn::NewImports => "new-imports",
            HoldOn::BeyondGrants => "beyond-grants",
        }
    }
}

impl fmt::Display for HoldOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A word `hold` does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{}` is not a change a roll-out can hold on: use every, breaking, new-imports or beyond-grants", shown(.0, 64))]
pub struct UnknownHold(String);

impl FromStr for HoldOn {
    type Err = UnknownHold;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HoldOn::ALL
            .into_iter()
            .find(|h| h.as_str() == s)
            .ok_or_else(|| UnknownHold(s.to_owned()))
    }
}

/// A tenant's roll-out policy, validated: built only from known words.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rollout {
    hold: BTreeSet<HoldOn>,
    /// How its new versions ramp up, when they do.
    pub canary: Option<Ramp>,
    /// Which of its attempts are recorded, and the agreement a candidate
    /// needs on their replay.
    pub shadow: Option<super::shadow::Shadow>,
}

/// A canary's ramp: the candidate takes `steps` percent of its deployment's
/// tasks in turn, each for `every`, then serves them all. It is rolled back
/// when, after `min_tasks` of its own, its rate of any failure class is
/// more than `margin` percentage points over the active version's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ramp {
    steps: Vec<u32>,
    every_ms: u64,
    margin: u32,
    min_tasks: u32,
}

/// A ramp out of its bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RampError {
    #[error(
        "steps: 1 to {MAX_STEPS} percentages from 1 to 99, each over the one before; got {}",
        shown_steps(.0)
    )]
    Steps(Vec<u32>),
    #[error("every: from 1s to 24h, got {0:?}")]
    Every(Duration),
    #[error("margin: percentage points from 0 to 100, got {0}")]
    Margin(u32),
    #[error("min_tasks: from 1 to 1000000, got {0}")]
    MinTasks(u32),
    #[error("`{}` is not a ramp: write percentages and a step's time, e.g. `10,50/5m`", shown(.0, 64))]
    Text(String),
}

const MAX_STEPS: usize = 10;

/// Steps as an error shows them: a few, and how many there were.
fn shown_steps(steps: &[u32]) -> String {
    if steps.len() <= MAX_STEPS {
        return format!("{steps:?}");
    }
    format!("{:?}… ({} steps)", &steps[..MAX_STEPS], steps.len())
}
/// A canary's margin when none is given: percentage points.
pub const DEFAULT_MARGIN: u32 = 5;
/// The candidate's tasks before a canary may be rolled back, by default.
pub const DEFAULT_MIN_TASKS: u32 = 20;

impl Ramp {
    pub fn new(
        steps: Vec<u32>,
        every: Duration,
        margin: u32,
        min_tasks: u32,
    ) -> Result<Ramp, RampError> {
        let rising = steps.windows(2).all(|w| w[0] < w[1]);
        if steps.is_empty()
            || steps.len() > MAX_STEPS
            || !rising
            || steps.iter().any(|s| !(1..=99).contains(s))
        {
            return Err(RampError::Steps(steps));
        }
        if every < Duration::from_secs(1) || every > Duration::from_secs(24 * 3600) {
            return Err(RampError::Every(every));
        }
        if margin > 100 {
            return Err(RampError::Margin(margin));
        }
        if !(1..=1_000_000).contains(&min_tasks) {
            return Err(RampError::MinTasks(min_tasks));
        }
        Ok(Ramp {
            steps,
            every_ms: u64::try_from(every.as_millis()).unwrap_or(u64::MAX),
            margin,
            min_tasks,
        })
    }

    /// `10,50/5m`: the steps and their time, with the default margin and
    /// minimum of tasks.
    pub fn parse(text: &str) -> Result<Ramp, RampError> {
        let bad = || RampError::Text(text.to_owned());
        let (steps, every) = text.split_once('/').ok_or_else(bad)?;
        let steps = steps
            .split(',')
            .map(|s| s.trim().trim_end_matches('%').parse::<u32>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad())?;
        let every = corral_core::sandbox::parse_duration(every.trim()).map_err(|_| bad())?;
        Ramp::new(steps, every, DEFAULT_MARGIN, DEFAULT_MIN_TASKS)
    }

    /// The same ramp with another margin and minimum of tasks.
    pub fn with_rollback(self, margin: u32, min_tasks: u32) -> Result<Ramp, RampError> {
        let every = self.every();
        Ramp::new(self.steps, every, margin, min_tasks)
    }

    /// Checked again, as read back from the store.
    pub fn checked(self) -> Result<Ramp, RampError> {
        let every = self.every();
        Ramp::new(self.steps, every, self.margin, self.min_tasks)
    }

    pub fn steps(&self) -> &[u32] {
        &self.steps
    }

    /// The percent of the tasks the candidate takes at `step` (0 past the
    /// last).
    pub fn percent(&self, step: usize) -> u32 {
        self.steps.get(step).copied().unwrap_or(0)
    }

    pub fn every(&self) -> Duration {
        Duration::from_millis(self.every_ms)
    }

    pub fn margin(&self) -> u32 {
        self.margin
    }

    pub fn min_tasks(&self) -> u32 {
        self.min_tasks
    }

    /// Whether the candidate has run enough tasks of its own to be judged
    /// (rolled back, or promoted after its last step).
    pub fn judged(&self, candidate: &Counts) -> bool {
        candidate.tasks() >= u64::from(self.min_tasks)
    }

    /// Why a canary whose sides finished these tasks must be rolled back:
    /// once the candidate has `min_tasks`, the first failure class whose
    /// rate on it is more than `margin` points over the active version's.
    /// `Cancelled` (the caller's doing) and `Host` (the host's) say nothing
    /// of the candidate and are not compared.
    pub fn rollback(&self, active: &Counts, candidate: &Counts) -> Option<String> {
        if !self.judged(candidate) {
            return None;
        }
        let (n, na) = (candidate.tasks(), active.tasks());
        let (n128, na128) = (u128::from(n), u128::from(na.max(1)));
        let mut compared = FailureClass::ALL
            .into_iter()
            .filter(|c| !matches!(c, FailureClass::Cancelled | FailureClass::Host));
        compared.find_map(|class| {
            let (k, ka) = (candidate.of(class), active.of(class));
            // k/n > ka/na + margin/100, in whole numbers (ka is 0 when na is).
            let over = 100 * u128::from(k) * na128
                > 100 * u128::from(ka) * n128 + u128::from(self.margin) * n128 * na128;
            over.then(|| {
                format!(
                    "{}: {k} of {n} tasks ({}%) on the candidate against {ka} of {na} ({}%) on the active version, over the margin of {} points",
                    class.as_str(),
                    percent(k, n),
                    percent(ka, na),
                    self.margin
                )
            })
        })
    }
}

/// A canary as stored: where its ramp stands. The ramp is checked again
/// when read back ([`Ramp::checked`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCanary {
    /// The candidate's digest.
    pub candidate: String,
    pub ramp: Ramp,
    /// The step of the ramp it is at.
    pub step: usize,
    /// When that step began (milliseconds since the Unix epoch).
    pub step_started_ms: i64,
}

impl StoredCanary {
    /// The percent of its deployment's tasks the candidate takes now.
    pub fn percent(&self) -> u32 {
        self.ramp.percent(self.step)
    }
}

fn percent(part: u64, whole: u64) -> u64 {
    part.saturating_mul(100).checked_div(whole).unwrap_or(0)
}

/// At most this many names are listed in one reason; the rest are counted.
const MAX_LISTED: usize = 5;
/// A name in a reason (a guest's own text) is cut to this many bytes.
const MAX_NAME: usize = 128;

impl Rollout {
    /// The policy holding on `words` (the configuration's `rollout.hold`).
    pub fn new<S: AsRef<str>>(words: &[S]) -> Result<Rollout, UnknownHold> {
        let hold = words
            .iter()
            .map(|w| w.as_ref().parse())
            .collect::<Result<_, _>>()?;
        Ok(Rollout {
            hold,
            canary: None,
            shadow: None,
        })
    }

    /// What it holds on, in order.
    pub fn holds_on(&self) -> impl Iterator<Item = HoldOn> + '_ {
        self.hold.iter().copied()
    }

    /// Why a new version must wait for approval, or nothing when it may
    /// activate by itself. `report` is what it changes against the active
    /// version (empty when nothing of the deployment serves yet), its
    /// `imports_added` what nothing the tenant serves imports; `beyond` the
    /// capabilities it imports that the tenant is not granted; `replay`
    /// what its replay of the tenant's recorded attempts found.
    pub fn reasons(
        &self,
        report: &ChangeReport,
        beyond: &[String],
        replay: Option<&super::shadow::ReplayReport>,
    ) -> Vec<String> {
        let mut reasons = Vec::new();
        if let (Some(shadow), Some(replay)) = (&self.shadow, replay)
            && let Some(held) = shadow.holds(replay)
        {
            reasons.push(held);
        }
        for hold in &self.hold {
            match hold {
                HoldOn::Every => reasons.push("every new version waits for approval".to_owned()),
                HoldOn::Breaking => {
                    if !report.breaks_callers() {
                        continue;
                    }
                    let mut broken: Vec<String> = report
                        .removed
                        .iter()
                        .map(|name| format!("removes {}", shown(name, MAX_NAME)))
                        .collect();
                    broken.extend(
                        report
                            .changed
                            .iter()
                            .filter(|c| !c.breaking.is_empty())
                            .map(|c| format!("changes {}", shown(&c.name, MAX_NAME))),
                    );
                    reasons.push(format!("breaks callers: {}", listed(&broken)));
                }
                HoldOn::NewImports => {
                    if !report.imports_added.is_empty() {
                        let added: Vec<String> = report
                            .imports_added
                            .iter()
                            .map(|i| shown(i, MAX_NAME))
                            .collect();
                        reasons.push(format!("adds imports: {}", listed(&added)));
                    }
                }
                HoldOn::BeyondGrants => {
                    if !beyond.is_empty() {
                        reasons.push(format!("uses what is not granted: {}", listed(beyond)));
                    }
                }
            }
        }
        reasons
    }
}

fn listed(items: &[String]) -> String {
    let mut text = items
        .iter()
        .take(MAX_LISTED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > MAX_LISTED {
        text.push_str(&format!(" and {} more", items.len() - MAX_LISTED));
    }
    text
}

/// The capabilities a component with these imports would use that a tenant
/// with these grants does not have: outbound HTTP with no host granted,
/// files with no directory granted, sockets (never granted). Each once,
/// with the import that asks for it.
pub fn beyond_grants(imports: &[String], grants: &Capabilities) -> Vec<String> {
    let families: [(&str, bool, &str); 3] = [
        (
            "wasi:http/outgoing-handler",
            grants.http_hosts.is_empty(),
            "outbound HTTP, and no host is granted",
        ),
        (
            "wasi:filesystem/",
            grants.dirs.is_empty(),
            "files, and no directory is granted",
        ),
        ("wasi:sockets/", true, "sockets, which corral never grants"),
    ];
    families
        .into_iter()
        .filter(|(_, ungranted, _)| *ungranted)
        .filter_map(|(prefix, _, what)| {
            let import = imports.iter().find(|i| i.starts_with(prefix))?;
            Some(format!("{what} ({})", shown(import, MAX_NAME)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_core::sandbox::Changed;

    fn report() -> ChangeReport {
        ChangeReport {
            removed: vec!["demo:x/api.gone".to_owned()],
            changed: vec![
                Changed {
                    name: "demo:x/api.same".to_owned(),
                    old: "func()".to_owned(),
                    new: "func(a: option<u32>)".to_owned(),
                    breaking: Vec::new(),
                },
                Changed {
                    name: "demo:x/api.broken".to_owned(),
                    old: "func(a: u32)".to_owned(),
                    new: "func(a: string)".to_owned(),
                    breaking: vec!["a: another type".to_owned()],
                },
            ],
            imports_added: vec!["wasi:http/outgoing-handler@0.2.9".to_owned()],
            ..ChangeReport::default()
        }
    }

    #[test]
    fn only_known_words_make_a_policy() {
        let policy = Rollout::new(&["breaking", "new-imports"]).unwrap();
        assert_eq!(
            policy.holds_on().collect::<Vec<_>>(),
            [HoldOn::Breaking, HoldOn::NewImports]
        );
        let e = Rollout::new(&["breaking", "Breaking\u{1b}[2J"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`Breaking\\u{1b}[2J` is not a change a roll-out can hold on: use every, breaking, new-imports or beyond-grants"
        );
        assert_eq!(Rollout::new::<&str>(&[]).unwrap(), Rollout::default());
    }

    #[test]
    fn each_hold_names_what_it_holds_on_and_no_more() {
        let report = report();
        assert!(
            Rollout::default()
                .reasons(&report, &["x".into()], None)
                .is_empty()
        );
        assert_eq!(
            Rollout::new(&["breaking"])
                .unwrap()
                .reasons(&report, &[], None),
            ["breaks callers: removes demo:x/api.gone, changes demo:x/api.broken"]
        );
        assert_eq!(
            Rollout::new(&["new-imports"])
                .unwrap()
                .reasons(&report, &[], None),
            ["adds imports: wasi:http/outgoing-handler@0.2.9"]
        );
        // A compatible change holds nothing; nor does a first version,
        // unless every version is held.
        let compatible = ChangeReport {
            changed: vec![report.changed[0].clone()],
            ..ChangeReport::default()
        };
        let all = Rollout::new(&["breaking", "new-imports", "beyond-grants"]).unwrap();
        assert!(all.reasons(&compatible, &[], None).is_empty());
        assert!(all.reasons(&ChangeReport::default(), &[], None).is_empty());
        assert_eq!(
            Rollout::new(&["every"])
                .unwrap()
                .reasons(&ChangeReport::default(), &[], None),
            ["every new version waits for approval"]
        );
        assert_eq!(
            all.reasons(&ChangeReport::default(), &["sockets".into()], None),
            ["uses what is not granted: sockets"]
        );
    }

    #[test]
    fn a_reason_lists_a_few_names_escaped_and_counts_the_rest() {
        let report = ChangeReport {
            removed: (0..8).map(|i| format!("demo:x/api.t{i}\n")).collect(),
            ..ChangeReport::default()
        };
        let reasons = Rollout::new(&["breaking"])
            .unwrap()
            .reasons(&report, &[], None);
        assert_eq!(
            reasons,
            [
                "breaks callers: removes demo:x/api.t0\\n, removes demo:x/api.t1\\n, removes demo:x/api.t2\\n, removes demo:x/api.t3\\n, removes demo:x/api.t4\\n and 3 more"
            ]
        );
    }

    #[test]
    fn a_ramp_is_rising_percentages_a_step_time_and_rollback_bounds() {
        let ramp = Ramp::parse("10,50/5m").unwrap();
        assert_eq!(ramp.steps(), [10, 50]);
        assert_eq!(ramp.every(), Duration::from_secs(300));
        assert_eq!((ramp.margin(), ramp.min_tasks()), (5, 20));
        assert_eq!(Ramp::parse("10%, 25% / 30s").unwrap().steps(), [10, 25]);
        for (text, said) in [
            (
                "50,10/5m",
                "steps: 1 to 10 percentages from 1 to 99, each over the one before; got [50, 10]",
            ),
            ("100/5m", "got [100]"),
            ("10/0s", "every: from 1s to 24h, got 0ns"),
            (
                "10",
                "`10` is not a ramp: write percentages and a step's time, e.g. `10,50/5m`",
            ),
            ("ten/5m", "`ten/5m` is not a ramp"),
        ] {
            let e = Ramp::parse(text).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(said), "{text}: {e}");
        }
        assert_eq!(
            ramp.clone().with_rollback(101, 1).unwrap_err(),
            RampError::Margin(101)
        );
        assert_eq!(
            ramp.with_rollback(5, 0).unwrap_err(),
            RampError::MinTasks(0)
        );
    }

    #[test]
    fn a_canary_is_rolled_back_when_a_class_s_rate_passes_the_margin_after_min_tasks() {
        let ramp = Ramp::parse("50/1h").unwrap().with_rollback(10, 4).unwrap();
        let counts = |completed: u64, panics: u64| {
            let mut c = Counts {
                completed,
                ..Counts::default()
            };
            c.failed[1] = panics; // FailureClass::ALL[1] is Panic
            c
        };
        assert_eq!(FailureClass::ALL[1], FailureClass::Panic);
        // Too few of the candidate's own tasks to judge.
        assert_eq!(ramp.rollback(&counts(3, 0), &counts(0, 3)), None);
        assert_eq!(
            ramp.rollback(&counts(4, 0), &counts(2, 2)).as_deref(),
            Some(
                "Panic: 2 of 4 tasks (50%) on the candidate against 0 of 4 (0%) on the active version, over the margin of 10 points"
            )
        );
        // Within the margin of what the active version does.
        assert_eq!(ramp.rollback(&counts(6, 4), &counts(5, 5)), None);
        assert_eq!(ramp.rollback(&counts(20, 0), &counts(19, 1)), None);
        // No active task yet: its rate is 0.
        assert!(ramp.rollback(&counts(0, 0), &counts(3, 1)).is_some());
        // Cancels and the host's own failures say nothing of the candidate.
        let mut cancelled = counts(0, 0);
        cancelled.failed[5] = 4;
        cancelled.failed[9] = 4;
        assert_eq!(
            (FailureClass::ALL[5], FailureClass::ALL[9]),
            (FailureClass::Cancelled, FailureClass::Host)
        );
        assert_eq!(ramp.rollback(&counts(8, 0), &cancelled), None);
        let long = Ramp::new((1..=99).collect(), Duration::from_secs(1), 5, 1).unwrap_err();
        assert!(long.to_string().ends_with("(99 steps)"), "{long}");
    }

    #[test]
    fn beyond_grants_names_each_ungranted_capability_once() {
        let imports: Vec<String> = [
            "wasi:io/streams@0.2.9",
            "wasi:http/types@0.2.9",
            "wasi:http/outgoing-handler@0.2.9",
            "wasi:filesystem/types@0.2.9",
            "wasi:filesystem/preopens@0.2.9",
        ]
        .map(String::from)
        .to_vec();
        let none = Capabilities::default();
        assert_eq!(
            beyond_grants(&imports, &none),
            [
                "outbound HTTP, and no host is granted (wasi:http/outgoing-handler@0.2.9)",
                "files, and no directory is granted (wasi:filesystem/types@0.2.9)"
            ]
        );
        let granted = Capabilities {
            http_hosts: vec!["api.example.com".parse().unwrap()].into(),
            dirs: vec!["/tmp:/data".parse().unwrap()],
            ..Capabilities::default()
        };
        assert!(beyond_grants(&imports, &granted).is_empty());
        assert_eq!(
            beyond_grants(&["wasi:sockets/tcp@0.2.9".to_owned()], &granted),
            ["sockets, which corral never grants (wasi:sockets/tcp@0.2.9)"]
        );
    }
}
