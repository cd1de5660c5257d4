//! Every tenant's recorded attempts: kept in memory, bounded, expiring,
//! and written to `shadow/` in the data directory while they change.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use corral_core::sandbox::shadow::{Attempt, Sampler, SamplerRef};
use corral_core::sync::lock;

use super::Shadow;
use crate::control::store::write_atomically;

/// Every tenant's sample.
#[derive(Debug)]
pub struct Samples {
    dir: Option<PathBuf>,
    tenants: Mutex<BTreeMap<String, TenantSample>>,
    /// One flush at a time: an older copy never replaces a newer one.
    flushing: Mutex<()>,
}

#[derive(Debug)]
struct TenantSample {
    policy: Shadow,
    /// Oldest first, every type together.
    /// Shared, so that a flush or a replay copies pointers under the
    /// lock recording tasks take, not attempts.
    attempts: VecDeque<(usize, Arc<Attempt>)>,
    bytes: u64,
    /// What the tenant's `max_stored` leaves beside its versions.
    room: u64,
    dirty: bool,
}

/// What a tenant keeps of one type, for `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeSample {
    pub activity_type: String,
    pub attempts: usize,
    pub bytes: u64,
}

fn now_ms() -> i64 {
    crate::control::catalog::now_ms()
}

impl TenantSample {
    /// The oldest time an attempt kept at `now` may have.
    fn oldest(&self, now: i64) -> i64 {
        now.saturating_sub(i64::try_from(self.policy.expire().as_millis()).unwrap_or(i64::MAX))
    }

    /// Drops every attempt older than `expire`, wherever it is (the
    /// clock may have stepped back).
    fn expire(&mut self, now: i64) {
        let oldest = self.oldest(now);
        let before = self.attempts.len();
        let mut freed = 0u64;
        self.attempts.retain(|(size, a)| {
            let keep = a.at_ms >= oldest;
            if !keep {
                freed += *size as u64;
            }
            keep
        });
        if self.attempts.len() != before {
            self.bytes = self.bytes.saturating_sub(freed);
            self.dirty = true;
        }
    }

    fn drop_front(&mut self) {
        if let Some((size, _)) = self.attempts.pop_front() {
            self.bytes = self.bytes.saturating_sub(size as u64);
            self.dirty = true;
        }
    }

    fn limit(&self) -> u64 {
        self.policy.max_bytes().min(self.room)
    }

    /// Drops the oldest attempts until the sample fits its bytes.
    fn fit(&mut self) {
        while self.bytes > self.limit() && !self.attempts.is_empty() {
            self.drop_front();
        }
    }

    /// Keeps `attempt`, of `size` ([`Attempt::size`], measured by the
    /// caller outside the lock every recorder takes).
    fn put(&mut self, attempt: Attempt, size: usize, now: i64) {
        if size as u64 > self.limit() || attempt.at_ms < self.oldest(now) {
            return;
        }
        self.expire(now);
        let of_type = self
            .attempts
            .iter()
            .filter(|(_, a)| a.activity_type == attempt.activity_type)
            .count();
        if of_type >= self.policy.sample() as usize
            && let Some(oldest) = self
                .attempts
                .iter()
                .position(|(_, a)| a.activity_type == attempt.activity_type)
            && let Some((size, _)) = self.attempts.remove(oldest)
        {
            self.bytes = self.bytes.saturating_sub(size as u64);
        }
        self.bytes += size as u64;
        self.attempts.push_back((size, Arc::new(attempt)));
        self.dirty = true;
        self.fit();
    }
}

