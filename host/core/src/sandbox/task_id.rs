//! Which task this is, as the host's log lines, spans and refusals name it:
//! a leaf that output capture and outbound HTTP both read.

use std::sync::Arc;

/// Who is writing, for log fields.
#[derive(Debug, Clone, Default)]
pub struct TaskLabels {
    pub tenant: Arc<str>,
    pub activity_type: Arc<str>,
    pub activity_id: String,
}
