//! Admission: a task runs only while it holds a tenant permit and a host
//! permit. The tenant permit is taken before the engine is asked for work,
//! so a tenant never accepts more than it may run. The host permit is taken
//! when the task starts, first come first served across tenants: engines
//! that long-poll hold their reservations while they wait for work, and an
//! idle tenant holding host slots that way would starve a busy one. So a
//! tenant at its limit never delays another, and every tenant below its
//! limit gets the next free host slot in turn.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Permits for the whole host and for each tenant.
#[derive(Debug, Clone)]
pub struct Permits {
    host: Arc<Semaphore>,
    host_limit: usize,
    tenants: Arc<HashMap<String, (Arc<Semaphore>, usize)>>,
}

/// A tenant slot, held from before the engine is asked for a task until
/// the task is reported.
#[derive(Debug)]
pub struct Permit {
    _tenant: OwnedSemaphorePermit,
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
                    .map(|(name, limit)| (name, (Arc::new(Semaphore::new(limit)), limit)))
                    .collect(),
            ),
        }
    }

    /// Waits for a tenant slot. `None` when the tenant is unknown or the
    /// permits were closed (shutdown).
    pub async fn acquire(&self, tenant: &str) -> Option<Permit> {
        let (semaphore, _) = self.tenants.get(tenant)?;
        let tenant = semaphore.clone().acquire_owned().await.ok()?;
        Some(Permit { _tenant: tenant })
    }

    /// A tenant slot only if one is free right now.
    pub fn try_acquire(&self, tenant: &str) -> Option<Permit> {
        let (semaphore, _) = self.tenants.get(tenant)?;
        let tenant = semaphore.clone().try_acquire_owned().ok()?;
        Some(Permit { _tenant: tenant })
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
        self.tenants.get(tenant).map(|(s, limit)| Usage {
            in_use: limit - s.available_permits(),
            limit: *limit,
        })
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
        tokio::time::sleep(Duration::from_millis(20)).await;
        let quiet_next = tokio::spawn({
            let permits = permits.clone();
            async move { permits.host_slot().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
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
}
