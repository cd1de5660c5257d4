//! The control plane: the admin API (`proto/corral/v1`), the persistent
//! component store, tenants' tokens, and metrics.

/// The generated `corral.v1` types, client and server.
pub mod proto {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("corral.v1");
}

pub mod api;
pub mod auth;
pub mod catalog;
mod errors;
pub mod follow;
pub mod gate;
pub mod metadata;
mod pull;
pub mod quota;
pub mod rollout;
pub mod server;
pub mod shadow;
mod shapes;
pub mod store;
mod uploads;

pub use api::AdminService;
pub use auth::{Auth, Principal};
pub use catalog::{Catalog, ControlError, NewVersion, TenantSpec, VersionView};
pub use store::Store;
