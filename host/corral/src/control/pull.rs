//! A tenant's `deploy oci://…`: the host pulls the component, but only from
//! the registries and repositories the tenant's `registries` allows — a host
//! fetching whatever address a tenant names would reach what the tenant
//! cannot (the host's own network, other tenants' private registries).

use super::catalog::Catalog;
use super::errors::ControlError;
use super::metadata::Pulled;
use crate::oci::{self, OciRef, Registries};
use crate::staging::StagedComponent;

/// A pulled component, staged, the host's record of where it came from,
/// and who signed it (as verified against the tenant's trust).
pub struct PulledVersion {
    pub component: StagedComponent,
    pub pulled: Pulled,
    pub signer: Option<String>,
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
        let reference: OciRef = text.parse()?;
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
            return Err(ControlError::RegistryNotAllowed {
                tenant: tenant.to_owned(),
                reference: reference.to_string(),
                rule,
            });
        }
        let registries = registries
            .for_tenant()
            .with_credentials(&spec.credentials)
            .within(allowed);
        let pulled = oci::pull(&reference, &registries, self.staging()).await?;
        tracing::info!(tenant, "pulled {reference} ({})", pulled.manifest_digest);
        let signer = self
            .pulled_signer(tenant, &reference, &pulled.manifest_digest, &registries)
            .await?;
        Ok(PulledVersion {
            component: pulled.component,
            pulled: Pulled {
                reference: reference.to_string(),
                manifest: pulled.manifest_digest,
            },
            signer,
        })
    }
}
