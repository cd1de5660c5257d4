//! `demo:versioned`: one deployment built in three versions, so the tests
//! can deploy, roll forward and roll back a running host. v2
//! (`--features v2`) adds an activity type; v3 (`--features v3`) has v1's
//! types but a regression no signature shows: `hold(0)` traps.

use std::time::{Duration, Instant};

#[cfg(not(feature = "v2"))]
corral_guest::generate!("demo:versioned/v1");

#[cfg(feature = "v2")]
corral_guest::generate!("demo:versioned/v2");

const VERSION: &str = if cfg!(feature = "v2") {
    "v2"
} else if cfg!(feature = "v3") {
    "v3"
} else {
    "v1"
};

struct Versioned;

impl exports::demo::versioned::api::Guest for Versioned {
    fn hold(ms: u32) -> String {
        if cfg!(feature = "v3") && ms == 0 {
            panic!("v3: hold(0) regressed");
        }
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
