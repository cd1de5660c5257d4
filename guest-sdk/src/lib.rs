//! Write corral activities in Rust.
//!
//! An activity is a WebAssembly component: every function it exports is an
//! activity type, called by the workflow engine with JSON that the host
//! converts to your WIT types. This crate gives you the host's
//! `corral:activity/context` import — [`info`], [`heartbeat`],
//! [`is_cancelled`], [`log`] — and the [`Failure`] record to fail on purpose.
//!
//! # A whole activity, from WIT to test
//!
//! 1. Describe what you export, in `wit/world.wit` of your crate:
//!
//! ```wit
//! package demo:greeter;
//!
//! interface api {
//!   use corral:activity/types@0.1.0.{failure};
//!   record person { name: string, title: option<string> }
//!   greet: func(who: person) -> result<string, failure>;
//! }
//!
//! world greeter {
//!   import corral:activity/context@0.1.0;
//!   export api;
//! }
//! ```
//!
//! 2. Generate bindings for your world with [`generate!`]: corral's WIT
//!    package comes with this crate and its types are mapped for you, so
//!    your `wit/` holds only your own package and your crate depends only on
//!    `corral-guest` (and `crate-type = ["cdylib"]`):
//!
//! ```ignore
//! corral_guest::generate!("demo:greeter/greeter");
//!
//! use exports::demo::greeter::api::{Guest, Person};
//! use corral_guest::Failure;
//!
//! struct Greeter;
//!
//! impl Guest for Greeter {
//!     fn greet(who: Person) -> Result<String, Failure> {
//!         if who.name.is_empty() {
//!             return Err(Failure::new("EmptyName", "a name is required").non_retryable());
//!         }
//!         corral_guest::log::info(&format!("greeting {}", who.name));
//!         Ok(format!("Hello, {}!", who.name))
//!     }
//! }
//!
//! export!(Greeter);
//! ```
//!
//! 3. Build it as a component (`crate-type = ["cdylib"]` in `Cargo.toml`):
//!    `cargo build --release --target wasm32-wasip2`.
//!
//! 4. Run it with the host, exactly as production will:
//!    `corral run target/wasm32-wasip2/release/greeter.wasm
//!    demo:greeter/api.greet '{"name":"Ada"}'`; test it with `corral test`
//!    and a `greeter.test.toml` of cases, or from Rust with the host test
//!    harness, a dev-dependency on `corral-core` (it builds without any
//!    workflow engine's client):
//!
//! ```ignore
//! let host = corral_core::testing::TestHost::builder().build()?;
//! let greeter = host.load_file("target/wasm32-wasip2/release/greeter.wasm")?;
//! let run = greeter.call("demo:greeter/api.greet").arg(json!({"name": ""})).run().await;
//! assert_eq!(run.failure().unwrap().kind, "EmptyName");
//! ```
//!
//! `corral new greeter --lang rust` writes all of this as a project that
//! builds and passes its own tests.
//!
//! Off WebAssembly (e.g. `cargo test` of your crate's pure logic) the
//! context functions are not available and panic if called.

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "corral:activity/sdk",
        additional_derives: [Clone, PartialEq],
        generate_unused_types: true,
        with: { "wasi:config/store@0.2.0-rc.1": generate },
    });
}

pub use bindings::corral::activity::{context, types};

// `generate!`, written by the build script with the path of this crate's WIT.
include!(concat!(env!("OUT_DIR"), "/generate.rs"));

#[doc(hidden)]
pub mod __private {
    pub use wit_bindgen;
}
pub use types::{ActivityInfo, Failure};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The running attempt: activity type and id, attempt number (1 first),
/// tenant, deadline, and the last heartbeat of the previous attempt.
pub fn info() -> ActivityInfo {
    context::info()
}

/// Records progress with JSON `details`, kept by the engine and handed to
/// the next attempt (see [`last_heartbeat`]). Also tells the engine the
/// activity is alive.
///
/// Fails only when `details` cannot be serialized to JSON.
pub fn heartbeat<T: Serialize + ?Sized>(details: &T) -> Result<(), serde_json::Error> {
    let json = serde_json::to_string(details)?;
    context::heartbeat(Some(&json));
    Ok(())
}

/// Tells the engine the activity is alive, without progress details.
pub fn pulse() {
    context::heartbeat(None);
}

/// The details of the previous attempt's last heartbeat, if there was one
/// and it has the shape `T`.
pub fn last_heartbeat<T: DeserializeOwned>() -> Option<T> {
    info()
        .last_heartbeat
        .and_then(|json| serde_json::from_str(&json).ok())
}

/// True once the engine or the host asked this activity to stop. Return
/// promptly when it is (for instance with [`Failure::cancelled`]): after a
/// grace period the host interrupts the activity anyway.
pub fn is_cancelled() -> bool {
    context::is_cancelled()
}

/// Settings the operator gave this tenant and deployment
/// (`wasi:config/store`): the tenant's `config`, a deployment's own keys
/// over it (`corral deploy --config KEY=VALUE`), and, under each secret's
/// name, the secret's placeholder — never its value, which corral puts in
/// place of the placeholder only in requests to the secret's own hosts.
pub mod config {
    use super::bindings::wasi::config::store;

    pub use store::Error;

    /// The value of `key`, if it is set.
    pub fn get(key: &str) -> Result<Option<String>, Error> {
        store::get(key)
    }

    /// Every key and value.
    pub fn get_all() -> Result<Vec<(String, String)>, Error> {
        store::get_all()
    }
}

/// Log lines, tagged by the host with tenant, activity type and id.
pub mod log {
    use super::context::{self, Level};

    pub fn trace(message: &str) {
        context::log(Level::Trace, message);
    }
    pub fn debug(message: &str) {
        context::log(Level::Debug, message);
    }
    pub fn info(message: &str) {
        context::log(Level::Info, message);
    }
    pub fn warn(message: &str) {
        context::log(Level::Warn, message);
    }
    pub fn error(message: &str) {
        context::log(Level::Error, message);
    }
}

impl Failure {
    /// A retryable failure of the given stable `kind` (e.g.
    /// `"PaymentDeclined"`), which workflow authors can match on.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            kind: kind.into(),
            retryable: true,
            details: None,
        }
    }

    /// The failure a guest returns when it noticed [`is_cancelled`].
    pub fn cancelled() -> Self {
        Failure::new("Cancelled", "the activity was cancelled").non_retryable()
    }

    /// Marks the failure as permanent: the engine will not retry.
    pub fn non_retryable(self) -> Self {
        self.retryable(false)
    }

    /// Sets whether the engine may retry.
    pub fn retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    /// Attaches JSON details (serialization errors are reported in the
    /// details instead).
    pub fn with_details<T: Serialize + ?Sized>(mut self, details: &T) -> Self {
        self.details = Some(serde_json::to_string(details).unwrap_or_else(|e| {
            serde_json::json!({ "unserializable_details": e.to_string() }).to_string()
        }));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failure_builder_sets_every_field() {
        let f = Failure::new("PaymentDeclined", "card refused")
            .non_retryable()
            .with_details(&serde_json::json!({ "code": 51 }));
        assert_eq!(f.kind, "PaymentDeclined");
        assert_eq!(f.message, "card refused");
        assert!(!f.retryable);
        assert_eq!(f.details.as_deref(), Some(r#"{"code":51}"#));
        assert!(Failure::new("X", "y").retryable);
        assert_eq!(Failure::cancelled().kind, "Cancelled");
    }
}
