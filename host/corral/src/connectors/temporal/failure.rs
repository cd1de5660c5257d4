//! corral's classified failures as Temporal failures: every class becomes an
//! `ApplicationFailure` whose type is the stable kind (so workflow authors
//! can list it in `non_retryable_error_types`), with `non_retryable` from
//! the class policy and the details as a JSON payload. Requested
//! cancellations become a `CanceledFailure`.

use temporalio_common::protos::temporal::api::common::v1::Payloads;
use temporalio_common::protos::temporal::api::failure::v1::{
    ApplicationFailureInfo, CanceledFailureInfo, Failure as TemporalFailure, failure::FailureInfo,
};

use super::payloads;
use corral_core::sandbox::Failure;

const SOURCE: &str = "corral";

fn details(failure: &Failure) -> Option<Payloads> {
    failure.details.as_ref().map(|d| Payloads {
        payloads: vec![payloads::from_json(d)],
    })
}

/// An `ApplicationFailure` carrying the class and kind.
pub fn application(failure: &Failure) -> TemporalFailure {
    TemporalFailure {
        message: format!("{}: {}", failure.class, failure.message),
        source: SOURCE.to_owned(),
        failure_info: Some(FailureInfo::ApplicationFailureInfo(
            ApplicationFailureInfo {
                r#type: failure.kind.clone(),
                non_retryable: !failure.retryable,
                details: details(failure),
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

/// A `CanceledFailure` for a cancellation the engine asked for.
pub fn cancelled(failure: &Failure) -> TemporalFailure {
    TemporalFailure {
        message: failure.message.clone(),
        source: SOURCE.to_owned(),
        failure_info: Some(FailureInfo::CanceledFailureInfo(CanceledFailureInfo {
            details: details(failure),
            ..Default::default()
        })),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_core::sandbox::{FailureClass, RetryPolicy};
    use serde_json::json;

    #[test]
    fn a_failure_keeps_kind_retry_flag_and_details() {
        let f = Failure::new(FailureClass::Trap, &RetryPolicy::default(), "out of bounds")
            .with_details(json!({"trap": "MemoryOutOfBounds"}));
        let t = application(&f);
        assert_eq!(t.message, "Trap: out of bounds");
        let Some(FailureInfo::ApplicationFailureInfo(info)) = t.failure_info else {
            panic!("not an application failure")
        };
        assert_eq!(info.r#type, "Trap");
        assert!(info.non_retryable);
        let details = info.details.unwrap();
        assert_eq!(
            payloads::to_json(&details.payloads[0]).ok(),
            Some(json!({"trap": "MemoryOutOfBounds"}))
        );
    }
}
