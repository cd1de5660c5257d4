//! Components in OCI registries, as the CNCF "Wasm OCI artifact" layout
//! (`wkg oci`, Spin and wasmCloud use it): one `application/wasm` layer, a
//! `application/vnd.wasm.config.v0+json` config. Pull and push go through
//! the published `oci-client` / `oci-wasm` crates; corral adds the bounds
//! (sizes, timeouts, plain HTTP only where allowed), the checks (a pinned
//! digest is the manifest's, the layer is a component) and clear errors.

mod credentials;

pub use credentials::{Credential, PasswordSource};

use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll};
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use oci_wasm::{WASM_LAYER_MEDIA_TYPE, WasmClient, WasmConfig};
use sha2::{Digest, Sha256};

/// How an OCI reference is written where a file path is also accepted.
pub const SCHEME: &str = "oci://";

/// The manifest annotation listing a component's activity types (JSON: an
/// array of `{name, signature}`), written by `corral push`.
pub const ACTIVITY_TYPES_ANNOTATION: &str = "dev.corral.activity-types";

/// A component's place in a registry: `oci://registry/repository:tag` or
/// `oci://registry/repository@sha256:…`.
#[derive(Clone, Debug)]
pub struct OciRef {
    reference: Reference,
}

impl OciRef {
    /// The registry's host (and port).
    pub fn registry(&self) -> &str {
        self.reference.registry()
    }

    /// The repository's last segment (`greeter` of `acme/greeter`).
    pub fn repository_name(&self) -> &str {
        let repository = self.reference.repository();
        repository.rsplit('/').next().unwrap_or(repository)
    }

    /// The same repository, pinned to `digest`.
    pub fn at_digest(&self, digest: &str) -> OciRef {
        OciRef {
            reference: Reference::with_digest(
                self.reference.registry().to_owned(),
                self.reference.repository().to_owned(),
                digest.to_owned(),
            ),
        }
    }

    /// The tag the reference names, if it names one.
    pub fn tag(&self) -> Option<&str> {
        self.reference.tag()
    }

    /// The digest the reference pins, if it pins one.
    pub fn digest(&self) -> Option<&str> {
        self.reference.digest()
    }
}

impl fmt::Display for OciRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}", self.reference.whole())
    }
}

impl FromStr for OciRef {
    type Err = OciError;

    fn from_str(text: &str) -> Result<Self, OciError> {
        let bad = |why: String| OciError::Reference {
            reference: text.to_owned(),
            why,
        };
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad(format!("it does not start with {SCHEME}")))?;
        // Without a registry, oci-client would quietly mean Docker Hub.
        let (registry, _) = rest
            .split_once('/')
            .ok_or_else(|| bad("it names no repository: oci://REGISTRY/REPOSITORY:TAG".into()))?;
        if !registry.contains(['.', ':']) && registry != "localhost" {
            return Err(bad(format!(
                "`{registry}` is not a registry host (oci://registry.example.com/…)"
            )));
        }
        // oci-client would quietly mean `:latest`: a host should run what
        // was named.
        let last = rest.rsplit('/').next().unwrap_or_default();
        if !last.contains([':', '@']) {
            return Err(bad("it names no tag or digest (…:1.0 or …@sha256:…)".into()));
        }
        let reference = Reference::from_str(rest).map_err(|e| bad(e.to_string()))?;
        Ok(OciRef { reference })
    }
}

/// A registry, or a repository prefix in one, a tenant may deploy from:
/// `registry.example.com` or `registry.example.com/acme` (which allows
/// `…/acme/greeter`, not `…/acmecorp/…`). Built only by [`FromStr`].
#[derive(Clone, Debug, PartialEq)]
pub struct RepositoryPrefix(String);

impl RepositoryPrefix {
    pub fn allows(&self, reference: &OciRef) -> bool {
        let whole = format!(
            "{}/{}",
            reference.registry(),
            reference.reference.repository()
        );
        whole == self.0
            || whole
                .strip_prefix(&self.0)
                .is_some_and(|rest| rest.starts_with('/'))
    }
}

