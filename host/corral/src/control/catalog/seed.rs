//! The components the configuration names: files beside it, or `oci://`
//! references pulled at start (or read from the store when pulled before).

use std::collections::BTreeMap;

use super::{Catalog, CatalogError, Version, now_ms};
use crate::config::ComponentSource;
use crate::control::metadata::Pulled;
use crate::control::store::TenantIndex;
use crate::oci::{self, Registries};
use crate::staging::StagedComponent;

/// A configured component's bytes: staged now, or stored before.
enum Configured {
    Staged(StagedComponent),
    Stored(String),
}

impl Catalog {
    /// Adds the components named in the configuration and routes the
    /// tenant. A configured file is activated unless its deployment (the
    /// file's stem) runs a version deployed through the API, which wins over
    /// the file; a changed file replaces the version the file seeded before.
    pub async fn seed(
        &self,
        tenant: &str,
        sources: &[ComponentSource],
        registries: &Registries,
    ) -> Result<(), CatalogError> {
        let spec = self.spec(tenant)?;
        let registries = registries
            .with_credentials(&spec.credentials)
            .within(&spec.registries);
        let mut state = self.state.lock().await;
        let mut tenant_index = state.index.tenants.get(tenant).cloned().unwrap_or_default();
        for source in sources {
            let fail = |error: Box<dyn std::error::Error + Send + Sync>| CatalogError::Configured {
                tenant: tenant.to_owned(),
                component: source.to_string(),
                source: error,
            };
            let (configured, pulled, signer) = self
                .configured(tenant, source, &registries, &tenant_index)
                .await
                .map_err(fail)?;
            let (path, digest, size) = match &configured {
                Configured::Staged(staged) => (
                    staged.path().to_path_buf(),
                    staged.digest.clone(),
                    staged.size,
                ),
                Configured::Stored(digest) => {
                    let path = self.store.path(digest).map_err(|e| fail(e.into()))?;
                    let size = std::fs::metadata(&path).map_err(|e| fail(e.into()))?.len();
                    (path, digest.clone(), size)
                }
            };
            let name = source.deployment();
            let active = tenant_index
                .active
                .get(&name)
                .and_then(|d| tenant_index.versions.iter().find(|v| v.digest == *d));
            match active {
                Some(v) if v.digest == digest => {}
                Some(v) if !v.from_config => {
                    tracing::info!(
                        tenant,
                        "`{source}` is not served: deployment `{name}` runs {} (deployed through the API)",
                        v.digest
                    );
                    continue;
                }
                _ => {}
            }
            let stored = tenant_index
                .versions
                .iter_mut()
                .find(|v| v.digest == digest);
            if let Some(stored) = stored {
                // Signed now (a signature file added beside it): recorded;
                // held only for want of one before: served again.
                if signer.is_some() {
                    stored.signer.clone_from(&signer);
                    stored.held.retain(|h| h != super::signed::DISTRUSTED);
                }
                // Before it is compiled: nothing its tenant's trust refuses.
                Catalog::signed(spec, stored).map_err(|e| fail(e.into()))?;
            }
            let component = self
                .load(&path, &digest)
                .await
                .map_err(|e| fail(e.into()))?;
            tracing::info!(tenant, digest = %digest, from_cache = component.from_cache, "loaded {source}");
            if !tenant_index.versions.iter().any(|v| v.digest == digest) {
                if let Configured::Staged(staged) = configured {
                    self.store.put_staged(staged).map_err(|e| fail(e.into()))?;
                }
                tenant_index.versions.push(Version {
                    name: name.clone(),
                    digest: digest.clone(),
                    size,
                    uploaded_at_ms: now_ms(),
                    aliases: BTreeMap::new(),
                    labels: BTreeMap::new(),
                    from_config: true,
                    config: BTreeMap::new(),
                    compiled: self.sandbox.compiled_size(&digest).unwrap_or(0),
                    pulled,
                    reuse: None,
                    held: Vec::new(),
                    served: true,
                    signer,
                });
            }
            tenant_index.active.insert(name, digest.clone());
            state.loaded.insert(digest, component);
        }
        Ok(self.commit(&mut state, spec, tenant_index).await?)
    }

    /// A configured component, and where it was pulled from: its file,
    /// staged; or its OCI artifact, read from the store when the host pulled
    /// that manifest before (by digest without asking the registry, by tag
    /// after asking only what the tag names), or pulled now. Only the host's
    /// own record of a pull is trusted, never a label.
    /// Its signer, by the tenant's trust: a file's is its `.sig` file
    /// beside it (`cosign sign-blob`'s output); a pulled artifact's, the
    /// registry's; one stored before keeps what was verified then.
    async fn configured(
        &self,
        tenant: &str,
        source: &ComponentSource,
        registries: &Registries,
        index: &TenantIndex,
    ) -> Result<
        (Configured, Option<Pulled>, Option<String>),
        Box<dyn std::error::Error + Send + Sync>,
    > {
        let reference = match source {
            ComponentSource::File(path) => {
                let signature_file = crate::trust::file::beside(path);
                let signature = crate::trust::file::read_if_there(&signature_file)?;
                let what = format!(
                    "{} (its signature file: {})",
                    path.display(),
                    signature_file.display()
                );
                // The copy that will be stored is the one verified: the
                // file may change while it is read.
                let staged = self.staging.copy_of(path)?;
                let signer = self
                    .file_signer(tenant, &what, staged.path(), signature.as_deref())
                    .await?;
                return Ok((Configured::Staged(staged), None, signer));
            }
            ComponentSource::Oci(reference) => reference,
        };
        // By digest, nothing is asked; by tag, only what it names now.
        let manifest = match reference.digest() {
            Some(pinned) => pinned.to_owned(),
            None => oci::resolve(reference, registries).await?,
        };
        if let Some(version) = index
            .versions
            .iter()
            .find(|v| v.pulled.as_ref().is_some_and(|p| p.manifest == manifest))
            && self.store.path(&version.digest).is_ok()
        {
            tracing::info!(
                "{reference}: stored before, as {}; not pulled",
                version.digest
            );
            let signer = match self.spec(tenant)?.trust.admits(version.signer.as_deref()) {
                true => version.signer.clone(),
                // Signed by a key trusted no more: its registry is asked
                // again (re-signed with a key trusted now, it serves on).
                false => {
                    self.pulled_signer(tenant, reference, &manifest, registries)
                        .await?
                }
            };
            return Ok((
                Configured::Stored(version.digest.clone()),
                version.pulled.clone(),
                signer,
            ));
        }
        let pulled = oci::pull(&reference.at_digest(&manifest), registries, &self.staging).await?;
        tracing::info!("pulled {reference} ({})", pulled.manifest_digest);
        let signer = self
            .pulled_signer(tenant, reference, &pulled.manifest_digest, registries)
            .await?;
        let record = Pulled {
            reference: reference.to_string(),
            manifest: pulled.manifest_digest,
        };
        Ok((Configured::Staged(pulled.component), Some(record), signer))
    }
}
