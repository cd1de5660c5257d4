//! Admission: a task runs only while it holds a tenant permit and a host
//! permit. The tenant permit is taken before the engine is asked for work,
//! so a tenant never accepts more than it may run. The host permit is taken
//! when the task starts, first come first served across tenants: engines
//! that long-poll hold their reservations while they wait for work, and an
//! idle tenant holding host slots that way would starve a busy one. So a
//! tenant at its limit never delays another, and every tenant below its
//! limit gets the next free host slot in turn.
//!
//! An activity type may have its own limit within its tenant's. Neither
//! engine can be asked for a task of one type, so the type slot is taken
//! once the task has arrived, before its host slot: a task of a type at its
//! limit waits (holding only its tenant slot, heartbeated) for a sibling to
//! finish. A push engine (Aion) is refused such a task instead, and
//! re-dispatches it later.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Registry;

/// A semaphore and the limit it was made with.
type Limited = (Arc<Semaphore>, usize);

/// Permits for the whole host and for each tenant.
#[derive(Debug, Clone)]
pub struct Permits {
    host: Arc<Semaphore>,
    host_limit: usize,
    tenants: Arc<HashMap<String, TenantSlots>>,
    /// Tenant → activity type (as configured) → its own limit. Looked up
    /// by `&str` on every task, so no key is built per lookup.
    types: Arc<HashMap<String, HashMap<String, Limited>>>,
}

/// A connector for a tenant the host made no permits for (a host bug).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tenant `{0}` has no permits (a host bug)")]
pub struct NoPermits(pub String);

/// A tenant slot, held from before the engine is asked for a task until
/// the task is reported.
#[derive(Debug)]
pub struct Permit {
    _tenant: OwnedSemaphorePermit,
}

/// A slot of an activity type with its own limit, held while a task of
/// that type waits for its host slot and executes.
#[derive(Debug)]
pub struct TypeSlot {
    _type: OwnedSemaphorePermit,
}

/// What [`Permits::try_type_slot`] found.
#[derive(Debug)]
pub enum TypeAdmission {
    /// The type has no limit of its own.
    Unlimited,
    /// A slot, to hold until the task ends.
    Held(TypeSlot),
    /// Every slot of the type is taken.
    Full,
}

/// A host slot, held while a task executes.
#[derive(Debug)]
pub struct HostSlot {
    _host: OwnedSemaphorePermit,
}

/// In-use and limit of one semaphore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub in_use: usize,
    pub limit: usize,
}

impl Permits {
    /// `tenants` gives each tenant's own limit. Limits are validated (≥ 1)
    /// when the configuration is read.
    pub fn new(host_limit: usize, tenants: impl IntoIterator<Item = (String, usize)>) -> Self {
        Permits {
            host: Arc::new(Semaphore::new(host_limit)),
            host_limit,
            tenants: Arc::new(
                tenants
                    .into_iter()
                    .map(|(name, limit)| {
                        let semaphore = Arc::new(Semaphore::new(limit));
                        (name, TenantSlots { semaphore, limit })
                    })
                    .collect(),
            ),
            types: Arc::default(),
        }
    }

    /// Gives activity types of `tenant` their own limits, by the name an
    /// engine uses (an alias) or the full WIT name. Limits are validated
    /// (≥ 1) when the configuration is read.
    pub fn with_type_limits(
        mut self,
        tenant: &str,
        limits: impl IntoIterator<Item = (String, usize)>,
    ) -> Self {
        let mut types = (*self.types).clone();
        let own = types.entry(tenant.to_owned()).or_default();
        for (name, limit) in limits {
            own.insert(name, (Arc::new(Semaphore::new(limit)), limit));
        }
        self.types = Arc::new(types);
        self
    }

    /// The names a task of `activity_type` is limited under: every name
    /// the type is served by (see [`Registry::names`]) when its tenant has
    /// type limits at all; none otherwise, sparing the lookup.
    pub fn type_names(
        &self,
        registry: &Registry,
        tenant: &str,
        activity_type: &str,
    ) -> Vec<String> {
        if self.types.get(tenant).is_some_and(|own| !own.is_empty()) {
            registry.names(tenant, activity_type)
        } else {
            Vec::new()
        }
    }

