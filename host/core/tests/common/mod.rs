//! The guests the tests run: the example components and the attack suite's,
//! built once per test process, and a test host to run them on. Shared by
//! `corral-core`'s tests and (through `#[path]`) `corral`'s.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use corral_core::testing::{TestComponent, TestHost, TestHostBuilder};

/// Builds the example components (`examples/build.sh`) once per test
/// process; the script serialises concurrent builds.
pub fn example(name: &str) -> PathBuf {
    built().join("examples/dist").join(format!("{name}.wasm"))
}

/// A guest of the attack suite (`tests/guests/`), built with the examples.
pub fn hostile_guest(name: &str) -> PathBuf {
    built()
        .join("tests/guests/dist")
        .join(format!("{name}.wasm"))
}

/// The repository root, once `examples/build.sh` has built every guest.
fn built() -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let built = BUILT.get_or_init(|| {
        let status = Command::new(root.join("examples/build.sh"))
            .env("CORRAL_QUIET", "1")
            .status()
            .map_err(|e| format!("cannot run examples/build.sh: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("examples/build.sh failed: {status}"))
        }
    });
    if let Err(e) = built {
        panic!("{e}");
    }
    root
}

/// A test host with short timeouts, so a wrong guess fails fast.
pub fn host() -> TestHostBuilder {
    TestHost::builder()
        .timeout(Duration::from_secs(20))
        .cancel_grace(Duration::from_millis(500))
}

pub fn load(host: &TestHost, name: &str) -> TestComponent {
    match host.load_file(example(name)) {
        Ok(component) => component,
        Err(e) => panic!("loading {name}: {e}"),
    }
}

/// How many file descriptors process `pid` (or `self`) holds open.
pub fn open_fds(pid: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| dir.count())
        .unwrap_or_else(|e| panic!("the descriptors of process {pid}: {e}"))
}
