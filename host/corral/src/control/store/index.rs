//! What the index holds: each tenant's stored versions, which serve, its
//! canaries, and what its roll-out remembers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use corral_core::sandbox::{DeploymentReuse, Reuse, ReuseError};

use super::super::metadata::Pulled;
use super::StoredCanary;

/// One stored version of a tenant's deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    /// The deployment it belongs to (e.g. `greeter`).
    pub name: String,
    /// `sha256:<hex>`.
    pub digest: String,
    pub size: u64,
    pub uploaded_at_ms: i64,
    #[serde(default)]
    pub aliases: BTreeMap<String, String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Seeded from a file named in the configuration, not uploaded.
    #[serde(default)]
    pub from_config: bool,
    /// The deployment's own `wasi:config` keys, over the tenant's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, String>,
    /// The size of its compiled artifact, as cached when it was stored.
    #[serde(default)]
    pub compiled: u64,
    /// Where the host pulled it from (the host's record, not a label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulled: Option<Pulled>,
    /// The deployment's own reuse (none: the tenant's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuse: Option<StoredReuse>,
    /// Why the tenant's roll-out gate holds it for an operator's approval
    /// (the host's words, bounded); empty: not held.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<String>,
    /// It has served its deployment: activating it again (a roll-back)
    /// passes the gate.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub served: bool,
    /// The fingerprint of the trusted key whose signature was verified
    /// when it was stored (by the host: never a caller's word); checked
    /// against the tenant's trust policy again at every start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
}

/// A deployment's own reuse as stored; validated again when it is read
/// ([`StoredReuse::get`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredReuse {
    /// 0: a new instance for every task.
    pub max_tasks: u32,
    pub idle_ms: u64,
}

impl StoredReuse {
    /// How a deployment reusing as `reuse` is stored (`None`: as its tenant).
    pub fn of(reuse: DeploymentReuse) -> Option<StoredReuse> {
        match reuse {
            DeploymentReuse::Tenant => None,
            DeploymentReuse::Off => Some(StoredReuse {
                max_tasks: 0,
                idle_ms: 0,
            }),
            DeploymentReuse::On(reuse) => Some(StoredReuse {
                max_tasks: reuse.max_tasks(),
                idle_ms: u64::try_from(reuse.idle().as_millis()).unwrap_or(u64::MAX),
            }),
        }
    }

    /// The reuse it stands for, or why it cannot be one.
    pub fn get(self) -> Result<DeploymentReuse, ReuseError> {
        if self.max_tasks == 0 {
            return Ok(DeploymentReuse::Off);
        }
        let idle = std::time::Duration::from_millis(self.idle_ms);
        Reuse::new(i64::from(self.max_tasks), idle).map(DeploymentReuse::On)
    }
}

impl Version {
    /// The deployment's reuse.
    pub fn deployment_reuse(&self) -> Result<DeploymentReuse, ReuseError> {
        self.reuse
            .map_or(Ok(DeploymentReuse::Tenant), StoredReuse::get)
    }
}

impl Version {
    /// What the version costs its tenant's `max_stored`: its bytes, its
    /// compiled artifact, and its labels, aliases and config.
    pub fn stored_bytes(&self) -> u64 {
        let metadata = super::super::metadata::size(&self.labels, &self.aliases, &self.config);
        self.size
            .saturating_add(self.compiled)
            .saturating_add(metadata as u64)
    }
}

/// One tenant's versions and, per deployment, the active digest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantIndex {
    #[serde(default)]
    pub versions: Vec<Version>,
    #[serde(default)]
    pub active: BTreeMap<String, String>,
    /// Per deployment, a candidate taking a share of its tasks.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub canaries: BTreeMap<String, StoredCanary>,
    /// Held versions since removed, with why they were held (the newest
    /// [`MAX_REJECTED`]): deployed again, they are held again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<(String, Vec<String>)>,
    /// Deployments whose active version was removed (`rm --force`) and
    /// that none has served since, the newest [`MAX_REJECTED`]: a gate
    /// that compares a new version with the active one has nothing to
    /// compare the next one with, and holds it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_active: Vec<String>,
    /// What callers called on those versions (their activity types and
    /// their own aliases) that nothing serves since, whatever deployment
    /// serves it next: a gate must not depend on the name a tenant gives
    /// a deployment. At most [`MAX_REMOVED_NAMES`]; past that, the oldest
    /// go and `removed_unknown` is set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_names: Vec<String>,
    /// More names were removed than are remembered (or a removed version's
    /// names could not be read): every new version with nothing to compare
    /// may break callers, until the operator approves one. Set, never
    /// evicted: removing versions is no way to make the gate forget.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed_unknown: bool,
}

