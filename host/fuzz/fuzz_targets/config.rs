//! The configuration parser: any text is a configuration or an error that
//! names the key, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = corral::config::Config::parse(text, std::path::Path::new("/nonexistent-fuzz-base"));
    }
});
