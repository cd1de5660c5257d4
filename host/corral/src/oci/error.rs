//! Why a pull, a resolution or a push failed: each case named, a
//! registry's own words escaped and bounded.

use std::fmt;
use std::time::Duration;

use corral_core::shown::shown;
use oci_client::errors::{OciDistributionError, OciErrorCode};

use super::{MAX_MANIFEST, MAX_QUOTED, OciRef, Registries};

/// A registry's error, its text (which the registry chose: an error page,
/// a redirect's URL) escaped and cut short; or why the host's proxy could
/// not connect to it.
#[derive(Debug)]
pub enum RegistrySaid {
    Client(OciDistributionError),
    Connect {
        destination: String,
        error: std::io::Error,
    },
}

impl fmt::Display for RegistrySaid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistrySaid::Client(e) => f.write_str(&shown(&crate::error_chain(e), MAX_QUOTED)),
            RegistrySaid::Connect { destination, error } => {
                write!(f, "connecting to {destination}: {error}")
            }
        }
    }
}

impl std::error::Error for RegistrySaid {}

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
        source: RegistrySaid,
    },
    #[error("{reference} was not found in its registry")]
    NotFound {
        reference: String,
        #[source]
        source: RegistrySaid,
    },
    #[error(
        "the registry refused the credentials for {reference} (registry_credentials in the configuration; CORRAL_REGISTRY_USERNAME and CORRAL_REGISTRY_PASSWORD for the CLI)"
    )]
    Unauthorized {
        reference: String,
        #[source]
        source: RegistrySaid,
    },
    #[error("{reference}: {source}")]
    Registry {
        reference: String,
        #[source]
        source: RegistrySaid,
    },
    #[error(
        "{reference}: the registry sent the host to {destination}, which no `registries` rule names (a redirect, a token realm or a layer URL); add the host to the tenant's registries to allow it"
    )]
    Elsewhere {
        reference: String,
        destination: String,
    },
    #[error(
        "{reference}: the registry sent more than the pull allows ({received} bytes; a manifest may be at most {MAX_MANIFEST} bytes, a layer what its manifest declares)"
    )]
    Oversent { reference: String, received: u64 },
    #[error("{reference}: the pull did not finish within {}s (the registry is too slow)", deadline.as_secs())]
    Deadline {
        reference: String,
        deadline: Duration,
    },
    #[error(
        "{reference}: the registry named the manifest `{digest}`, which is not a sha256 digest"
    )]
    BadDigest { reference: String, digest: String },
    #[error("starting the host's registry proxy")]
    Proxy(#[source] std::io::Error),
    #[error("{reference}: storing the pulled layer")]
    Stage {
        reference: String,
        #[source]
        source: std::io::Error,
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
    #[error("{reference} is not a cosign signature manifest: {why}")]
    NotASignature { reference: String, why: String },
}

pub(super) fn classify(
    reference: &OciRef,
    registries: &Registries,
    e: OciDistributionError,
) -> OciError {
    let text = reference.to_string();
    let e = RegistrySaid::Client(e);
    let RegistrySaid::Client(client) = &e else {
        return unreachable(reference, registries, e);
    };
    match client {
        OciDistributionError::RequestError(r) if r.is_connect() || r.is_timeout() => {
            unreachable(reference, registries, e)
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

pub(super) fn unreachable(
    reference: &OciRef,
    registries: &Registries,
    e: RegistrySaid,
) -> OciError {
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