impl Samples {
    /// The samples of the tenants with a shadow policy, read back from
    /// `dir` (in memory only without one). An attempt of a type the policy
    /// no longer records, an expired one, and a file that does not parse
    /// are dropped, each with a warning.
    pub fn open(dir: Option<&Path>, policies: Vec<(String, Shadow)>) -> Arc<Samples> {
        let dir = dir.map(|d| d.join("shadow"));
        if let Some(dir) = &dir
            // Owner-only: a response can hold a credential no secret
            // names (an OAuth token, say).
            && let Err(e) = corral_core::private::dir(dir)
        {
            tracing::warn!(
                "cannot create {}: {e}; recorded attempts are kept in memory only",
                dir.display()
            );
        }
        let now = now_ms();
        // A tenant no longer recorded has its attempts deleted, not kept
        // past any policy.
        if let Some(dir) = &dir {
            let kept: Vec<PathBuf> = policies.iter().map(|(name, _)| file(dir, name)).collect();
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if !kept.contains(&entry.path()) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        let mut tenants = BTreeMap::new();
        for (name, policy) in policies {
            let mut sample = TenantSample {
                policy,
                attempts: VecDeque::new(),
                bytes: 0,
                room: u64::MAX,
                dirty: false,
            };
            if let Some(path) = dir.as_ref().map(|d| file(d, &name)) {
                let mut read = read(&path);
                let count = read.len();
                read.sort_by_key(|a| a.at_ms);
                // Through the policy as it is now: its types, its sample
                // per type, its expiry and bytes.
                for attempt in read {
                    if sample.policy.records(&attempt.activity_type) {
                        let size = attempt.size();
                        sample.put(attempt, size, now);
                    }
                }
                sample.dirty = sample.attempts.len() != count;
            }
            tenants.insert(name, sample);
        }
        Arc::new(Samples {
            dir,
            tenants: Mutex::new(tenants),
            flushing: Mutex::new(()),
        })
    }

    /// Where `tenant`'s tasks record their attempts; `None` when it has no
    /// shadow policy.
    pub fn sampler(self: &Arc<Self>, tenant: &str) -> Option<SamplerRef> {
        let policy = lock(&self.tenants).get(tenant)?.policy.clone();
        Some(SamplerRef(Arc::new(TenantSampler {
            samples: Arc::downgrade(self),
            tenant: tenant.to_owned(),
            policy,
        })))
    }

    /// The room `tenant`'s `max_stored` leaves beside its versions: the
    /// sample shrinks (oldest first) to fit it.
    pub fn set_room(&self, tenant: &str, room: u64) {
        if let Some(sample) = lock(&self.tenants).get_mut(tenant) {
            sample.room = room;
            sample.fit();
        }
    }

    /// `tenant`'s unexpired attempts of `activity_type`, oldest first.
    pub fn of(&self, tenant: &str, activity_type: &str) -> Vec<Arc<Attempt>> {
        let mut tenants = lock(&self.tenants);
        let Some(sample) = tenants.get_mut(tenant) else {
            return Vec::new();
        };
        sample.expire(now_ms());
        sample
            .attempts
            .iter()
            .filter(|(_, a)| a.activity_type == activity_type)
            .map(|(_, a)| a.clone())
            .collect()
    }

    /// What `tenant` keeps, per type.
    pub fn summary(&self, tenant: &str) -> Vec<TypeSample> {
        let tenants = lock(&self.tenants);
        let mut by_type: BTreeMap<&str, TypeSample> = BTreeMap::new();
        for (size, attempt) in tenants.get(tenant).iter().flat_map(|s| s.attempts.iter()) {
            let entry = by_type
                .entry(attempt.activity_type.as_str())
                .or_insert_with(|| TypeSample {
                    activity_type: attempt.activity_type.clone(),
                    attempts: 0,
                    bytes: 0,
                });
            entry.attempts += 1;
            entry.bytes += *size as u64;
        }
        by_type.into_values().collect()
    }

    /// Writes every sample that changed since it was last written.
    pub fn flush(&self) {
        let Some(dir) = &self.dir else {
            return;
        };
        let _one_at_a_time = lock(&self.flushing);
        // Pointers copied out under the lock, serialized outside it:
        // recording tasks wait for no write.
        let changed: Vec<(String, Vec<Arc<Attempt>>)> = {
            let mut tenants = lock(&self.tenants);
            let now = now_ms();
            tenants
                .iter_mut()
                .filter_map(|(name, sample)| {
                    sample.expire(now);
                    if !sample.dirty {
                        return None;
                    }
                    sample.dirty = false;
                    let attempts = sample.attempts.iter().map(|(_, a)| a.clone()).collect();
                    Some((name.clone(), attempts))
                })
                .collect()
        };
        for (tenant, attempts) in changed {
            let path = file(dir, &tenant);
            let attempts: Vec<&Attempt> = attempts.iter().map(|a| &**a).collect();
            let Ok(bytes) = serde_json::to_vec(&attempts) else {
                continue;
            };
            if let Err(e) = write_atomically(&path, &bytes) {
                tracing::warn!(
                    tenant,
                    "writing the recorded attempts to {}: {e}",
                    path.display()
                );
            }
        }
    }
}

/// A tenant's file: named by the hex of its name, whatever the name holds.
fn file(dir: &Path, tenant: &str) -> PathBuf {
    dir.join(format!("{}.json", hex::encode(tenant)))
}

fn read(path: &Path) -> Vec<Attempt> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            tracing::warn!(
                "reading recorded attempts from {}: {e}; starting a new sample",
                path.display()
            );
            return Vec::new();
        }
    };
    serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        tracing::warn!(
            "recorded attempts in {} do not parse ({e}); starting a new sample",
            path.display()
        );
        Vec::new()
    })
}

