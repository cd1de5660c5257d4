//! The components the configuration names: files beside it, or `oci://`
//! references pulled at start (or read from the store when pulled before).

use std::collections::BTreeMap;

use super::{Catalog, CatalogError, OCI_MANIFEST_LABEL, OCI_REFERENCE_LABEL, Version, now_ms};
use crate::config::ComponentSource;
use crate::control::store::TenantIndex;
use crate::oci::{self, Registries};

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
        let registries = registries.with_credentials(&spec.credentials);
        let mut state = self.state.lock().await;
        let mut tenant_index = state.index.tenants.get(tenant).cloned().unwrap_or_default();
        for source in sources {
            let fail = |error: Box<dyn std::error::Error + Send + Sync>| CatalogError::Configured {
                tenant: tenant.to_owned(),
                component: source.to_string(),
                source: error,
            };
            let (bytes, labels) = self
                .configured_bytes(source, &registries, &tenant_index)
                .await
                .map_err(fail)?;
            let name = source.deployment();
            let size = bytes.len() as u64;
            let component = self.load(bytes.clone()).await.map_err(|e| fail(e.into()))?;
            let digest = component.digest.clone();
            tracing::info!(tenant, digest = %digest, from_cache = component.from_cache, "loaded {source}");
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
            if !tenant_index.versions.iter().any(|v| v.digest == digest) {
                self.store
                    .put_bytes(&digest, &bytes)
                    .map_err(|e| fail(e.into()))?;
                tenant_index.versions.push(Version {
                    name: name.clone(),
                    digest: digest.clone(),
                    size,
                    uploaded_at_ms: now_ms(),
                    aliases: BTreeMap::new(),
                    labels,
                    from_config: true,
                    config: BTreeMap::new(),
                });
            }
            tenant_index.active.insert(name, digest.clone());
            state.loaded.insert(digest, component);
        }
        Ok(self.commit(&mut state, spec, tenant_index).await?)
    }

    /// The bytes of a configured component, and the labels its version
    /// keeps: its file, or its OCI artifact. A manifest pulled before is
    /// read from the store: by digest without asking the registry, by tag
    /// after asking only what the tag names.
    async fn configured_bytes(
        &self,
        source: &ComponentSource,
        registries: &Registries,
        index: &TenantIndex,
    ) -> Result<(Vec<u8>, BTreeMap<String, String>), Box<dyn std::error::Error + Send + Sync>> {
        let reference = match source {
            ComponentSource::File(path) => return Ok((std::fs::read(path)?, BTreeMap::new())),
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
            .find(|v| v.labels.get(OCI_MANIFEST_LABEL) == Some(&manifest))
            && let Ok(bytes) = self.store.bytes(&version.digest)
        {
            tracing::info!(
                "{reference}: stored before, as {}; not pulled",
                version.digest
            );
            return Ok((bytes, version.labels.clone()));
        }
        let pulled = oci::pull(&reference.at_digest(&manifest), registries).await?;
        tracing::info!("pulled {reference} ({})", pulled.manifest_digest);
        let labels = BTreeMap::from([
            (OCI_REFERENCE_LABEL.to_owned(), reference.to_string()),
            (OCI_MANIFEST_LABEL.to_owned(), pulled.manifest_digest),
        ]);
        Ok((pulled.bytes, labels))
    }
}
