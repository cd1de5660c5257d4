//! sdk-core's activity slots, backed by corral's tenant permits: the worker
//! asks Temporal for a task only once it holds a tenant permit, so a tenant
//! never accepts more than its limit. (Host slots are taken when a task
//! starts: a poll holds its slot for as long as it waits for work.)

use temporalio_sdk_core::{
    ActivitySlotKind, SlotMarkUsedContext, SlotReleaseContext, SlotReservationContext,
    SlotSupplier, SlotSupplierPermit,
};

use crate::session::Permits;

pub struct PermitSlots {
    permits: Permits,
    tenant: String,
}

impl PermitSlots {
    pub fn new(permits: Permits, tenant: &str) -> Self {
        PermitSlots {
            permits,
            tenant: tenant.to_owned(),
        }
    }
}

#[async_trait::async_trait]
impl SlotSupplier for PermitSlots {
    type SlotKind = ActivitySlotKind;

    async fn reserve_slot(&self, _: &dyn SlotReservationContext) -> SlotSupplierPermit {
        match self.permits.acquire(&self.tenant).await {
            // The permit is released when sdk-core drops the slot.
            Some(permit) => SlotSupplierPermit::with_user_data(permit),
            // Permits are built from the same configuration as the workers:
            // an unknown tenant cannot happen; never hand out a slot for it.
            None => std::future::pending().await,
        }
    }

    fn try_reserve_slot(&self, _: &dyn SlotReservationContext) -> Option<SlotSupplierPermit> {
        self.permits
            .try_acquire(&self.tenant)
            .map(SlotSupplierPermit::with_user_data)
    }

    fn mark_slot_used(&self, _: &dyn SlotMarkUsedContext<SlotKind = ActivitySlotKind>) {}

    fn release_slot(&self, _: &dyn SlotReleaseContext<SlotKind = ActivitySlotKind>) {}

    fn available_slots(&self) -> Option<usize> {
        self.permits
            .tenant_usage(&self.tenant)
            .map(|u| u.limit - u.in_use)
    }
}
