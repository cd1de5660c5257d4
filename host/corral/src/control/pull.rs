//! A tenant's `deploy oci://…`: the host pulls the component, but only from
//! the registries and repositories the tenant's `registries` allows — a host
//! fetching whatever address a tenant names would reach what the tenant
//! cannot (the host's own network, other tenants' private registries).

use super::catalog::Catalog;
use super::errors::ControlError;
use super::metadata::Pulled;
use crate::oci::{self, OciError, OciRef, Registries};
use crate::staging::StagedComponent;

/// A pulled component, staged, and the host's record of where it came from.
pub struct PulledVersion {
    pub component: StagedComponent,
    pub pulled: Pulled,
}

impl Catalog {
    /// Pulls `text` for `tenant`, if its `registries` allow the repository;
    /// every byte comes from a host those rules name.
    pub async fn pull(
        &self,
        tenant: &str,
        text: &str,
        registries: &Registries,
    ) -> Result<PulledVersion, ControlError> {
        let reference: OciRef = text
            .parse()
            .map_err(|e: OciError| ControlError::InvalidArgument(e.to_string()))?;
        let spec = self.spec(tenant)?;
        let allowed = &spec.registries;
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
        let registries = registries
            .for_tenant()
            .with_credentials(&spec.credentials)
            .within(allowed);
        let pulled = oci::pull(&reference, &registries, self.staging())
            .await
            .map_err(|e| pull_error(&e))?;
        tracing::info!(tenant, "pulled {reference} ({})", pulled.manifest_digest);
        Ok(PulledVersion {
            component: pulled.component,
            pulled: Pulled {
                reference: reference.to_string(),
                manifest: pulled.manifest_digest,
            },
        })
    }
}

fn pull_error(e: &OciError) -> ControlError {
    let message = crate::error_chain(e);
    match e {
        OciError::NotFound { .. } => ControlError::NotFound(message),
        OciError::Unreachable { .. }
        | OciError::Registry { .. }
        | OciError::Deadline { .. }
        | OciError::Proxy(_)
        | OciError::Stage { .. } => ControlError::Unavailable(message),
        OciError::Elsewhere { .. } => ControlError::PermissionDenied(message),
        OciError::Unauthorized { .. } | OciError::Credentials { .. } => {
            ControlError::FailedPrecondition(message)
        }
        OciError::TooBig { .. } | OciError::Oversent { .. } => ControlError::QuotaExceeded(message),
        OciError::Reference { .. }
        | OciError::NotAComponent { .. }
        | OciError::DigestMismatch { .. }
        | OciError::BadDigest { .. }
        | OciError::LongerThanDeclared { .. } => ControlError::InvalidArgument(message),
        OciError::Describe(_) => ControlError::Internal(message),
    }
}