/// Removed held versions a tenant's index remembers.
pub const MAX_REJECTED: usize = 64;
/// Names of versions removed while active a tenant's index remembers.
pub const MAX_REMOVED_NAMES: usize = 1024;

impl TenantIndex {
    /// The versions serving now.
    pub fn active_versions(&self) -> Vec<&Version> {
        self.versions
            .iter()
            .filter(|v| self.active.get(&v.name) == Some(&v.digest))
            .collect()
    }

    pub fn is_active(&self, version: &Version) -> bool {
        self.active.get(&version.name) == Some(&version.digest)
    }

    /// Stores `version`: in place of the one with its digest, or added.
    pub fn put(&mut self, version: &Version) {
        match self
            .versions
            .iter_mut()
            .find(|v| v.digest == version.digest)
        {
            Some(stored) => *stored = version.clone(),
            None => self.versions.push(version.clone()),
        }
    }

    /// Remembers that `deployment`'s active version was removed, and what
    /// its callers called (`None`: not known).
    pub fn removed_active(&mut self, deployment: &str, names: Option<Vec<String>>) {
        if self.removed_active.len() >= MAX_REJECTED
            && !self.removed_active.iter().any(|d| d == deployment)
        {
            self.removed_unknown = true;
        }
        remember(&mut self.removed_active, deployment.to_owned(), |d| {
            d == deployment
        });
        let Some(names) = names else {
            self.removed_unknown = true;
            return;
        };
        for name in names {
            if !self.removed_names.contains(&name) {
                self.removed_names.push(name);
            }
        }
        let over = self.removed_names.len().saturating_sub(MAX_REMOVED_NAMES);
        if over > 0 {
            self.removed_names.drain(..over);
            self.removed_unknown = true;
        }
    }

    /// Why a new version of `deployment` serving `names` may break
    /// callers of a version removed while active: that version served its
    /// deployment (nothing to compare it with), or one of its names
    /// (whatever the deployment, compared or not: nothing serving now
    /// shows what that name's callers expect), or the gate forgot what
    /// (only a version with nothing to compare with is held for that).
    pub fn removed_callers(
        &self,
        deployment: &str,
        names: &[String],
        compared: bool,
    ) -> Option<String> {
        if self.removed_active.iter().any(|d| d == deployment) {
            return Some(
                "may break callers: its deployment's active version was removed (rm --force), so nothing shows what its callers expect"
                    .to_owned(),
            );
        }
        if let Some(name) = names.iter().find(|n| self.removed_names.contains(n)) {
            return Some(format!(
                "may break callers: `{}` was served by a version removed while active (rm --force), so nothing shows what its callers expect",
                corral_core::shown::shown(name, 256)
            ));
        }
        (self.removed_unknown && !compared).then(|| {
            "may break callers: more versions were removed while active (rm --force) than the gate remembers, so nothing shows what their callers expect: the operator approves the next"
                .to_owned()
        })
    }

    /// Remembers why `digest`, removed, was held: deployed again, it is
    /// held again.
    pub fn rejected(&mut self, digest: &str, reasons: Vec<String>) {
        remember(
            &mut self.rejected,
            (digest.to_owned(), reasons),
            |(d, _)| d == digest,
        );
    }

    /// The percent of its deployment's tasks `digest` takes as a canary.
    pub fn canary_percent(&self, digest: &str) -> Option<u32> {
        self.canaries
            .values()
            .find(|c| c.candidate == digest)
            .map(StoredCanary::percent)
    }

    /// The canary of `deployment`, with its candidate's version.
    pub fn canary_of(&self, deployment: &str) -> Option<(&StoredCanary, &Version)> {
        let canary = self.canaries.get(deployment)?;
        let candidate = self
            .versions
            .iter()
            .find(|v| v.digest == canary.candidate)?;
        Some((canary, candidate))
    }

