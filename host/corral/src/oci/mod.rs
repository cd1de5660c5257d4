//! Components in OCI registries, as the CNCF "Wasm OCI artifact" layout
//! (`wkg oci`, Spin and wasmCloud use it): one `application/wasm` layer, a
//! `application/vnd.wasm.config.v0+json` config. Pull and push go through
//! the published `oci-client` / `oci-wasm` crates; corral adds the bounds
//! (where a pull may fetch from, the manifest's size and the layer's, one
//! deadline for a whole pull, plain HTTP only where allowed), the checks (a
//! pinned digest is the manifest's, the layer is a component, a digest a
//! registry names is a digest) and clear, bounded errors: a registry's own
//! words are escaped and cut short before a tenant or a log sees them.

mod credentials;
mod egress;
mod error;
mod reference;
mod registries;
pub mod signatures;

pub use credentials::{Credential, PasswordSource};
pub use egress::Destinations;
pub use error::{OciError, RegistrySaid};
pub use reference::{OciRef, RepositoryPrefix, is_reference};
pub use registries::Registries;

use egress::Allowance;
use error::classify;

use std::collections::BTreeMap;
use std::time::Duration;

use corral_core::shown::shown;

use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_wasm::{WASM_LAYER_MEDIA_TYPE, WasmClient, WasmConfig};
use sha2::{Digest, Sha256};

use crate::staging::{StagedComponent, Staging};

/// How an OCI reference is written where a file path is also accepted.
pub const SCHEME: &str = "oci://";

/// The manifest annotation listing a component's activity types (JSON: an
/// array of `{name, signature}`), written by `corral push`.
pub const ACTIVITY_TYPES_ANNOTATION: &str = "dev.corral.activity-types";

/// The largest manifest a pull reads (the OCI distribution spec asks
/// registries to accept manifests up to this size).
pub const MAX_MANIFEST: u64 = 4 << 20;
/// What a registry may send besides a manifest or a layer: TLS handshakes,
/// response heads, a token, the `/v2/` ping.
const OVERHEAD: u64 = 256 << 10;
/// The longest piece of a registry's own text (an error page, a media
/// type) a message quotes.
const MAX_QUOTED: usize = 300;
/// Media types a message lists before "and N more".
const MAX_LISTED: usize = 5;
/// How long a whole pull (or a tag's resolution) may take by default.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(300);

/// Makes ring rustls' process-wide crypto provider, if none is yet: the
/// OCI client's HTTP client (reqwest, with rustls and no provider of its
/// own) takes the process's, and fails without one. The binary chooses it
/// at start; this covers every other caller of the library.
pub fn tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Whether `digest` is `sha256:` and 64 lower-case hex digits: the only
/// form a host stores, logs or exports.
pub fn is_sha256_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// What a pull brought: the component (staged on disk) and the digest of
/// the manifest that named it.
pub struct Pulled {
    pub component: StagedComponent,
    /// The manifest's digest: `oci://…@<this>` pulls exactly this again.
    pub manifest_digest: String,
}

/// What a manifest a registry sent names: its digest (checked against the
/// reference's pinned one) and its one `application/wasm` layer, declared
/// within `max_bytes` and fetched from the registry alone. Every message
/// quotes the registry's text escaped and bounded.
pub fn component_layer(
    raw: &[u8],
    reference: &OciRef,
    max_bytes: u64,
) -> Result<(String, OciDescriptor), OciError> {
    let text = reference.to_string();
    if raw.len() as u64 > MAX_MANIFEST {
        return Err(OciError::Oversent {
            reference: text,
            received: raw.len() as u64,
        });
    }
    let manifest_digest = format!("sha256:{}", hex::encode(Sha256::digest(raw)));
    if let Some(pinned) = reference.digest()
        && pinned != manifest_digest
    {
        return Err(OciError::DigestMismatch {
            reference: text,
            actual: manifest_digest,
        });
    }
    let not_component = |why: String| OciError::NotAComponent {
        reference: text.clone(),
        why,
    };
    let manifest: OciImageManifest = serde_json::from_slice(raw).map_err(|e| {
        not_component(format!(
            "its manifest is not an OCI image manifest: {}",
            shown(&e.to_string(), MAX_QUOTED)
        ))
    })?;
    let layer = match manifest.layers.as_slice() {
        [layer] if layer.media_type == WASM_LAYER_MEDIA_TYPE => layer,
        layers => {
            let mut types: Vec<String> = layers
                .iter()
                .take(MAX_LISTED)
                .map(|l| shown(&l.media_type, 100))
                .collect();
            if layers.len() > MAX_LISTED {
                types.push(format!("and {} more", layers.len() - MAX_LISTED));
            }
            return Err(not_component(format!(
                "it has layers [{}], not one {WASM_LAYER_MEDIA_TYPE}",
                types.join(", ")
            )));
        }
    };
    if layer.urls.as_ref().is_some_and(|urls| !urls.is_empty()) {
        return Err(not_component(
            "its layer names URLs to fetch it from (a foreign layer); corral fetches layers from the registry only"
                .to_owned(),
        ));
    }
    let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
    if size > max_bytes {
        return Err(OciError::TooBig {
            reference: text,
            size,
            limit: max_bytes,
        });
    }
    Ok((manifest_digest, layer.clone()))
}