impl fmt::Display for RepositoryPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for RepositoryPrefix {
    type Err = OciError;

    fn from_str(text: &str) -> Result<Self, OciError> {
        let bad = |why: &str| OciError::Reference {
            reference: text.to_owned(),
            why: why.to_owned(),
        };
        let trimmed = text.trim_end_matches('/');
        if trimmed.contains("://") {
            return Err(bad(
                "name the registry without a scheme: registry.example.com/acme",
            ));
        }
        let registry = trimmed.split('/').next().unwrap_or_default();
        if !registry.contains(['.', ':']) && registry != "localhost" {
            return Err(bad(
                "it does not start with a registry host (registry.example.com/…)",
            ));
        }
        let path_ok = trimmed.split('/').skip(1).all(|segment| {
            !segment.is_empty()
                && segment
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
        });
        if !path_ok || trimmed.contains(['@', ' ']) {
            return Err(bad("repositories are lower-case segments joined by '/'"));
        }
        Ok(RepositoryPrefix(trimmed.to_owned()))
    }
}

/// Whether `text` is meant as an OCI reference rather than a file.
pub fn is_reference(text: &str) -> bool {
    text.starts_with(SCHEME)
}

/// Who may be reached and how: registries that may be spoken to in plain
/// HTTP (only these), credentials, and the largest component pulled.
#[derive(Clone)]
pub struct Registries {
    pub insecure: Vec<String>,
    /// For a registry without its own credential.
    pub auth: RegistryAuth,
    /// Registry host → its credential.
    pub credentials: BTreeMap<String, Credential>,
    pub max_bytes: u64,
    pub timeout: Duration,
}

impl Registries {
    /// Plain HTTP for `insecure` only; credentials from
    /// `CORRAL_REGISTRY_USERNAME` / `CORRAL_REGISTRY_PASSWORD` (never a
    /// command line: others can read it).
    pub fn from_env(insecure: Vec<String>, max_bytes: u64) -> Self {
        let auth = match (
            std::env::var("CORRAL_REGISTRY_USERNAME"),
            std::env::var("CORRAL_REGISTRY_PASSWORD"),
        ) {
            (Ok(user), Ok(password)) => RegistryAuth::Basic(user, password),
            _ => RegistryAuth::Anonymous,
        };
        Registries {
            insecure,
            auth,
            credentials: BTreeMap::new(),
            max_bytes,
            timeout: Duration::from_secs(60),
        }
    }

    /// These registries with `more` credentials, which win.
    pub fn with_credentials(&self, more: &BTreeMap<String, Credential>) -> Registries {
        let mut registries = self.clone();
        registries
            .credentials
            .extend(more.iter().map(|(k, v)| (k.clone(), v.clone())));
        registries
    }

    fn auth_for(&self, reference: &OciRef) -> Result<RegistryAuth, OciError> {
        match self.credentials.get(reference.registry()) {
            Some(credential) => credential.auth(reference.registry()),
            None => Ok(self.auth.clone()),
        }
    }

    fn client(&self) -> WasmClient {
        WasmClient::new(Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(self.insecure.clone()),
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(self.timeout),
            ..ClientConfig::default()
        }))
    }
}

/// Why a pull or push failed.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("`{reference}` is not an OCI reference: {why}")]
    Reference { reference: String, why: String },
    #[error("cannot reach the registry {registry}{hint}")]
    Unreachable {
        registry: String,
        hint: &'static str,
        #[source]
        source: OciDistributionError,
    },
    #[error("{reference} was not found in its registry")]
    NotFound {
        reference: String,
        #[source]
        source: OciDistributionError,
    },
    #[error(
        "the registry refused the credentials for {reference} (registry_credentials in the configuration; CORRAL_REGISTRY_USERNAME and CORRAL_REGISTRY_PASSWORD for the CLI)"
    )]
    Unauthorized {
        reference: String,
        #[source]
        source: OciDistributionError,
    },
    #[error("{reference}: {source}")]
    Registry {
        reference: String,
        #[source]
        source: OciDistributionError,
    },
    #[error("{reference} is not a Wasm component artifact: {why}")]
    NotAComponent { reference: String, why: String },
    #[error("{reference}: the registry sent a manifest whose digest is {actual}")]
    DigestMismatch { reference: String, actual: String },
    #[error("{reference} is {size} bytes, over the limit of {limit} bytes")]
    TooBig {
        reference: String,
        size: u64,
        limit: u64,
    },
    #[error("{reference}: the registry sent more than the {declared} bytes its manifest declares")]
    LongerThanDeclared { reference: String, declared: u64 },
    #[error("no password for the registry {registry}: {why}")]
    Credentials { registry: String, why: String },
    #[error("cannot describe the component to push")]
    Describe(#[source] anyhow::Error),
}

