//! cosign's signatures in a registry, fetched and pushed as a pull is:
//! through the host's egress proxy (the same allow-list), within the same
//! deadline and a byte budget of their own. What a signature says is the
//! trust module's business (`crate::trust`); this finds them: by the OCI
//! 1.1 referrers API where the registry offers it, and by cosign's tag
//! scheme (`sha256-<digest>.sig`) in any case.

use std::collections::BTreeMap;

use oci_client::client::{Config, ImageLayer};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{
    IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciImageIndex, OciImageManifest,
};
use oci_client::secrets::RegistryAuth;
use oci_wasm::WasmClient;

use super::egress::Allowance;
use super::error::classify;
use super::{MAX_MANIFEST, OVERHEAD, OciError, OciRef, Registries, checked};

/// A simple-signing payload's media type, and the annotation carrying its
/// signature (cosign's).
pub const SIGSTORE_OCI_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
pub const SIGSTORE_SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";

/// The artifact type cosign gives a signature it attaches as a referrer.
pub const COSIGN_SIGNATURE_ARTIFACT: &str = "application/vnd.dev.cosign.artifact.sig.v1+json";
/// Signature manifests read for one artifact, and signatures in all: a
/// registry naming thousands is cut short (what is read must verify).
pub const MAX_SIGNATURE_MANIFESTS: usize = 4;
pub const MAX_SIGNATURES: usize = 16;
/// The largest simple-signing payload read (cosign's are a few hundred
/// bytes).
pub const MAX_PAYLOAD: u64 = 64 << 10;

/// One simple-signing payload of a signature manifest, and its base64
/// signature.
#[derive(Debug, Clone)]
pub struct PayloadSignature {
    pub payload: Vec<u8>,
    pub signature: String,
}

/// The simple-signing signatures the registry of `reference` holds for
/// the artifact whose manifest digest is `digest` (none is no error).
pub async fn signatures(
    reference: &OciRef,
    digest: &str,
    registries: &Registries,
) -> Result<Vec<PayloadSignature>, OciError> {
    let auth = registries.auth_for(reference)?;
    let pinned = reference.at_digest(digest);
    // A manifest at a time, each at most MAX_MANIFEST: what a registry may
    // send is counted as it comes (an endless one is cut off there).
    registries
        .through(
            reference,
            MAX_MANIFEST + OVERHEAD,
            |client, allowance| async move {
                let tag = signature_tag(reference, digest);
                let mut manifests = Vec::new();
                if let Some(manifest) = manifest(&client, &tag, registries, &auth).await? {
                    manifests.push(manifest);
                }
                let room = MAX_SIGNATURE_MANIFESTS - manifests.len();
                match referrers(&client, &pinned, registries, &auth, &allowance, room).await {
                    Ok(referred) => manifests.extend(referred),
                    // The tag's signatures are enough to verify by; with
                    // none, why the registry failed is the reason.
                    Err(e) if !manifests.is_empty() => {
                        tracing::debug!(%reference, "signatures by the referrers API not read: {}", crate::error_chain(&e));
                    }
                    Err(e) => return Err(e),
                }
                let mut found = Vec::new();
                for manifest in &manifests {
                    for layer in &manifest.layers {
                        if found.len() == MAX_SIGNATURES {
                            break;
                        }
                        let Some(signature) = layer
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(SIGSTORE_SIGNATURE_ANNOTATION))
                        else {
                            continue;
                        };
                        let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
                        if layer.media_type != SIGSTORE_OCI_MEDIA_TYPE || size > MAX_PAYLOAD {
                            continue;
                        }
                        allowance.allow(size);
                        let mut payload = Vec::new();
                        client
                            .pull_blob(&pinned.reference, layer, &mut payload)
                            .await
                            .map_err(|e| classify(reference, registries, e))?;
                        found.push(PayloadSignature {
                            payload,
                            signature: signature.clone(),
                        });
                    }
                }
                Ok(found)
            },
        )
        .await
}

/// cosign's tag for the signatures of `digest`: `sha256-<hex>.sig`.
fn signature_tag(reference: &OciRef, digest: &str) -> OciRef {
    reference.with_tag(&format!("{}.sig", digest.replace(':', "-")))
}

