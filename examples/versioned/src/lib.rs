//! `demo:versioned`: one deployment built in two versions (`--features v2`),
//! so the tests can deploy, roll forward and roll back a running host.

use std::time::{Duration, Instant};

#[cfg(not(feature = "v2"))]
corral_guest::generate!("demo:versioned/v1");

#[cfg(feature = "v2")]
corral_guest::generate!("demo:versioned/v2");

const VERSION: &str = if cfg!(feature = "v2") { "v2" } else { "v1" };

struct Versioned;

impl exports::demo::versioned::api::Guest for Versioned {
    fn hold(ms: u32) -> String {
        let end = Instant::now() + Duration::from_millis(u64::from(ms));
        while Instant::now() < end && !corral_guest::is_cancelled() {
            std::thread::sleep(Duration::from_millis(50));
            corral_guest::pulse();
        }
        VERSION.to_owned()
    }
}

#[cfg(feature = "v2")]
impl exports::demo::versioned::extra::Guest for Versioned {
    fn added() -> String {
        VERSION.to_owned()
    }
}

export!(Versioned);