    /// The semaphore of the first of `names` (the engine's name, then the
    /// type's other names: see `Registry::names`) that has its own limit.
    fn type_semaphore<N: AsRef<str>>(&self, tenant: &str, names: &[N]) -> Option<&Arc<Semaphore>> {
        let own = self.types.get(tenant)?;
        names
            .iter()
            .find_map(|name| own.get(name.as_ref()).map(|(s, _)| s))
    }

    /// Waits for a slot of the activity type; `None` at once when the type
    /// has no limit of its own (or the permits were closed).
    pub async fn type_slot<N: AsRef<str>>(&self, tenant: &str, names: &[N]) -> Option<TypeSlot> {
        let semaphore = self.type_semaphore(tenant, names)?.clone();
        let slot = semaphore.acquire_owned().await.ok()?;
        Some(TypeSlot { _type: slot })
    }

    /// A slot of the type now, for an engine that refuses a task instead of
    /// letting it wait (Aion): checking and taking are one step, so two
    /// tasks arriving together cannot both pass a limit of one.
    pub fn try_type_slot<N: AsRef<str>>(&self, tenant: &str, names: &[N]) -> TypeAdmission {
        let Some(semaphore) = self.type_semaphore(tenant, names) else {
            return TypeAdmission::Unlimited;
        };
        match semaphore.clone().try_acquire_owned() {
            Ok(slot) => TypeAdmission::Held(TypeSlot { _type: slot }),
            Err(_) => TypeAdmission::Full,
        }
    }

    /// Every activity type with its own limit: (tenant, type) → usage.
    pub fn type_usage(&self) -> Vec<((String, String), Usage)> {
        let mut usage: Vec<_> = self
            .types
            .iter()
            .flat_map(|(tenant, own)| {
                own.iter().map(move |(name, (s, limit))| {
                    (
                        (tenant.clone(), name.clone()),
                        Usage {
                            in_use: limit - s.available_permits(),
                            limit: *limit,
                        },
                    )
                })
            })
            .collect();
        usage.sort_by(|a, b| a.0.cmp(&b.0));
        usage
    }

    /// One tenant's slots, to hold on to instead of looking the tenant up
    /// by name on every call. `None` for an unknown tenant.
    pub fn tenant(&self, tenant: &str) -> Option<TenantSlots> {
        self.tenants.get(tenant).cloned()
    }

    /// [`Permits::tenant`] for a connector, whose tenant the host made
    /// permits for before connecting it.
    pub fn slots_of(&self, tenant: &str) -> Result<TenantSlots, NoPermits> {
        self.tenant(tenant)
            .ok_or_else(|| NoPermits(tenant.to_owned()))
    }

    /// Waits for a tenant slot. `None` when the tenant is unknown or the
    /// permits were closed (shutdown).
    pub async fn acquire(&self, tenant: &str) -> Option<Permit> {
        self.tenants.get(tenant)?.acquire().await
    }

    /// A tenant slot only if one is free right now.
    pub fn try_acquire(&self, tenant: &str) -> Option<Permit> {
        self.tenants.get(tenant)?.try_acquire()
    }

    /// Waits for a host slot (in arrival order, whichever the tenant).
    pub async fn host_slot(&self) -> Option<HostSlot> {
        let host = self.host.clone().acquire_owned().await.ok()?;
        Some(HostSlot { _host: host })
    }

    /// Host-wide usage.
    pub fn host_usage(&self) -> Usage {
        Usage {
            in_use: self.host_limit - self.host.available_permits(),
            limit: self.host_limit,
        }
    }

    /// A tenant's usage.
    pub fn tenant_usage(&self, tenant: &str) -> Option<Usage> {
        self.tenants.get(tenant).map(TenantSlots::usage)
    }
}

/// One tenant's slots (see [`Permits::tenant`]).
#[derive(Debug, Clone)]
pub struct TenantSlots {
    semaphore: Arc<Semaphore>,
    limit: usize,
}

impl TenantSlots {
    /// Waits for a slot; `None` once the permits were closed (shutdown).
    pub async fn acquire(&self) -> Option<Permit> {
        let tenant = self.semaphore.clone().acquire_owned().await.ok()?;
        Some(Permit { _tenant: tenant })
    }