/// The signature manifests, at most `room`, the registry's referrers API
/// names for `pinned` (none where the registry has no such API).
async fn referrers(
    client: &WasmClient,
    pinned: &OciRef,
    registries: &Registries,
    auth: &RegistryAuth,
    allowance: &Allowance,
    room: usize,
) -> Result<Vec<OciImageManifest>, OciError> {
    // (Authenticated already: the tag's manifest was asked for first.)
    allowance.allow(MAX_MANIFEST);
    let index: OciImageIndex = match client
        .pull_referrers(&pinned.reference, Some(COSIGN_SIGNATURE_ARTIFACT))
        .await
    {
        Ok(index) => index,
        // No referrers API, and no tag of the referrers' fallback.
        Err(e) if not_found(&e) => return Ok(Vec::new()),
        Err(e) => return Err(classify(pinned, registries, e)),
    };
    let mut manifests = Vec::new();
    // Only cosign's signatures, by a digest (what the registry names is
    // neither trusted to be either, nor to be short).
    let entries = index.manifests.iter().filter(|entry| {
        entry.artifact_type.as_deref() == Some(COSIGN_SIGNATURE_ARTIFACT)
            && super::is_sha256_digest(&entry.digest)
    });
    for entry in entries.take(room) {
        let at = pinned.at_digest(&entry.digest);
        allowance.allow(MAX_MANIFEST);
        if let Some(manifest) = manifest(client, &at, registries, auth).await? {
            manifests.push(manifest);
        }
    }
    Ok(manifests)
}

/// The image manifest at `reference`, at most [`MAX_MANIFEST`] bytes;
/// `None` when the registry has none there.
async fn manifest(
    client: &WasmClient,
    reference: &OciRef,
    registries: &Registries,
    auth: &RegistryAuth,
) -> Result<Option<OciImageManifest>, OciError> {
    let raw = match client
        .pull_manifest_raw(
            &reference.reference,
            auth,
            &[OCI_IMAGE_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE],
        )
        .await
    {
        Ok((raw, _)) => raw,
        Err(e) if not_found(&e) => return Ok(None),
        Err(e) => return Err(classify(reference, registries, e)),
    };
    if raw.len() as u64 > MAX_MANIFEST {
        return Err(OciError::Oversent {
            reference: reference.to_string(),
            received: raw.len() as u64,
        });
    }
    serde_json::from_slice(&raw)
        .map(Some)
        .map_err(|e| OciError::NotASignature {
            reference: reference.to_string(),
            why: corral_core::shown::shown(&e.to_string(), 200),
        })
}

/// Whether a registry said it has nothing there.
fn not_found(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::ImageManifestNotFoundError(_) => true,
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                oci_client::errors::OciErrorCode::ManifestUnknown
                    | oci_client::errors::OciErrorCode::NotFound
            )
        }),
        OciDistributionError::ServerError { code, .. } => *code == 404,
        _ => false,
    }
}

/// Adds a signature of the artifact at `reference` (manifest digest
/// `digest`) where cosign's tag scheme puts it: a simple-signing layer
/// holding `payload`, its `signature` annotated, after the signatures
/// already there (as `cosign sign` adds, so one key's signature does not
/// erase another's; the same signature again is not added twice). Returns
/// the signature manifest's digest.
pub async fn push_signature(
    reference: &OciRef,
    digest: &str,
    payload: Vec<u8>,
    signature: String,
    registries: &Registries,
) -> Result<String, OciError> {
    let auth = registries.auth_for(reference)?;
    let tag = signature_tag(reference, digest);
    let layer = ImageLayer::new(
        payload,
        SIGSTORE_OCI_MEDIA_TYPE.to_owned(),
        Some(BTreeMap::from([(
            SIGSTORE_SIGNATURE_ANNOTATION.to_owned(),
            signature,
        )])),
    );
    let config = Config::oci_v1(b"{}".to_vec(), None);
    let pushed = registries
        .through(
            reference,
            2 * (MAX_MANIFEST + OVERHEAD),
            |client, _| async move {
                let ours = (layer.sha256_digest(), layer.annotations.clone());
                let mut manifest =
                    OciImageManifest::build(std::slice::from_ref(&layer), &config, None);
                if let Some(existing) = self::manifest(&client, &tag, registries, &auth).await? {
                    let kept: Vec<_> = existing
                        .layers
                        .into_iter()
                        .filter(|l| l.media_type == SIGSTORE_OCI_MEDIA_TYPE)
                        .filter(|l| (&l.digest, &l.annotations) != (&ours.0, &ours.1))
                        .take(MAX_SIGNATURES - 1)
                        .collect();
                    manifest.layers.splice(0..0, kept);
                }
                // oci-client's own push (the Wasm client's is for components):
                // the new layer and the config, then the manifest naming all.
                client
                    .as_ref()
                    .push(&tag.reference, &[layer], config, &auth, Some(manifest))
                    .await
                    .map_err(|e| classify(&tag, registries, e))?;
                client
                    .fetch_manifest_digest(&tag.reference, &auth)
                    .await
                    .map_err(|e| classify(&tag, registries, e))
            },
        )
        .await?;
    checked(reference, pushed)
}
