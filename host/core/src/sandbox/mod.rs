//! The sandbox: loads components and runs each task in a fresh, limited,
//! capability-less instance, turning every way it can end into a classified
//! [`Outcome`]. Nothing here knows which engine a task came from.

mod cache;
mod capabilities;
mod change;
mod classify;
mod compile;
mod component;
mod config;
mod context;
pub mod convert;
mod destination;
mod engine;
mod execute;
mod failure;
mod http;
mod idle;
mod limits;
mod load;
mod observer;
mod outcome;
mod secrets;
pub mod shadow;
mod signature;
mod stdio;
mod task_id;
mod tenant;
mod ticker;
mod warm;
mod watchdog;

pub use capabilities::{Capabilities, DirGrant, DirGrantError, DirMode};
pub use change::{ChangeReport, Changed, Flow, breaking, type_changes};
pub use classify::{listed_names, shown_name};
pub use compile::{CompileError, worker_main as compile_worker_main};
pub use component::{LoadError, LoadedComponent};
pub use config::{CompileLimits, PerComponent, SandboxConfig, fiber_stack_size};
pub use context::{HeartbeatDetails, TaskInfo};
pub use destination::{GrantError, HttpGrant, HttpHost};
pub use engine::Sandbox;
pub use execute::Task;
pub use failure::{Failure, FailureClass, Outcome, RetryPolicy};
pub use limits::{
    DEFAULT_TIMEOUT, Limits, QuantityError, format_bytes, parse_bytes, parse_duration,
};
pub use observer::{LogLevel, Stream, TaskObserver, Unobserved};
pub use secrets::{PLACEHOLDER_PREFIX, SecretError, SecretHost, SecretSource, SecretSpec, Secrets};
pub use signature::{
    ActivityDescription, ActivityType, ParamDescription, UnsupportedExport, render,
};
pub use tenant::{PolicyError, PreparedTenant, SecretShadows, Tenant};
pub use ticker::TICK;
pub use warm::{DeploymentReuse, Reuse, ReuseError};
