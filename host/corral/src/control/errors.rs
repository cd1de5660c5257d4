//! The control plane's errors.

/// Why a change was refused; the API maps each kind to a gRPC status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    FailedPrecondition(String),
    /// Over a tenant's storage quota.
    #[error("{0}")]
    QuotaExceeded(String),
    #[error("{0}")]
    Internal(String),
    #[error("{0}")]
    PermissionDenied(String),
    /// Something the host depends on (a registry) cannot be reached.
    #[error("{0}")]
    Unavailable(String),
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
