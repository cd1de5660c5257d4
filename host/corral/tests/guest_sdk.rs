//! The Rust guest SDK outside this repository: `cargo package -p
//! corral-guest` makes the crate crates.io would get (corral's WIT inside
//! it), and a guest built against that packaged crate alone — through
//! `corral_guest::generate!`, without a copy of corral's WIT or a `with:`
//! mapping — passes its tests in the sandbox.

mod common;

use std::path::Path;
use std::process::Command;

use common::activities::text;
use common::example;

#[test]
fn the_packaged_guest_sdk_builds_a_guest_that_passes_its_tests() {
    let repo = example("greeter")
        .ancestors()
        .nth(3)
        .expect("the repository root")
        .to_owned();
    let work = tempfile::tempdir().unwrap();
    let out = Command::new("cargo")
        .args([
            "package",
            "-p",
            "corral-guest",
            "--allow-dirty",
            "--no-verify",
        ])
        .arg("--target-dir")
        .arg(work.path().join("package-target"))
        .current_dir(&repo)
        .output()
        .expect("cargo runs");
    assert!(out.status.success(), "cargo package: {}", text(&out));
    let packaged = work
        .path()
        .join("package-target/package/corral-guest-0.1.0.crate");
    let out = Command::new("tar")
        .arg("xzf")
        .arg(&packaged)
        .current_dir(work.path())
        .output()
        .expect("tar runs");
    assert!(out.status.success(), "tar: {}", text(&out));
    let sdk = work.path().join("corral-guest-0.1.0");
    assert!(
        sdk.join("wit/activity.wit").is_file(),
        "the packaged crate lacks corral's WIT"
    );

    // A project as `corral new` writes it, its SDK swapped for the packaged one.
    let out = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["new", "packaged", "--lang", "rust"])
        .current_dir(work.path())
        .output()
        .expect("corral runs");
    assert!(out.status.success(), "corral new: {}", text(&out));
    let project = work.path().join("packaged");
    std::fs::remove_dir_all(project.join("corral-guest")).unwrap();
    let manifest = std::fs::read_to_string(project.join("Cargo.toml")).unwrap();
    let manifest = manifest.replace(
        r#"corral-guest = { path = "corral-guest" }"#,
        &format!(
            "corral-guest = {{ path = {:?} }}",
            sdk.display().to_string()
        ),
    );
    assert!(manifest.contains("corral-guest-0.1.0"), "{manifest}");
    std::fs::write(project.join("Cargo.toml"), manifest).unwrap();
    assert_no_corral_wit_copy(&project);

    let out = Command::new("./build.sh")
        .current_dir(&project)
        .output()
        .expect("build.sh runs");
    assert!(out.status.success(), "build.sh: {}", text(&out));
    let out = Command::new(env!("CARGO_BIN_EXE_corral"))
        .arg("test")
        .current_dir(&project)
        .output()
        .expect("corral runs");
    assert!(out.status.success(), "corral test: {}", text(&out));
    assert!(text(&out).contains("4 passed, 0 failed"), "{}", text(&out));
}

/// The guest's own tree holds no copy of corral's package: it comes from
/// the SDK crate.
fn assert_no_corral_wit_copy(project: &Path) {
    for entry in walk(project) {
        let text = std::fs::read_to_string(&entry).unwrap_or_default();
        assert!(
            !text.contains("package corral:activity"),
            "{} copies corral's WIT",
            entry.display()
        );
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}
