//! The README's first command, `examples/quickstart.sh`, run as a newcomer
//! would (with the corral this suite built): it builds the examples
//! (showing progress), serves the examples to a real
//! Temporal dev server through `corral dev`, executes the greeter through it
//! with the `temporal` CLI, and stops everything it started.

mod common;

use std::net::TcpStream;
use std::process::Command;

use common::activities::text;
use common::example;

#[test]
fn the_quickstart_serves_the_examples_to_temporal_and_stops_everything() {
    let root = example("greeter")
        .ancestors()
        .nth(3)
        .expect("the repository root")
        .to_owned();
    let out = Command::new("bash")
        .arg(root.join("examples/quickstart.sh"))
        .current_dir(&root)
        // The corral this test suite built: `cargo build` from inside a
        // test would build it again with other features (tokio's test-util
        // comes with the dev-dependencies).
        .env("CORRAL_BIN", env!("CARGO_BIN_EXE_corral"))
        .output()
        .expect("bash runs");
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Each step says what it does.
    for step in [
        "== building the example activities",
        "== building corral",
        "== serving every example to a fresh Temporal dev server (corral dev)",
        "== executing demo:greeter/api.greet through Temporal",
        "== stopping corral dev and its dev server",
    ] {
        assert!(stdout.contains(step), "no `{step}` in:\n{said}");
    }
    // The result came back through the engine.
    assert!(
        stdout.contains("Good day, Countess Ada!"),
        "no greeting in:\n{said}"
    );
    // And the dev server it started is gone.
    let address = said
        .lines()
        .find_map(|l| l.split("--address ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .map(|a| a.trim_matches(|c| c == '"' || c == '\''))
        .unwrap_or_else(|| panic!("no dev server address in:\n{said}"))
        .to_owned();
    assert!(
        TcpStream::connect(&address).is_err(),
        "the dev server on {address} still answers after the quickstart ended"
    );
}
