//! sdk-core's activity slots, backed by corral's tenant permits: the worker
//! asks Temporal for a task only once it holds a tenant permit, so a tenant
//! never accepts more than its limit. (Host slots are taken when a task
//! starts: a poll holds its slot for as long as it waits for work.)

use temporalio_sdk_core::{
    ActivitySlotKind, SlotMarkUsedContext, SlotReleaseContext, SlotReservationContext,
    SlotSupplier, SlotSupplierPermit,
};

use corral_core::session::TenantSlots;

/// sdk-core asks for slots (and how many are free) several times per task:
/// the tenant's semaphore is held here, not looked up by name each time.
pub struct PermitSlots(pub TenantSlots);

#[async_trait::async_trait]
impl SlotSupplier for PermitSlots {
    type SlotKind = ActivitySlotKind;

    async fn reserve_slot(&self, _: &dyn SlotReservationContext) -> SlotSupplierPermit {
        match self.0.acquire().await {
            // The permit is released when sdk-core drops the slot.
            Some(permit) => SlotSupplierPermit::with_user_data(permit),
            // Closed permits mean the host is shutting down: never hand out
            // a slot then.
            None => std::future::pending().await,
        }
    }

    fn try_reserve_slot(&self, _: &dyn SlotReservationContext) -> Option<SlotSupplierPermit> {
        self.0.try_acquire().map(SlotSupplierPermit::with_user_data)
    }

    fn mark_slot_used(&self, _: &dyn SlotMarkUsedContext<SlotKind = ActivitySlotKind>) {}

    fn release_slot(&self, _: &dyn SlotReleaseContext<SlotKind = ActivitySlotKind>) {}

    fn available_slots(&self) -> Option<usize> {
        let usage = self.0.usage();
        Some(usage.limit - usage.in_use)
    }
}
