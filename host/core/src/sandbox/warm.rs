//! Warm instances: a tenant that opts in (`reuse`) has its next task run in
//! the instance its last one left, instead of instantiating afresh.
//!
//! What persists is the guest's own: its linear memory and globals (an
//! interpreter's loaded modules, a cache it filled). Everything the host
//! gives a task is new for each one (see `execute`): the WASI context, the
//! HTTP context and its budgets, fuel, deadline, output budget, `info()`,
//! cancellation. Of the resource table only the standard output and error
//! streams a guest's libc keeps may carry over, and they write to the
//! current task's output; an instance left holding any other handle is not
//! kept.
//!
//! An instance is kept only by the pool of one prepared tenant (one version
//! of its grants, config and secrets; a deployment with its own config has
//! its own) and for one exact component: a new version of either starts
//! with no warm instance. It is taken out while a task runs in it, so two
//! tasks never share one; it is retired after `max_tasks` tasks, after
//! `idle` unused, and after any task that did not end cleanly (see
//! `execute`).
//!
//! Idle instances hold pool slots and their memory: the host keeps at most
//! [`SandboxConfig::max_warm`](super::SandboxConfig) of them in all (the
//! pool has that many slots beyond `max_instances`, so a task can always
//! instantiate). A returning instance finding the host at that number takes
//! the place of the oldest instance of the pool keeping the most (if it
//! keeps at least two more than its own pool), or is retired.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use wasmtime::Store;
use wasmtime::component::Instance;

use super::context::TaskState;
use crate::sync::lock;

/// A tenant's instance reuse, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reuse {
    max_tasks: u32,
    idle: Duration,
}

impl Reuse {
    pub const MAX_TASKS: u32 = 1_000_000;
    pub const MAX_IDLE: Duration = Duration::from_secs(3600);

    /// At most `max_tasks` tasks per instance (2 or more: 1 is no reuse),
    /// each instance kept at most `idle` (at most an hour) between two.
    pub fn new(max_tasks: i64, idle: Duration) -> Result<Reuse, ReuseError> {
        let max_tasks = match u32::try_from(max_tasks) {
            Ok(n) if (2..=Self::MAX_TASKS).contains(&n) => n,
            _ => return Err(ReuseError::MaxTasks(max_tasks)),
        };
        if idle.is_zero() || idle > Self::MAX_IDLE {
            return Err(ReuseError::Idle(idle));
        }
        Ok(Reuse { max_tasks, idle })
    }

    pub fn max_tasks(self) -> u32 {
        self.max_tasks
    }

    pub fn idle(self) -> Duration {
        self.idle
    }
}

/// Why a reuse setting was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReuseError {
    #[error("max_tasks: must be a whole number from 2 to 1000000, got {0}")]
    MaxTasks(i64),
    #[error("idle: must be more than 0 and at most 1h, got {0:?}")]
    Idle(Duration),
}

/// A deployment's own reuse, over its tenant's `reuse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeploymentReuse {
    /// As its tenant.
    #[default]
    Tenant,
    /// A new instance for every task, whatever the tenant's.
    Off,
    /// Warm instances with these bounds, whatever the tenant's.
    On(Reuse),
}

impl DeploymentReuse {
    /// What a deployment of a tenant reusing as `tenant` does.
    pub fn over(self, tenant: Option<Reuse>) -> Option<Reuse> {
        match self {
            DeploymentReuse::Tenant => tenant,
            DeploymentReuse::Off => None,
            DeploymentReuse::On(reuse) => Some(reuse),
        }
    }
}

/// An instance between two tasks, with the store it lives in.
pub(crate) struct Warm {
    pub(crate) store: Store<TaskState>,
    pub(crate) instance: Instance,
    /// Tasks it has run.
    pub(crate) tasks: u32,
    /// When it was made: its guest's monotonic clock counts from here in
    /// every task, so time never runs backwards for it.
    pub(crate) born: Instant,
    /// Which loaded component it is an instance of.
    component: u64,
    since: Instant,
}

impl Warm {
    pub(crate) fn new(
        store: Store<TaskState>,
        instance: Instance,
        tasks: u32,
        born: Instant,
        component: u64,
    ) -> Self {
        Warm {
            store,
            instance,
            tasks,
            born,
            component,
            since: Instant::now(),
        }
    }
}

/// The host's count of idle warm instances and every pool, so idle ones
/// can be retired on time.
#[derive(Default)]
pub(crate) struct WarmHost {
    max_idle: usize,
    idle: AtomicUsize,
    pools: Mutex<Vec<Weak<Pool>>>,
}

impl WarmHost {
    pub(crate) fn new(max_idle: u32) -> Self {
        WarmHost {
            max_idle: max_idle as usize,
            ..WarmHost::default()
        }
    }

    /// Idle warm instances now, host-wide.
    pub(crate) fn idle(&self) -> usize {
        self.idle.load(Ordering::Acquire)
    }

    /// Retires every instance idle past its tenant's `idle` at `now`;
    /// how many.
    pub(crate) fn retire_idle(&self, now: Instant) -> usize {
        self.pools()
            .iter()
            .map(|pool| pool.retire_expired(now))
            .sum()
    }

    /// Every pool still in use (the others are forgotten).
    fn pools(&self) -> Vec<Arc<Pool>> {
        let mut pools = lock(&self.pools);
        pools.retain(|p| p.strong_count() > 0);
        pools.iter().filter_map(Weak::upgrade).collect()
    }

