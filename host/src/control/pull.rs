//! A tenant's `deploy oci://…`: the host pulls the component, but only from
//! the registries and repositories the tenant's `registries` allows — a host
//! fetching whatever address a tenant names would reach what the tenant
//! cannot (the host's own network, other tenants' private registries).

use std::collections::BTreeMap;

use super::catalog::{Catalog, OCI_MANIFEST_LABEL, OCI_REFERENCE_LABEL};
use super::errors::ControlError;
use crate::oci::{self, OciError, OciRef, Registries};

/// A pulled component and the labels its version keeps.
pub struct PulledVersion {
    pub bytes: Vec<u8>,
    pub labels: BTreeMap<String, String>,
}

impl Catalog {
    /// Pulls `text` for `tenant`, if its `registries` allow the repository.
    pub async fn pull(
        &self,
        tenant: &str,
        text: &str,
        registries: &Registries,
    ) -> Result<PulledVersion, ControlError> {
        let reference: OciRef = text
            .parse()
            .map_err(|e: OciError| ControlError::InvalidArgument(e.to_string()))?;
        let allowed = &self.spec(tenant)?.registries;
        if !allowed.iter().any(|prefix| prefix.allows(&reference)) {
            let rule = match allowed.as_slice() {
                [] => "it may deploy from no registry (tenant.registries is empty)".to_owned(),
                list => format!(
                    "it may deploy only from {} (tenant.registries)",
                    list.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            return Err(ControlError::PermissionDenied(format!(
                "tenant `{tenant}` may not deploy {reference}: {rule}"
            )));
        }
        let registries = registries.with_credentials(&self.spec(tenant)?.credentials);
        let pulled = oci::pull(&reference, &registries)
            .await
            .map_err(|e| pull_error(&e))?;
        tracing::info!(tenant, "pulled {reference} ({})", pulled.manifest_digest);
        Ok(PulledVersion {
            bytes: pulled.bytes,
            labels: BTreeMap::from([
                (OCI_REFERENCE_LABEL.to_owned(), reference.to_string()),
                (OCI_MANIFEST_LABEL.to_owned(), pulled.manifest_digest),
            ]),
        })
    }
}

fn pull_error(e: &OciError) -> ControlError {
    let message = crate::error_chain(e);
    match e {
        OciError::NotFound { .. } => ControlError::NotFound(message),
        OciError::Unreachable { .. } | OciError::Registry { .. } => {
            ControlError::Unavailable(message)
        }
        OciError::Unauthorized { .. } | OciError::Credentials { .. } => {
            ControlError::FailedPrecondition(message)
        }
        OciError::TooBig { .. } => ControlError::QuotaExceeded(message),
        OciError::Reference { .. }
        | OciError::NotAComponent { .. }
        | OciError::DigestMismatch { .. }
        | OciError::LongerThanDeclared { .. } => ControlError::InvalidArgument(message),
        OciError::Describe(_) => ControlError::Internal(message),
    }
}
