//! What the host counts: task outcomes by class, durations, in-flight tasks,
//! uploads, activations and component loads, per tenant and activity type.
//! Read by the admin API's `Status` and rendered for Prometheus.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::share::CpuUse;

/// Upper bounds (seconds) of the duration histograms' buckets.
const BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0,
];

/// The outcome label of a task that completed.
pub const COMPLETED: &str = "Completed";

#[derive(Debug, Default, Clone)]
struct Histogram {
    /// Cumulative counts, one per bucket of `BUCKETS`.
    buckets: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (bound, count) in BUCKETS.iter().zip(self.buckets.iter_mut()) {
            if seconds <= *bound {
                *count += 1;
            }
        }
        self.sum += seconds;
        self.count += 1;
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Tenant → activity type → outcome → count. Nested, not keyed by
    /// tuples, so counting a task builds no key once its labels were seen.
    outcomes: BTreeMap<String, BTreeMap<String, BTreeMap<String, u64>>>,
    /// Tenant → activity type → durations.
    durations: BTreeMap<String, BTreeMap<String, Histogram>>,
    instantiate: BTreeMap<String, Histogram>,
    /// Tenant → tasks that ran in a warm instance.
    reused: BTreeMap<String, u64>,
    in_flight: BTreeMap<String, u64>,
    uploads: BTreeMap<(String, &'static str), u64>,
    activations: BTreeMap<String, u64>,
    /// Tenant → versions its roll-out holds for approval.
    held: BTreeMap<String, usize>,
    /// Tenant → canaries rolled back by themselves.
    rollbacks: BTreeMap<String, u64>,
    /// (Tenant, reason) → versions refused for want of a trusted signature.
    unsigned: BTreeMap<(String, &'static str), u64>,
    loads: BTreeMap<&'static str, u64>,
    /// Tenant → activity type → CPU used and waited for.
    cpu: BTreeMap<String, BTreeMap<String, Arc<TypeCpu>>>,
    /// Tenant → time its cap held a runnable task back.
    throttled: BTreeMap<String, Duration>,
}

/// One activity type's CPU, used and waited for, counted as its tasks run:
/// a task's scheduler holds its type's counters ([`Metrics::cpu_of`]) and
/// adds to them without the metrics' lock or a lookup by name.
#[derive(Debug, Default)]
pub struct TypeCpu {
    /// Nanoseconds.
    used: AtomicU64,
    waited: AtomicU64,
}

impl TypeCpu {
    pub fn add(&self, used: CpuUse) {
        // Saturating: waits add up across tasks in line (a second a second
        // for each), so a busy host's total could wrap in weeks.
        let add = |counter: &AtomicU64, d: Duration| {
            let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |total| {
                Some(total.saturating_add(nanos))
            });
        };
        add(&self.used, used.cpu);
        // (Most tasks never wait: one atomic update fewer.)
        if !used.waited.is_zero() {
            add(&self.waited, used.waited);
        }
    }

    /// CPU used, and waited for, so far.
    fn read(&self) -> (Duration, Duration) {
        (
            Duration::from_nanos(self.used.load(Ordering::Relaxed)),
            Duration::from_nanos(self.waited.load(Ordering::Relaxed)),
        )
    }
}

/// A tenant's CPU: see [`Metrics::cpu`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantCpu {
    pub used: Duration,
    pub waited: Duration,
    pub throttled: Duration,
}

/// Gauges the caller knows and the registry does not (permits).
#[derive(Debug, Clone, Default)]
pub struct Gauges {
    pub host_permits: (usize, usize),
    /// Tenant → (in use, limit).
    pub tenant_permits: BTreeMap<String, (usize, usize)>,
    /// (Tenant, activity type) → (in use, limit), for types with their own.
    pub type_permits: BTreeMap<(String, String), (usize, usize)>,
}