    /// Counts one more idle instance in, if the host may keep it.
    fn reserve(&self) -> bool {
        if self.idle.fetch_add(1, Ordering::AcqRel) < self.max_idle {
            return true;
        }
        self.idle.fetch_sub(1, Ordering::AcqRel);
        false
    }

    /// The host is full: retires the oldest idle instance of the pool
    /// keeping the most, if it keeps at least two more than `pool` does
    /// (so two pools never trade an instance back and forth). So a tenant
    /// whose tasks came first cannot hold every warm slot while others
    /// reuse too: the slots even out between the pools that use them.
    fn make_room(&self, pool: &Arc<Pool>) -> bool {
        let own = lock(&pool.idle).len();
        let pools = self.pools();
        let Some(fullest) = pools.iter().max_by_key(|p| lock(&p.idle).len()) else {
            return false;
        };
        let oldest = {
            let mut idle = lock(&fullest.idle);
            if idle.len() < own + 2 {
                return false;
            }
            idle.remove(0)
        };
        self.retire(vec![oldest]);
        true
    }

    /// Drops retired instances, then counts them out: their slots are free
    /// before another instance may take their place in the count.
    fn retire(&self, retired: Vec<Warm>) -> usize {
        let n = retired.len();
        drop(retired);
        self.idle.fetch_sub(n, Ordering::AcqRel);
        n
    }
}

/// The warm instances of one prepared tenant: none unless it reuses.
///
/// Cloning makes a new, empty pool: a clone is another version of the
/// tenant (a deployment's config laid over it, a new route table), and no
/// instance may pass from one version to another.
pub(crate) struct WarmPool {
    host: Arc<WarmHost>,
    pool: Option<Arc<Pool>>,
}

struct Pool {
    reuse: Reuse,
    host: Arc<WarmHost>,
    idle: Mutex<Vec<Warm>>,
}

impl WarmPool {
    pub(crate) fn new(reuse: Option<Reuse>, host: &Arc<WarmHost>) -> Self {
        WarmPool {
            host: host.clone(),
            pool: reuse.map(|reuse| {
                let pool = Arc::new(Pool {
                    reuse,
                    host: host.clone(),
                    idle: Mutex::new(Vec::new()),
                });
                lock(&host.pools).push(Arc::downgrade(&pool));
                pool
            }),
        }
    }

    /// A new, empty pool of the same host, reusing as `reuse` says.
    pub(crate) fn with(&self, reuse: Option<Reuse>) -> Self {
        WarmPool::new(reuse, &self.host)
    }

    /// Whether an instance that has run `tasks` tasks would be kept (the
    /// host may still have no room for it): checked before readying it.
    pub(crate) fn would_keep(&self, tasks: u32) -> bool {
        self.pool
            .as_ref()
            .is_some_and(|pool| tasks < pool.reuse.max_tasks)
    }

    /// The most recently used idle instance of `component`, if one is
    /// warm; expired ones are retired on the way.
    pub(crate) fn take(&self, component: u64) -> Option<Warm> {
        let pool = self.pool.as_ref()?;
        pool.retire_expired(Instant::now());
        let mut idle = lock(&pool.idle);
        let at = idle.iter().rposition(|w| w.component == component)?;
        let warm = idle.remove(at);
        drop(idle);
        // Its slot passes to the task, which holds a permit for it.
        pool.host.idle.fetch_sub(1, Ordering::AcqRel);
        Some(warm)
    }

    /// Keeps `warm` for the next task, unless it has run its `max_tasks`
    /// or the host keeps as many idle instances as it may and no other
    /// pool holds more than its share (see [`WarmHost::make_room`]).
    pub(crate) fn put(&self, mut warm: Warm) {
        let Some(pool) = &self.pool else { return };
        if !self.would_keep(warm.tasks) {
            return;
        }
        let host = &pool.host;
        if !host.reserve() && !(host.make_room(pool) && host.reserve()) {
            return;
        }
        warm.since = Instant::now();
        lock(&pool.idle).push(warm);
    }
}

impl Clone for WarmPool {
    fn clone(&self) -> Self {
        self.with(self.pool.as_ref().map(|pool| pool.reuse))
    }
}

impl Pool {
    /// Retires the instances idle past `reuse.idle` at `now` (dropped
    /// outside the lock); how many.
    fn retire_expired(&self, now: Instant) -> usize {
        let expired = {
            let mut idle = lock(&self.idle);
            let keep = |w: &Warm| now.saturating_duration_since(w.since) < self.reuse.idle;
            if idle.iter().all(keep) {
                return 0;
            }
            let (kept, expired): (Vec<Warm>, Vec<Warm>) = idle.drain(..).partition(keep);
            *idle = kept;
            expired
        };
        self.host.retire(expired)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let idle = std::mem::take(&mut *lock(&self.idle));
        self.host.retire(idle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_needs_two_tasks_or_more_and_a_bounded_idle_time() {
        let minute = Duration::from_secs(60);
        assert!(Reuse::new(2, minute).is_ok());
        assert_eq!(Reuse::new(1, minute), Err(ReuseError::MaxTasks(1)));
        assert_eq!(Reuse::new(-3, minute), Err(ReuseError::MaxTasks(-3)));
        assert_eq!(
            Reuse::new(1_000_001, minute),
            Err(ReuseError::MaxTasks(1_000_001))
        );
        assert_eq!(
            Reuse::new(10, Duration::ZERO),
            Err(ReuseError::Idle(Duration::ZERO))
        );
        let err = Reuse::new(10, Duration::from_secs(3601)).unwrap_err();
        assert!(err.to_string().contains("at most 1h"), "{err}");
    }
}
