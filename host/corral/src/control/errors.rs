//! The control plane's errors.

use corral_core::sandbox::{CompileError, LoadError};
use corral_core::session::RouteError;

use corral_core::name::BadName;

use super::metadata::MetadataError;
use super::quota::QuotaExceeded;
use super::store::FindError;
use crate::oci::OciError;

/// Why a change was refused: one variant per reason, carrying its facts.
/// The admin API maps each to a gRPC status at its edge
/// ([`ControlError::code`]); nothing else here knows of gRPC.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no tenant `{0}` is configured")]
    UnknownTenant(String),
    #[error(transparent)]
    NoSuchVersion(#[from] FindError),
    #[error("deployment name {0}")]
    DeploymentName(BadName),
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error("the deployment's reuse: {0}")]
    Reuse(#[from] corral_core::sandbox::ReuseError),
    #[error("the canary's {0}")]
    Canary(#[from] crate::control::rollout::RampError),
    #[error(
        "tenant `{0}`'s rollout sets how its new versions ramp up (rollout.canary): a deploy cannot set its own canary"
    )]
    CanarySet(String),
    #[error("these bytes are already stored as {digest} of deployment `{stored}`, not `{asked}`")]
    StoredAsAnother {
        digest: String,
        stored: String,
        asked: String,
    },
    #[error(
        "{digest} is the active version of `{deployment}`: activate another version first, or force the removal to stop serving it"
    )]
    RemovingActive { digest: String, deployment: String },
    #[error(
        "{digest} of `{deployment}` is held for an operator's approval by the tenant's rollout ({}): an operator activates it with `corral approve`",
        .reasons.join("; ")
    )]
    Held {
        digest: String,
        deployment: String,
        reasons: Vec<String>,
    },
    #[error(transparent)]
    Quota(#[from] QuotaExceeded),
    /// The tenant's deployments, with this change, cannot be routed.
    #[error(transparent)]
    Routes(#[from] RouteError),
    /// The component does not load (not a component, refused imports, over
    /// a limit of what one component may contain).
    #[error(transparent)]
    Load(LoadError),
    /// Compiling it went past the host's `compile_timeout` or
    /// `compile_memory`.
    #[error(transparent)]
    CompileLimit(CompileError),
    #[error("tenant `{tenant}` may not deploy {reference}: {rule}")]
    RegistryNotAllowed {
        tenant: String,
        reference: String,
        rule: String,
    },
    /// An OCI reference or pull that failed; its kind decides the status.
    #[error("{}", crate::error_chain(.0))]
    Pull(#[from] OciError),
    /// Not verifiably signed by a key the tenant's trust policy names,
    /// which requires it.
    #[error("tenant `{tenant}` runs only versions signed by a key it trusts: {what}: {refused}")]
    Unsigned {
        tenant: String,
        what: String,
        #[source]
        refused: crate::trust::Refused,
    },
    /// The host's own storage or workers failed: not the caller's doing.
    #[error("{what}: {source}")]
    Host {
        what: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// What a status code says about a refusal: the API's only vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    InvalidArgument,
    NotFound,
    FailedPrecondition,
    ResourceExhausted,
    PermissionDenied,
    Unavailable,
    Internal,
}

impl ControlError {
    /// The host's own failure, with what it was doing.
    pub fn host(
        what: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ControlError::Host {
            what,
            source: source.into(),
        }
    }

    /// The kind of refusal this is, for the API's status.
    pub fn code(&self) -> Refusal {
        use Refusal::*;
        match self {
            ControlError::UnknownTenant(_) => NotFound,
            ControlError::NoSuchVersion(_) => NotFound,
            ControlError::DeploymentName(_)
            | ControlError::Metadata(_)
            | ControlError::Reuse(_)
            | ControlError::Canary(_)
            | ControlError::StoredAsAnother { .. }
            | ControlError::Load(_) => InvalidArgument,
            ControlError::RemovingActive { .. }
            | ControlError::Routes(_)
            | ControlError::Held { .. }
            | ControlError::CanarySet(_) => FailedPrecondition,
            ControlError::Quota(_) | ControlError::CompileLimit(_) => ResourceExhausted,
            ControlError::RegistryNotAllowed { .. } | ControlError::Unsigned { .. } => {
                PermissionDenied
            }
            ControlError::Pull(e) => match e {
                OciError::NotFound { .. } => NotFound,
                OciError::Unreachable { .. }
                | OciError::Registry { .. }
                | OciError::Deadline { .. }
                | OciError::Proxy(_)
                | OciError::Stage { .. } => Unavailable,
                OciError::Elsewhere { .. } => PermissionDenied,
                OciError::Unauthorized { .. } | OciError::Credentials { .. } => FailedPrecondition,
                OciError::TooBig { .. } | OciError::Oversent { .. } => ResourceExhausted,
                OciError::Reference { .. }
                | OciError::NotAComponent { .. }
                | OciError::DigestMismatch { .. }
                | OciError::BadDigest { .. }
                | OciError::LongerThanDeclared { .. }
                | OciError::NotASignature { .. } => InvalidArgument,
                OciError::Describe(_) => Internal,
            },
            ControlError::Host { .. } => Internal,
        }
    }
}

/// Why the catalog cannot serve what it must at start.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// A stored active version no longer loads: the host must serve
    /// exactly what was active, or say why not.
    #[error("tenant `{tenant}`: active version {digest} of `{deployment}` cannot be served")]
    ActiveVersion {
        tenant: String,
        digest: String,
        deployment: String,
        source: ControlError,
    },
    /// A component named in the configuration (a file or an OCI reference).
    #[error("tenant `{tenant}`: cannot load `{component}`")]
    Configured {
        tenant: String,
        component: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(transparent)]
    Control(#[from] ControlError),
}
