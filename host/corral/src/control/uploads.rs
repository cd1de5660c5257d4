//! Admission of uploads: how many may be in flight, per tenant and per
//! host. An upload over either count is refused at once, never queued.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

/// Uploads one tenant may have in flight at once.
pub const UPLOADS_PER_TENANT: usize = 2;
/// Uploads in flight at once, host-wide.
pub const UPLOADS_PER_HOST: usize = 16;

/// Slots for uploads in flight. Each holds at most one chunk in memory
/// (it is staged on disk as it arrives), so the host's memory for uploads
/// is bounded by these counts, whatever the components' sizes; an upload
/// over either is refused at once, never queued.
pub struct Uploads {
    host: Arc<Semaphore>,
    tenants: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Default for Uploads {
    fn default() -> Self {
        Uploads {
            host: Arc::new(Semaphore::new(UPLOADS_PER_HOST)),
            tenants: Default::default(),
        }
    }
}

impl Uploads {
    /// A slot for one of `tenant`'s uploads, or why not.
    pub(super) fn admit(
        &self,
        tenant: &str,
    ) -> Result<(OwnedSemaphorePermit, OwnedSemaphorePermit), Status> {
        let own = self
            .tenants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(tenant.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(UPLOADS_PER_TENANT)))
            .clone();
        let own = own.try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "tenant `{tenant}` already has {UPLOADS_PER_TENANT} uploads in flight: wait for one to finish"
            ))
        })?;
        let host = self.host.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "this host already has {UPLOADS_PER_HOST} uploads in flight: try again shortly"
            ))
        })?;
        Ok((own, host))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_in_flight_are_bounded_per_tenant_and_per_host_and_refused_at_once() {
        let uploads = Uploads::default();
        // Tenants at their own bound fill the host's, and the next is
        // refused whoever sends it.
        let mut held = Vec::new();
        for i in 0..UPLOADS_PER_HOST {
            let tenant = format!("t{}", i / UPLOADS_PER_TENANT);
            held.push(uploads.admit(&tenant).expect("within both bounds"));
        }
        let refused = uploads.admit("newcomer").unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("16 uploads in flight"),
            "{}",
            refused.message()
        );
        // A tenant at its own bound is refused by name.
        let refused = uploads.admit("t0").unwrap_err();
        assert!(
            refused
                .message()
                .contains("tenant `t0` already has 2 uploads"),
            "{}",
            refused.message()
        );
        // One finishing frees a slot for anyone.
        held.pop();
        assert!(uploads.admit("newcomer").is_ok());
    }
}