/// What a pull brought: the component and the digests that name it.
pub struct Pulled {
    pub bytes: Vec<u8>,
    /// The manifest's digest: `oci://…@<this>` pulls exactly this again.
    pub manifest_digest: String,
}

fn classify(reference: &OciRef, registries: &Registries, e: OciDistributionError) -> OciError {
    let text = reference.to_string();
    match &e {
        OciDistributionError::RequestError(r) if r.is_connect() || r.is_timeout() => {
            let insecure = registries
                .insecure
                .iter()
                .any(|r| r == reference.registry());
            OciError::Unreachable {
                registry: reference.registry().to_owned(),
                hint: if insecure {
                    ""
                } else {
                    " over HTTPS (a plain-HTTP registry must be listed as insecure)"
                },
                source: e,
            }
        }
        OciDistributionError::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|e| {
                matches!(
                    e.code,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::BlobUnknown
                        | OciErrorCode::NotFound
                )
            }) =>
        {
            OciError::NotFound {
                reference: text,
                source: e,
            }
        }
        OciDistributionError::RegistryError { envelope, .. }
            if envelope
                .errors
                .iter()
                .any(|e| matches!(e.code, OciErrorCode::Unauthorized | OciErrorCode::Denied)) =>
        {
            OciError::Unauthorized {
                reference: text,
                source: e,
            }
        }
        OciDistributionError::ImageManifestNotFoundError(_) => OciError::NotFound {
            reference: text,
            source: e,
        },
        OciDistributionError::ServerError { code: 404, .. } => OciError::NotFound {
            reference: text,
            source: e,
        },
        OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::AuthenticationFailure(_)
        | OciDistributionError::ServerError {
            code: 401 | 403, ..
        } => OciError::Unauthorized {
            reference: text,
            source: e,
        },
        _ => OciError::Registry {
            reference: text,
            source: e,
        },
    }
}

/// Pulls the component at `reference`: its manifest (checked against a
/// pinned digest), then its one `application/wasm` layer, within
/// `registries.max_bytes` (the layer's digest is checked by oci-client).
pub async fn pull(reference: &OciRef, registries: &Registries) -> Result<Pulled, OciError> {
    let client = registries.client();
    let auth = registries.auth_for(reference)?;
    let text = reference.to_string();
    let err = |e| classify(reference, registries, e);
    let (raw, _) = client
        .pull_manifest_raw(&reference.reference, &auth, &[OCI_IMAGE_MEDIA_TYPE])
        .await
        .map_err(err)?;
    let manifest_digest = format!("sha256:{}", hex::encode(Sha256::digest(&raw)));
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
    let manifest: OciImageManifest = serde_json::from_slice(&raw)
        .map_err(|e| not_component(format!("its manifest is not an OCI image manifest: {e}")))?;
    let layer = match manifest.layers.as_slice() {
        [layer] if layer.media_type == WASM_LAYER_MEDIA_TYPE => layer,
        layers => {
            let types: Vec<&str> = layers.iter().map(|l| l.media_type.as_str()).collect();
            return Err(not_component(format!(
                "it has layers [{}], not one {WASM_LAYER_MEDIA_TYPE}",
                types.join(", ")
            )));
        }
    };
    let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
    if size > registries.max_bytes {
        return Err(OciError::TooBig {
            reference: text,
            size,
            limit: registries.max_bytes,
        });
    }
    let mut out = Capped {
        bytes: Vec::new(),
        limit: usize::try_from(size).unwrap_or(usize::MAX),
    };
    client
        .pull_blob(&reference.reference, layer, &mut out)
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
    Ok(Pulled {
        bytes: out.bytes,
        manifest_digest,
    })
}