/// The host's counters, shared by the session loop and the control plane.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::sync::lock(&self.inner)
    }

    pub fn task_started(&self, tenant: &str) {
        *entry(&mut self.lock().in_flight, tenant) += 1;
    }

    /// `outcome` is [`COMPLETED`] or a failure class.
    pub fn task_finished(&self, tenant: &str, activity_type: &str, outcome: &str, took: Duration) {
        let mut inner = self.lock();
        if let Some(n) = inner.in_flight.get_mut(tenant) {
            *n = n.saturating_sub(1);
        }
        let outcomes = entry(entry(&mut inner.outcomes, tenant), activity_type);
        *entry(outcomes, outcome) += 1;
        entry(entry(&mut inner.durations, tenant), activity_type).observe(took.as_secs_f64());
    }

    /// The counters of `tenant`'s `activity_type` CPU, made the first time
    /// either is asked for.
    pub fn cpu_of(&self, tenant: &str, activity_type: &str) -> Arc<TypeCpu> {
        entry(entry(&mut self.lock().cpu, tenant), activity_type).clone()
    }

    /// The CPU one task's execution used, and how long it was runnable
    /// but waited for a core.
    #[cfg(test)]
    pub fn cpu_used(&self, tenant: &str, activity_type: &str, used: CpuUse) {
        self.cpu_of(tenant, activity_type).add(used);
    }

    /// A tenant's CPU so far: used and waited for by its finished tasks,
    /// and held back by its cap.
    pub fn cpu(&self, tenant: &str) -> TenantCpu {
        let inner = self.lock();
        let (used, waited) = inner
            .cpu
            .get(tenant)
            .into_iter()
            .flat_map(BTreeMap::values)
            .map(|counters| counters.read())
            .fold((Duration::ZERO, Duration::ZERO), |(u, w), (cpu, waited)| {
                (u + cpu, w + waited)
            });
        TenantCpu {
            used,
            waited,
            throttled: inner.throttled.get(tenant).copied().unwrap_or_default(),
        }
    }

    /// A tenant's cap held a runnable task back for `took`.
    pub fn cpu_throttled(&self, tenant: &str, took: Duration) {
        *entry(&mut self.lock().throttled, tenant) += took;
    }

    /// How long creating a task's store and instance took.
    pub fn instantiated(&self, tenant: &str, took: Duration) {
        entry(&mut self.lock().instantiate, tenant).observe(took.as_secs_f64());
    }

    /// A task ran in a warm instance instead of a new one.
    pub fn task_reused(&self, tenant: &str) {
        *entry(&mut self.lock().reused, tenant) += 1;
    }

    /// A tenant's tasks that ran in a warm instance.
    pub fn reused_tasks(&self, tenant: &str) -> u64 {
        self.lock().reused.get(tenant).copied().unwrap_or(0)
    }

    pub fn upload(&self, tenant: &str, accepted: bool) {
        let result = if accepted { "accepted" } else { "rejected" };
        *self
            .lock()
            .uploads
            .entry((tenant.to_owned(), result))
            .or_default() += 1;
    }

    pub fn activation(&self, tenant: &str) {
        *self
            .lock()
            .activations
            .entry(tenant.to_owned())
            .or_default() += 1;
    }

    /// How many of `tenant`'s versions its roll-out holds for approval.
    pub fn versions_held(&self, tenant: &str, held: usize) {
        self.lock().held.insert(tenant.to_owned(), held);
    }

    /// `n` of `tenant`'s canaries were rolled back.
    pub fn canary_rolled_back(&self, tenant: &str, n: u64) {
        if n > 0 {
            *self.lock().rollbacks.entry(tenant.to_owned()).or_default() += n;
        }
    }

    /// A version of `tenant` was refused (or, where signatures are not
    /// required, stored as unsigned) for want of a trusted signature:
    /// `reason` a fixed word (`unsigned`, `untrusted_key`, …).
    pub fn signature_refused(&self, tenant: &str, reason: &'static str) {
        *self
            .lock()
            .unsigned
            .entry((tenant.to_owned(), reason))
            .or_default() += 1;
    }

    /// A component was made ready: compiled now, or read precompiled.
    pub fn component_loaded(&self, from_cache: bool) {
        let source = if from_cache { "cache" } else { "compiled" };
        *self.lock().loads.entry(source).or_default() += 1;
    }

    /// A tenant's finished tasks by outcome.
    pub fn outcomes(&self, tenant: &str) -> BTreeMap<String, u64> {
        let inner = self.lock();
        let mut by_outcome = BTreeMap::new();
        for of_type in inner
            .outcomes
            .get(tenant)
            .into_iter()
            .flat_map(BTreeMap::values)
        {
            for (outcome, n) in of_type {
                *by_outcome.entry(outcome.clone()).or_default() += n;
            }
        }
        by_outcome
    }

    /// A tenant's tasks executing now.
    pub fn in_flight(&self, tenant: &str) -> u64 {
        self.lock().in_flight.get(tenant).copied().unwrap_or(0)
    }

    /// The Prometheus text exposition format.
    pub fn render(&self, gauges: &Gauges) -> String {
        let inner = self.lock();
        let mut out = String::new();
        header(
            &mut out,
            "corral_tasks_total",
            "counter",
            "Finished tasks by outcome (Completed or a failure class).",
        );
        for (tenant, ty, by_outcome) in flatten(&inner.outcomes) {
            for (outcome, n) in by_outcome {
                let _ = writeln!(
                    out,
                    "corral_tasks_total{{tenant=\"{}\",activity_type=\"{}\",outcome=\"{}\"}} {n}",
                    escape(tenant),
                    escape(ty),
                    escape(outcome)
                );
            }
        }
        header(
            &mut out,
            "corral_task_duration_seconds",
            "histogram",
            "Task durations, from start to outcome.",
        );
        for (tenant, ty, h) in flatten(&inner.durations) {
            let labels = format!(
                "tenant=\"{}\",activity_type=\"{}\"",
                escape(tenant),
                escape(ty)
            );
            histogram(&mut out, "corral_task_duration_seconds", &labels, h);
        }
        header(
            &mut out,
            "corral_instantiate_seconds",
            "histogram",
            "Time to create a task's store and instance.",
        );
        for (tenant, h) in &inner.instantiate {
            let labels = format!("tenant=\"{}\"", escape(tenant));
            histogram(&mut out, "corral_instantiate_seconds", &labels, h);
        }
        header(
            &mut out,
            "corral_instances_reused_total",
            "counter",
            "Tasks that ran in a warm instance (tenants with `reuse`) instead of a new one.",
        );
        for (tenant, n) in &inner.reused {
            let _ = writeln!(
                out,
                "corral_instances_reused_total{{tenant=\"{}\"}} {n}",
                escape(tenant)
            );
        }
        header(
            &mut out,
            "corral_tasks_in_flight",
            "gauge",
            "Tasks executing now.",
        );
        for (tenant, n) in &inner.in_flight {
            let _ = writeln!(
                out,
                "corral_tasks_in_flight{{tenant=\"{}\"}} {n}",
                escape(tenant)
            );
        }
        // One label set per scope, shared by the in-use and limit series.
        let mut permits = vec![(
            "scope=\"host\"".to_owned(),
            gauges.host_permits.0,
            gauges.host_permits.1,
        )];
        for (tenant, (used, limit)) in &gauges.tenant_permits {
            permits.push((
                format!("scope=\"tenant\",tenant=\"{}\"", escape(tenant)),
                *used,
                *limit,
            ));
        }
        for ((tenant, ty), (used, limit)) in &gauges.type_permits {
            permits.push((
                format!(
                    "scope=\"type\",tenant=\"{}\",activity_type=\"{}\"",
                    escape(tenant),
                    escape(ty)
                ),
                *used,
                *limit,
            ));
        }
        header(
            &mut out,
            "corral_permits_in_use",
            "gauge",
            "Concurrency permits held.",
        );
        for (labels, used, _) in &permits {
            let _ = writeln!(out, "corral_permits_in_use{{{labels}}} {used}");
        }
        header(
            &mut out,
            "corral_permits_limit",
            "gauge",
            "Concurrency limits.",
        );
        for (labels, _, limit) in &permits {
            let _ = writeln!(out, "corral_permits_limit{{{labels}}} {limit}");
        }
        header(
            &mut out,
            "corral_uploads_total",
            "counter",
            "Component uploads by result.",
        );
        for ((tenant, result), n) in &inner.uploads {
            let _ = writeln!(
                out,
                "corral_uploads_total{{tenant=\"{}\",result=\"{result}\"}} {n}",
                escape(tenant)
            );
        }
        header(
            &mut out,
            "corral_activations_total",
            "counter",
            "Versions activated (uploads and rollbacks).",
        );
        for (tenant, n) in &inner.activations {
            let _ = writeln!(
                out,
                "corral_activations_total{{tenant=\"{}\"}} {n}",
                escape(tenant)
            );
        }
        header(
            &mut out,
            "corral_versions_held",
            "gauge",
            "Stored versions the tenant's rollout holds for an operator's approval.",
        );
        for (tenant, n) in &inner.held {
            let _ = writeln!(
                out,
                "corral_versions_held{{tenant=\"{}\"}} {n}",
                escape(tenant)
            );
        }
        header(
            &mut out,
            "corral_canary_rollbacks_total",
            "counter",
            "Canaries rolled back by themselves (a failure class past its margin).",
        );
        for (tenant, n) in &inner.rollbacks {
            let _ = writeln!(
                out,
                "corral_canary_rollbacks_total{{tenant=\"{}\"}} {n}",
                escape(tenant)
            );
        }
        header(
            &mut out,
            "corral_signatures_refused_total",
            "counter",
            "Versions without a signature by a key their tenant trusts, by why (refused where signatures are required).",
        );
        for ((tenant, reason), n) in &inner.unsigned {
            let _ = writeln!(
                out,
                "corral_signatures_refused_total{{tenant=\"{}\",reason=\"{reason}\"}} {n}",
                escape(tenant)
            );
        }
        header(
            &mut out,
            "corral_tenant_cpu_seconds_total",
            "counter",
            "CPU time of tasks' execution (the guest and the host's work for it), counted as it goes.",
        );
        for (tenant, ty, counters) in flatten(&inner.cpu) {
            let (cpu, _) = counters.read();
            let _ = writeln!(
                out,
                "corral_tenant_cpu_seconds_total{{tenant=\"{}\",activity_type=\"{}\"}} {}",
                escape(tenant),
                escape(ty),
                cpu.as_secs_f64()
            );
        }
        header(
            &mut out,
            "corral_tenant_cpu_wait_seconds_total",
            "counter",
            "Time tasks were runnable but waited for a core (or their tenant's cap).",
        );
        for (tenant, ty, counters) in flatten(&inner.cpu) {
            let (_, waited) = counters.read();
            let _ = writeln!(
                out,
                "corral_tenant_cpu_wait_seconds_total{{tenant=\"{}\",activity_type=\"{}\"}} {}",
                escape(tenant),
                escape(ty),
                waited.as_secs_f64()
            );
        }
        header(
            &mut out,
            "corral_tenant_cpu_throttled_seconds_total",
            "counter",
            "Time a tenant's cpu_max held its runnable tasks back.",
        );
        for (tenant, took) in &inner.throttled {
            let _ = writeln!(
                out,
                "corral_tenant_cpu_throttled_seconds_total{{tenant=\"{}\"}} {}",
                escape(tenant),
                took.as_secs_f64()
            );
        }
        header(
            &mut out,
            "corral_component_loads_total",
            "counter",
            "Components made ready, compiled or read precompiled.",
        );
        for (source, n) in &inner.loads {
            let _ = writeln!(
                out,
                "corral_component_loads_total{{source=\"{source}\"}} {n}"
            );
        }
        out
    }
}

/// The value under `key`, made (and its key allocated) only the first time
/// the key is seen.
fn entry<'m, V: Default>(map: &'m mut BTreeMap<String, V>, key: &str) -> &'m mut V {
    if !map.contains_key(key) {
        map.insert(key.to_owned(), V::default());
    }
    map.get_mut(key).expect("inserted above")
}

/// (tenant, activity type, value) of a tenant → type → value map, in order.
fn flatten<V>(
    map: &BTreeMap<String, BTreeMap<String, V>>,
) -> impl Iterator<Item = (&String, &String, &V)> {
    map.iter()
        .flat_map(|(tenant, types)| types.iter().map(move |(ty, v)| (tenant, ty, v)))
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn histogram(out: &mut String, name: &str, labels: &str, h: &Histogram) {
    for (bound, count) in BUCKETS.iter().zip(h.buckets.iter()) {
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {count}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum);
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count);
}

/// A label value as the Prometheus text format needs it: `\\`, `"` and
/// newlines escaped, so no value can end its sample or start another.
pub fn escape(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

#[cfg(test)]
mod tests;
