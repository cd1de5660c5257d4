//! Who signed a new version, as the host verifies it against its tenant's
//! trust policy, before the version is stored: from the registry it was
//! pulled from, or from the signature file given with a local file. Where
//! the policy requires signatures, what no trusted key signed is refused
//! here with the reason; where it names keys but requires nothing, such a
//! version is stored as unsigned, and counted. A stored version is checked
//! again whenever it would serve (`signed`), and at each start (`distrust`).

use std::path::Path;

use super::{Catalog, ControlError, TenantIndex, TenantSpec, Version};
use crate::oci::{OciRef, Registries, signatures};
use crate::trust::Refused;

impl Catalog {
    /// The signer of the artifact pulled from `reference` (manifest digest
    /// `digest`) by the signatures its registry holds: `None` when the
    /// tenant's policy names no key, or when it requires none and none
    /// verifies.
    pub async fn pulled_signer(
        &self,
        tenant: &str,
        reference: &OciRef,
        digest: &str,
        registries: &Registries,
    ) -> Result<Option<String>, ControlError> {
        let spec = self.spec(tenant)?;
        if !spec.trust.has_keys() {
            return Ok(None);
        }
        let verified = match signatures::signatures(reference, digest, registries).await {
            Ok(found) => spec.trust.verify_payloads(digest, &found),
            // A registry's text, escaped and cut.
            Err(e) => Err(Refused::Unreadable(corral_core::shown::shown(
                &crate::error_chain(&e),
                300,
            ))),
        };
        self.decided(spec, &reference.to_string(), verified)
    }

    /// The signer of `tenant`'s file at `path` by its `signature`
    /// (`cosign sign-blob`'s output), given or not. The file (at most
    /// `max_upload` bytes, staged or configured) is read only when the
    /// tenant's policy names a key.
    pub async fn file_signer(
        &self,
        tenant: &str,
        what: &str,
        path: &Path,
        signature: Option<&[u8]>,
    ) -> Result<Option<String>, ControlError> {
        let spec = self.spec(tenant)?;
        if !spec.trust.has_keys() {
            return Ok(None);
        }
        let verified = match signature {
            Some(signature) => {
                let path = path.to_owned();
                let bytes = tokio::task::spawn_blocking(move || std::fs::read(path))
                    .await
                    .map_err(|e| ControlError::host("reading the file to verify", e))?
                    .map_err(|e| ControlError::host("reading the file to verify", e))?;
                spec.trust.verify_blob(&bytes, signature)
            }
            None => Err(Refused::NoSignatureFile),
        };
        self.decided(spec, what, verified)
    }

    /// A verification's outcome under `spec`'s policy: the signer; or,
    /// without one, a refusal where signatures are required and `None`
    /// (counted, logged) where they are not.
    fn decided(
        &self,
        spec: &TenantSpec,
        what: &str,
        verified: Result<String, Refused>,
    ) -> Result<Option<String>, ControlError> {
        let tenant = &spec.tenant.name;
        match verified {
            Ok(signer) => {
                tracing::info!(tenant = %tenant, signer = %signer, "{what}: signed by a trusted key");
                Ok(Some(signer))
            }
            Err(refused) => {
                self.metrics.signature_refused(tenant, refused.reason());
                if spec.trust.require() {
                    return Err(ControlError::Unsigned {
                        tenant: tenant.clone(),
                        what: what.to_owned(),
                        refused,
                    });
                }
                tracing::warn!(tenant = %tenant, "{what}: stored as unsigned: {refused}");
                Ok(None)
            }
        }
    }

    /// Refuses `version` of `spec`'s tenant unless its trust policy admits
    /// the key recorded as its signer.
    pub(super) fn signed(spec: &TenantSpec, version: &Version) -> Result<(), ControlError> {
        if spec.trust.admits(version.signer.as_deref()) {
            return Ok(());
        }
        let refused = match version.signer {
            // Signed by a key the tenant no longer trusts.
            Some(_) => crate::trust::Refused::UntrustedKey,
            None => crate::trust::Refused::Unsigned {
                digest: version.digest.clone(),
            },
        };
        Err(ControlError::Unsigned {
            tenant: spec.tenant.name.clone(),
            what: format!("{} of `{}`", version.digest, version.name),
            refused,
        })
    }
}

/// Why a stored version is held when its tenant's trust no longer admits
/// it (its trust policy changed since it was stored).
pub(super) const DISTRUSTED: &str =
    "not signed by a key the tenant trusts now (its trust policy changed since it was stored)";

/// Takes out of service the versions of a tenant that its trust policy
/// does not admit: they stay stored, held with why, and are named in the
/// host's log.
pub(super) fn distrust(name: &str, spec: &TenantSpec, tenant_index: &mut TenantIndex) {
    // Trusted again (a key back in the policy): held for that no more.
    for version in &mut tenant_index.versions {
        if spec.trust.admits(version.signer.as_deref()) {
            version.held.retain(|h| h != DISTRUSTED);
        }
    }
    let refused: Vec<Version> = tenant_index
        .versions
        .iter()
        .filter(|v| !spec.trust.admits(v.signer.as_deref()))
        .cloned()
        .collect();
    // A canary whose candidate is refused ends: the active version takes
    // every task (a promotion would otherwise make it serve them all).
    tenant_index.canaries.retain(|deployment, canary| {
        let kept = refused.iter().all(|v| v.digest != canary.candidate);
        if !kept {
            tracing::warn!(tenant = name, %deployment, candidate = %canary.candidate, "canary ended: {DISTRUSTED}");
        }
        kept
    });
    for mut version in refused {
        if tenant_index.is_active(&version) {
            tenant_index.active.remove(&version.name);
            tenant_index.canaries.remove(&version.name);
            tracing::warn!(tenant = name, digest = %version.digest, deployment = %version.name, "not served: {DISTRUSTED}");
        }
        if !version.held.iter().any(|h| h == DISTRUSTED) {
            version.held.push(DISTRUSTED.to_owned());
            tenant_index.put(&version);
        }
    }
}