    /// The version whose digest is `digest`, or whose hex starts with it (at
    /// least 8 digits, and only one match).
    pub fn find(&self, digest: &str) -> Result<&Version, FindError> {
        let hex = digest.trim_start_matches("sha256:");
        if hex.len() < 8 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(FindError::NotADigest(digest.to_owned()));
        }
        let hex = hex.to_ascii_lowercase();
        let matches: Vec<&Version> = self
            .versions
            .iter()
            .filter(|v| v.digest.trim_start_matches("sha256:").starts_with(&hex))
            .collect();
        match matches.as_slice() {
            [one] => Ok(one),
            [] => Err(FindError::NoMatch(digest.to_owned())),
            _ => Err(FindError::Ambiguous(digest.to_owned(), matches.len())),
        }
    }
}

/// Puts `item` last in `list`, in place of any `same` one, keeping the
/// newest [`MAX_REJECTED`].
fn remember<T>(list: &mut Vec<T>, item: T, same: impl Fn(&T) -> bool) {
    list.retain(|old| !same(old));
    list.push(item);
    let over = list.len().saturating_sub(MAX_REJECTED);
    list.drain(..over);
}

/// Why [`TenantIndex::find`] found no version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FindError {
    #[error("`{0}` is not a digest: give `sha256:<hex>` or at least 8 of its hex digits")]
    NotADigest(String),
    #[error("no stored version matches `{0}`")]
    NoMatch(String),
    #[error("`{0}` matches {1} versions: give more digits")]
    Ambiguous(String, usize),
}

/// Everything the host serves, as persisted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    /// The format version of this file.
    pub format: u32,
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantIndex>,
}

pub(super) const FORMAT: u32 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_removed_versions_callers_hold_what_serves_its_names_under_any_deployment() {
        let mut index = TenantIndex::default();
        index.removed_active("greeter", Some(names(&["demo:g/api.greet", "Greet"])));
        // Its deployment, or any deployment serving one of its names.
        let held = |index: &TenantIndex, deployment, served: &[&str], compared| {
            index.removed_callers(deployment, &names(served), compared)
        };
        assert!(held(&index, "greeter", &["other:x/y.z"], false).is_some());
        for (deployment, compared) in [("renamed", false), ("another", true)] {
            let why = held(&index, deployment, &["x:y/z.w", "Greet"], compared).unwrap();
            assert!(
                why.contains("`Greet` was served by a version removed"),
                "{why}"
            );
        }
        assert_eq!(held(&index, "renamed", &["x:y/z.w"], false), None);
    }

    #[test]
    fn removing_more_than_the_gate_remembers_holds_every_new_version_until_approval() {
        let mut index = TenantIndex::default();
        index.removed_active("target", Some(names(&["demo:t/api.kept"])));
        // A tenant removing versions with many other names to push the
        // first out of the list: forgotten by name, but not let through.
        for i in 0..=MAX_REMOVED_NAMES / 64 {
            let many = (0..64).map(|n| format!("filler:{i}/api.n{n}")).collect();
            index.removed_active(&format!("filler{i}"), Some(many));
        }
        assert!(!index.removed_names.contains(&"demo:t/api.kept".to_owned()));
        assert!(index.removed_names.len() <= MAX_REMOVED_NAMES);
        let why = index
            .removed_callers("fresh", &names(&["demo:t/api.kept"]), false)
            .unwrap();
        assert!(why.contains("than the gate remembers"), "{why}");
        // So do more deployments than it remembers, and a removed version
        // whose names were not known.
        let mut index = TenantIndex::default();
        for i in 0..=MAX_REJECTED {
            index.removed_active(&format!("d{i}"), Some(Vec::new()));
        }
        assert!(index.removed_unknown);
        let mut index = TenantIndex::default();
        index.removed_active("d", None);
        assert!(index.removed_callers("e", &[], false).is_some());
        // A version compared with its deployment's active one is held only
        // for a removed name it serves.
        assert_eq!(index.removed_callers("e", &[], true), None);
    }
}
