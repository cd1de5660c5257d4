//! Engine connectors: each turns one engine's protocol into the session
//! loop's [`Connector`](crate::session::Connector) trait.

pub mod temporal;