/// The manifest digest `reference` (a tag) names now, without pulling.
pub async fn resolve(reference: &OciRef, registries: &Registries) -> Result<String, OciError> {
    let auth = registries.auth_for(reference)?;
    registries
        .client()
        .fetch_manifest_digest(&reference.reference, &auth)
        .await
        .map_err(|e| classify(reference, registries, e))
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
    let client = registries.client();
    let auth = registries.auth_for(reference)?;
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
    // The registry names what it stored: ask it, rather than recompute the
    // manifest oci-client serialised.
    client
        .fetch_manifest_digest(&reference.reference, &auth)
        .await
        .map_err(|e| classify(reference, registries, e))
}

/// A writer that refuses to grow past `limit` bytes: a registry may lie
/// about a layer's size.
struct Capped {
    bytes: Vec<u8>,
    limit: usize,
}

impl tokio::io::AsyncWrite for Capped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.bytes.len().saturating_add(buf.len()) > self.limit {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                "the layer is larger than its manifest said",
            )));
        }
        self.bytes.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_name_a_registry_a_repository_and_a_tag_or_digest() {
        let ok: OciRef = "oci://registry.example.com/acme/greeter:1.2.0"
            .parse()
            .unwrap();
        assert_eq!(ok.registry(), "registry.example.com");
        assert_eq!(
            ok.to_string(),
            "oci://registry.example.com/acme/greeter:1.2.0"
        );
        let pinned: OciRef = format!(
            "oci://127.0.0.1:5000/acme/greeter@sha256:{}",
            "a".repeat(64)
        )
        .parse()
        .unwrap();
        assert_eq!(
            pinned.digest(),
            Some(format!("sha256:{}", "a".repeat(64)).as_str())
        );
        for (bad, why) in [
            (
                "registry.example.com/acme/greeter:1",
                "does not start with oci://",
            ),
            ("oci://greeter:1", "names no repository"),
            ("oci://acme/greeter:1", "is not a registry host"),
            (
                "oci://registry.example.com/acme/greeter",
                "names no tag or digest",
            ),
            (
                "oci://registry.example.com/Acme/greeter:1",
                "not an OCI reference",
            ),
        ] {
            let e = bad.parse::<OciRef>().err().unwrap().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_repository_prefix_allows_its_repositories_on_segment_boundaries() {
        let acme: RepositoryPrefix = "registry.example.com/acme/".parse().unwrap();
        let allows = |text: &str| acme.allows(&text.parse().unwrap());
        assert!(allows("oci://registry.example.com/acme/greeter:1"));
        assert!(allows("oci://registry.example.com/acme/team/greeter:1"));
        assert!(!allows("oci://registry.example.com/acmecorp/greeter:1"));
        assert!(!allows("oci://registry.example.com/other/greeter:1"));
        assert!(!allows(
            "oci://registry.example.com.evil.net/acme/greeter:1"
        ));
        let whole: RepositoryPrefix = "127.0.0.1:5000".parse().unwrap();
        assert!(whole.allows(&"oci://127.0.0.1:5000/any/thing:1".parse().unwrap()));
        assert!(!whole.allows(&"oci://127.0.0.1:50001/any/thing:1".parse().unwrap()));
        for bad in [
            "https://registry.example.com",
            "acme/greeter",
            "registry.example.com/Acme",
        ] {
            assert!(bad.parse::<RepositoryPrefix>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_layer_longer_than_its_manifest_said_is_refused() {
        use tokio::io::AsyncWriteExt as _;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut capped = Capped {
                bytes: Vec::new(),
                limit: 4,
            };
            capped.write_all(b"abcd").await.unwrap();
            let e = capped.write_all(b"e").await.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::FileTooLarge);
            assert_eq!(capped.bytes, b"abcd");
        });
    }
}