    /// A slot only if one is free right now.
    pub fn try_acquire(&self) -> Option<Permit> {
        let tenant = self.semaphore.clone().try_acquire_owned().ok()?;
        Some(Permit { _tenant: tenant })
    }

    pub fn usage(&self) -> Usage {
        Usage {
            in_use: self.limit - self.semaphore.available_permits(),
            limit: self.limit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn tenant_slots_are_separate_and_host_slots_go_in_arrival_order() {
        let permits = Permits::new(1, [("noisy".to_owned(), 2), ("quiet".to_owned(), 2)]);
        let a = permits.acquire("noisy").await.unwrap();
        let _b = permits.acquire("noisy").await.unwrap();
        // A third noisy task waits on its tenant slot...
        let waiting =
            tokio::time::timeout(Duration::from_millis(50), permits.acquire("noisy")).await;
        assert!(waiting.is_err());
        // ...while the quiet tenant is admitted, and idle tenant slots hold
        // no host slot.
        let q = permits.try_acquire("quiet").expect("quiet tenant admitted");
        assert_eq!(
            permits.host_usage(),
            Usage {
                in_use: 0,
                limit: 1
            }
        );

        let running = permits.host_slot().await.unwrap();
        let noisy_next = tokio::spawn({
            let permits = permits.clone();
            async move { permits.host_slot().await }
        });
        // One thread: each spawned task runs until it waits, in turn, as
        // soon as this one yields.
        tokio::task::yield_now().await;
        let quiet_next = tokio::spawn({
            let permits = permits.clone();
            async move { permits.host_slot().await }
        });
        tokio::task::yield_now().await;
        drop(running);
        let first = noisy_next.await.unwrap().unwrap();
        assert!(!quiet_next.is_finished(), "first come, first served");
        drop(first);
        assert!(quiet_next.await.unwrap().is_some());
        drop((a, q));
        assert_eq!(
            permits.tenant_usage("noisy"),
            Some(Usage {
                in_use: 1,
                limit: 2
            })
        );
        assert!(permits.acquire("nobody").await.is_none());
    }

    #[tokio::test]
    async fn a_type_with_its_own_limit_waits_for_a_sibling() {
        let permits =
            Permits::new(4, [("t".to_owned(), 4)]).with_type_limits("t", [("Slow".to_owned(), 1)]);
        assert!(
            permits
                .type_slot("t", &["Fast", "demo:x/api.fast"])
                .await
                .is_none()
        );
        // By alias or by full name, whichever is configured.
        let first = permits.type_slot("t", &["demo:x/api.slow", "Slow"]).await;
        assert!(first.is_some());
        assert!(matches!(
            permits.try_type_slot("t", &["Slow"]),
            TypeAdmission::Full
        ));
        assert!(matches!(
            permits.try_type_slot("t", &["Fast"]),
            TypeAdmission::Unlimited
        ));
        let second =
            tokio::time::timeout(Duration::from_millis(50), permits.type_slot("t", &["Slow"]))
                .await;
        assert!(second.is_err(), "the second waits");
        assert_eq!(
            permits.type_usage(),
            [(
                ("t".to_owned(), "Slow".to_owned()),
                Usage {
                    in_use: 1,
                    limit: 1
                }
            )]
        );
        drop(first);
        assert!(permits.type_slot("t", &["Slow"]).await.is_some());
    }

    #[test]
    fn a_held_tenant_handle_shares_the_tenants_slots() {
        let permits = Permits::new(4, [("t".to_owned(), 2)]);
        assert!(permits.tenant("nobody").is_none());
        let slots = permits.tenant("t").unwrap();
        let held = slots.try_acquire().unwrap();
        // Taken through the handle, seen by name, and the other way round.
        assert_eq!(permits.tenant_usage("t").unwrap().in_use, 1);
        let _by_name = permits.try_acquire("t").unwrap();
        assert_eq!(
            slots.usage(),
            Usage {
                in_use: 2,
                limit: 2
            }
        );
        assert!(slots.try_acquire().is_none());
        drop(held);
        assert!(slots.try_acquire().is_some());
    }
}