/// Pulls the component at `reference` into `staging`: its manifest (at most
/// [`MAX_MANIFEST`] bytes, checked against a pinned digest), then its one
/// `application/wasm` layer, within `registries.max_bytes` (the layer's
/// digest is checked by oci-client) and the deadline.
pub async fn pull(
    reference: &OciRef,
    registries: &Registries,
    staging: &Staging,
) -> Result<Pulled, OciError> {
    let auth = registries.auth_for(reference)?;
    registries
        .through(reference, MAX_MANIFEST + OVERHEAD, |client, allowance| {
            pull_through(client, allowance, reference, registries, staging, auth)
        })
        .await
}

async fn pull_through(
    client: WasmClient,
    allowance: Allowance,
    reference: &OciRef,
    registries: &Registries,
    staging: &Staging,
    auth: RegistryAuth,
) -> Result<Pulled, OciError> {
    let text = reference.to_string();
    let err = |e| classify(reference, registries, e);
    let (raw, _) = client
        .pull_manifest_raw(&reference.reference, &auth, &[OCI_IMAGE_MEDIA_TYPE])
        .await
        .map_err(err)?;
    let (manifest_digest, layer) = component_layer(&raw, reference, registries.max_bytes)?;
    drop(raw);
    let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
    allowance.allow(size.saturating_add(OVERHEAD));
    let mut staged = staging.stage(size).map_err(|source| OciError::Stage {
        reference: text.clone(),
        source,
    })?;
    client
        .pull_blob(&reference.reference, &layer, &mut staged)
        .await
        .map_err(|e| match e {
            OciDistributionError::IoError(io) if io.kind() == std::io::ErrorKind::FileTooLarge => {
                OciError::LongerThanDeclared {
                    reference: text.clone(),
                    declared: size,
                }
            }
            e => err(e),
        })?;
    let component = staged.finish().map_err(|e| OciError::Stage {
        reference: text.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(Pulled {
        component,
        manifest_digest,
    })
}

/// The manifest digest `reference` (a tag) names now, without pulling: a
/// `sha256:` digest, checked before anyone stores, logs or exports it.
pub async fn resolve(reference: &OciRef, registries: &Registries) -> Result<String, OciError> {
    let auth = registries.auth_for(reference)?;
    let digest = registries
        .through(reference, MAX_MANIFEST + OVERHEAD, |client, _| async move {
            client
                .fetch_manifest_digest(&reference.reference, &auth)
                .await
                .map_err(|e| classify(reference, registries, e))
        })
        .await?;
    checked(reference, digest)
}

/// The component manifest at `reference` as this host reads it: its
/// digest, computed from the bytes the registry sent (never the digest
/// the registry names), and its component layer. What a signer signs:
/// `corral sign` vouches for a digest it checked is a component.
pub async fn component_manifest(
    reference: &OciRef,
    registries: &Registries,
) -> Result<(String, OciDescriptor), OciError> {
    let auth = registries.auth_for(reference)?;
    registries
        .through(reference, MAX_MANIFEST + OVERHEAD, |client, _| async move {
            let (raw, _) = client
                .pull_manifest_raw(&reference.reference, &auth, &[OCI_IMAGE_MEDIA_TYPE])
                .await
                .map_err(|e| classify(reference, registries, e))?;
            component_layer(&raw, reference, registries.max_bytes)
        })
        .await
}

/// A manifest digest a registry named for `reference`, if it is a
/// `sha256:` digest: it is stored, logged and exported as a label.
fn checked(reference: &OciRef, digest: String) -> Result<String, OciError> {
    if !is_sha256_digest(&digest) {
        return Err(OciError::BadDigest {
            reference: reference.to_string(),
            digest: shown(&digest, 100),
        });
    }
    Ok(digest)
}

/// Pushes `component` to `reference` as a Wasm OCI artifact, with
/// `annotations` on the manifest. Returns the manifest's digest.
pub async fn push(
    component: Vec<u8>,
    reference: &OciRef,
    registries: &Registries,
    annotations: BTreeMap<String, String>,
) -> Result<String, OciError> {
    let (config, layer) =
        WasmConfig::from_raw_component(component, None).map_err(OciError::Describe)?;
    let auth = registries.auth_for(reference)?;
    let digest = registries
        .through(reference, MAX_MANIFEST + OVERHEAD, |client, _| async move {
            client
                .push(
                    &reference.reference,
                    &auth,
                    layer,
                    config,
                    Some(annotations),
                )
                .await
                .map_err(|e| match e.downcast::<OciDistributionError>() {
                    Ok(e) => classify(reference, registries, e),
                    Err(e) => OciError::Describe(e),
                })?;
            // The registry names what it stored: ask it, rather than
            // recompute the manifest oci-client serialised.
            client
                .fetch_manifest_digest(&reference.reference, &auth)
                .await
                .map_err(|e| classify(reference, registries, e))
        })
        .await?;
    checked(reference, digest)
}