/// One tenant's recorder, as its tasks see it.
struct TenantSampler {
    samples: Weak<Samples>,
    tenant: String,
    policy: Shadow,
}

impl Sampler for TenantSampler {
    fn records(&self, activity_type: &str) -> bool {
        self.policy.records(activity_type)
    }

    fn offer(&self, attempt: Attempt) {
        let size = attempt.size();
        if let Some(samples) = self.samples.upgrade()
            && let Some(sample) = lock(&samples.tenants).get_mut(&self.tenant)
        {
            sample.put(attempt, size, now_ms());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_core::sandbox::shadow::Ending;

    fn attempt(ty: &str, arg: &str, at_ms: i64) -> Attempt {
        Attempt {
            activity_type: ty.into(),
            version: "sha256:00".into(),
            args: vec![arg.into()],
            ending: Ending {
                class: None,
                digest: String::new(),
            },
            exchanges: Vec::new(),
            fuel: 1,
            at_ms,
        }
    }

    fn policy(sample: u32) -> Shadow {
        Shadow::new(
            &["a", "b"],
            sample,
            super::super::DEFAULT_EXPIRE,
            64 * 1024,
            None,
        )
        .unwrap()
    }

    #[test]
    fn a_sample_keeps_the_newest_of_each_type_in_its_room_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let samples = Samples::open(Some(dir.path()), vec![("t".into(), policy(2))]);
        let sampler = samples.sampler("t").unwrap();
        let now = now_ms();
        for (i, arg) in ["1", "2", "3"].iter().enumerate() {
            sampler.0.offer(attempt("a", arg, now + i as i64));
        }
        sampler.0.offer(attempt("b", "x", now));
        sampler.0.offer(attempt(
            "c",
            "not recorded by the policy: kept if offered",
            now,
        ));
        let args = |ty| -> Vec<String> {
            samples
                .of("t", ty)
                .iter()
                .map(|a| a.args[0].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(args("a"), ["2", "3"]);
        assert_eq!(args("b"), ["x"]);
        assert!(samples.sampler("other").is_none());
        // Too old: never kept.
        sampler.0.offer(attempt("b", "old", 0));
        assert_eq!(args("b"), ["x"]);
        samples.flush();
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join("shadow"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // Read back under a smaller sample: the newest of each type stay.
        let one = Samples::open(Some(dir.path()), vec![("t".into(), policy(1))]);
        assert_eq!(one.of("t", "a")[0].args[0], "3");
        let again = Samples::open(Some(dir.path()), vec![("t".into(), policy(2))]);
        assert_eq!(again.of("t", "a").len(), 2);
        assert!(
            again.of("t", "c").is_empty(),
            "a type the policy does not record is dropped"
        );
        // A version takes the room: the oldest attempts go.
        let kept = |s: &Samples| s.summary("t").iter().map(|s| s.attempts).sum::<usize>();
        let bytes = |s: &Samples| s.summary("t").iter().map(|s| s.bytes).sum::<u64>();
        let (before, room) = (kept(&samples), bytes(&samples) - 1);
        samples.set_room("t", room);
        assert!(kept(&samples) < before);
        assert!(bytes(&samples) <= room);
        assert_eq!(
            args("a").last().map(String::as_str),
            Some("3"),
            "the newest stay"
        );
        samples.set_room("t", 0);
        assert_eq!(bytes(&samples), 0);
        // A tenant recorded no more: its attempts are deleted at start.
        drop(Samples::open(Some(dir.path()), Vec::new()));
        assert_eq!(
            std::fs::read_dir(dir.path().join("shadow"))
                .unwrap()
                .count(),
            0
        );
    }
}
