//! Admission: a task runs only while it holds a tenant permit and a host
//! permit. The tenant permit is taken first, so a tenant at its own limit
//! waits without holding a host slot, and never delays another tenant.

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

/// Held for as long as a task may run; dropping it frees both slots.
#[derive(Debug)]
pub struct Permit {
    _tenant: OwnedSemaphorePermit,
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

    /// Waits for a tenant slot, then a host slot. `None` when the tenant is
    /// unknown or the permits were closed (shutdown).
    pub async fn acquire(&self, tenant: &str) -> Option<Permit> {
        let (semaphore, _) = self.tenants.get(tenant)?;
        let tenant = semaphore.clone().acquire_owned().await.ok()?;
        let host = self.host.clone().acquire_owned().await.ok()?;
        Some(Permit {
            _tenant: tenant,
            _host: host,
        })
    }

    /// A permit only if one is free right now.
    pub fn try_acquire(&self, tenant: &str) -> Option<Permit> {
        let (semaphore, _) = self.tenants.get(tenant)?;
        let tenant = semaphore.clone().try_acquire_owned().ok()?;
        let host = self.host.clone().try_acquire_owned().ok()?;
        Some(Permit {
            _tenant: tenant,
            _host: host,
        })
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
    async fn a_tenant_at_its_limit_does_not_hold_host_slots() {
        let permits = Permits::new(3, [("noisy".to_owned(), 2), ("quiet".to_owned(), 2)]);
        let a = permits.acquire("noisy").await.unwrap();
        let b = permits.acquire("noisy").await.unwrap();
        // A third noisy task waits on its tenant permit...
        let waiting =
            tokio::time::timeout(Duration::from_millis(50), permits.acquire("noisy")).await;
        assert!(waiting.is_err());
        // ...without taking the last host slot from the quiet tenant.
        assert_eq!(
            permits.host_usage(),
            Usage {
                in_use: 2,
                limit: 3
            }
        );
        let q = permits
            .try_acquire("quiet")
            .expect("quiet tenant still admitted");
        assert!(permits.try_acquire("quiet").is_none(), "host limit reached");
        drop((a, b, q));
        assert_eq!(permits.host_usage().in_use, 0);
        assert_eq!(
            permits.tenant_usage("noisy"),
            Some(Usage {
                in_use: 0,
                limit: 2
            })
        );
        assert!(permits.acquire("nobody").await.is_none());
    }
}
