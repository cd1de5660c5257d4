//! JSON ⇄ WIT conversion for every type of `examples/echo` (every WIT
//! type): any JSON is a value of the type or an error with a path, never a
//! panic; a value converts back to JSON.
#![no_main]

use std::sync::{Arc, LazyLock};

use corral_core::sandbox::{LoadedComponent, Sandbox, SandboxConfig, convert};
use libfuzzer_sys::fuzz_target;

static ECHO: LazyLock<Arc<LoadedComponent>> = LazyLock::new(|| {
    let sandbox = Sandbox::new(SandboxConfig::default()).expect("a sandbox");
    let bytes = include_bytes!("../../../examples/dist/echo.wasm");
    sandbox.load(bytes).expect("the echo example loads")
});

fuzz_target!(|data: &[u8]| {
    let Some((&pick, json)) = data.split_first() else {
        return;
    };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(json) else {
        return;
    };
    let activities = &ECHO.activities;
    let activity = &activities[usize::from(pick) % activities.len()];
    for (_, ty) in &activity.params {
        if let Ok(val) = convert::from_json(ty, &value) {
            convert::to_json(ty, val).expect("a value made from JSON converts back");
        }
    }
});
