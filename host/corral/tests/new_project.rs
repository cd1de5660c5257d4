//! The README's walkthrough, once per guest language, with the real tools:
//! `corral new NAME --lang L` → `./build.sh` → `corral test` → `corral
//! deploy` to a running `corral dev` → `temporal activity execute` returns
//! the activity's result through a real Temporal dev server.
//!
//! `CORRAL_SKIP_PYTHON` / `CORRAL_SKIP_JS` leave a language out, as they do
//! for the examples.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::activities::text;
use common::processes::{Corral, free_port};

/// Language, the README's project name for it, and the variable that skips it.
const LANGUAGES: [(&str, &str, &str); 3] = [
    ("js", "hello", "CORRAL_SKIP_JS"),
    ("python", "hello-py", "CORRAL_SKIP_PYTHON"),
    ("rust", "hello-rs", ""),
];

fn corral(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("corral runs")
}

/// `corral new`, `./build.sh` and `corral test` in a fresh directory: the
/// project builds and passes its own tests with the commands it printed.
fn create_build_and_test(root: &Path, name: &str, lang: &str) {
    let out = corral(root, &["new", name, "--lang", lang]);
    assert!(out.status.success(), "corral new: {}", text(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    for command in [&format!("cd {name}"), "./build.sh", "corral test"] {
        assert!(
            printed.contains(command),
            "corral new did not print `{command}`: {printed}"
        );
    }
    let project = root.join(name);
    let out = Command::new("./build.sh")
        .current_dir(&project)
        .output()
        .expect("build.sh runs");
    assert!(out.status.success(), "{lang} build.sh: {}", text(&out));
    assert!(project.join(format!("dist/{name}.wasm")).is_file());

    let out = corral(&project, &["test"]);
    assert!(out.status.success(), "{lang} corral test: {}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("4 passed, 0 failed"), "{lang}: {stdout}");
}

#[test]
fn a_new_project_in_each_language_builds_passes_its_tests_and_serves_temporal_once_deployed() {
    let root = tempfile::tempdir().unwrap();
    let languages: Vec<(&str, &str)> = LANGUAGES
        .iter()
        .filter(|(_, _, skip)| skip.is_empty() || std::env::var_os(skip).is_none())
        .map(|(lang, name, _)| (*lang, *name))
        .collect();
    for (lang, name) in &languages {
        create_build_and_test(root.path(), name, lang);
    }

    // A running host: `corral dev` with nothing to serve yet (no
    // examples/dist here), its admin API open for deploys.
    let (port, admin_port) = (free_port(), free_port());
    let dev = Corral::start_in(
        Some(root.path()),
        &[
            "dev".into(),
            "--port".into(),
            port.to_string(),
            "--admin-port".into(),
            admin_port.to_string(),
        ],
        tempfile::tempdir().unwrap(),
    );
    let endpoint = format!("export CORRAL_ENDPOINT=http://127.0.0.1:{admin_port}");
    dev.await_printed(&endpoint);
    dev.await_printed("export CORRAL_TOKEN=");
    let stdout = dev.stdout();
    let token = stdout
        .lines()
        .find_map(|l| l.strip_prefix("export CORRAL_TOKEN="))
        .unwrap_or_else(|| panic!("corral dev printed no token:\n{stdout}"))
        .to_owned();

    for (lang, name) in &languages {
        let project = root.path().join(name);
        let out = Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(["deploy", &format!("dist/{name}.wasm")])
            .env("CORRAL_ENDPOINT", format!("http://127.0.0.1:{admin_port}"))
            .env("CORRAL_TOKEN", &token)
            .current_dir(&project)
            .output()
            .expect("corral deploy runs");
        assert!(out.status.success(), "{lang} corral deploy: {}", text(&out));
        // The deploy answer names what it now serves.
        let greet = format!("local:{name}/api.greet");
        assert!(text(&out).contains(&greet), "{lang}: {}", text(&out));

        let out = Command::new("temporal")
            .args(["activity", "execute", "--address"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["--task-queue", "corral-dev", "--type"])
            .arg(&greet)
            .args(["--activity-id", &format!("{name}-1")])
            .args(["--start-to-close-timeout", "60s"])
            .args(["--input", r#"{"name":"Ada","title":"Countess"}"#])
            .output()
            .expect("the temporal CLI runs");
        let said = text(&out);
        assert!(out.status.success(), "{lang} activity execute: {said}");
        assert!(said.contains("Hello, Countess Ada!"), "{lang}: {said}");
    }
}
