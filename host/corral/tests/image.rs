//! The container image (`deploy/image`), built with podman from the corral
//! this suite built: it holds corral and what it needs and nothing else
//! (no shell, no compiler), runs as its own user with its volumes and
//! ports declared, and its root file system alone serves a real task to a
//! real Temporal dev server (in a `chroot`, as the image's user, its data
//! directory a root-owned world-writable mount as Kubernetes' `emptyDir`
//! is). Where this machine lets podman run containers, the image runs too;
//! where it refuses (this sandbox sets no RLIMIT_NOFILE for a container),
//! the test says so and proves the image by its root file system only.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::activities::{execute_completed, text, unique};
use common::processes::{Corral, free_port};
use common::temporal::TemporalServer;
use common::{example, repo};

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .expect("podman runs (tests/setup.sh installs it)")
}

/// Removes an image and unmounts a `/proc` when the test ends, however.
struct Cleanup {
    image: String,
    proc_mount: Option<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(mount) = &self.proc_mount {
            let _ = Command::new("umount").arg("-l").arg(mount).output();
        }
        let _ = podman(&["rmi", "--force", &self.image]);
    }
}

/// Every file in `dir`, relative to it.
fn files(dir: &Path, under: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() && path != under.join("proc") {
            files(&path, under, out);
        } else {
            out.push(path.strip_prefix(under).unwrap().to_owned());
        }
    }
}

#[test]
fn the_image_holds_corral_alone_and_its_root_file_system_serves_a_real_task() {
    let image = format!("localhost/{}:test", unique("corral-image").to_lowercase());
    let mut cleanup = Cleanup {
        image: image.clone(),
        proc_mount: None,
    };
    let out = Command::new(repo().join("deploy/image/build.sh"))
        .arg(&image)
        .env("CORRAL_BIN", env!("CARGO_BIN_EXE_corral"))
        .output()
        .unwrap();
    assert!(out.status.success(), "build.sh: {}", text(&out));

    // Its settings: its user, volumes, ports and command.
    let out = podman(&["image", "inspect", &image]);
    assert!(out.status.success(), "{}", text(&out));
    let inspected: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let config = &inspected[0]["Config"];
    assert_eq!(config["User"], "65532:65532", "{config}");
    for port in ["7466/tcp", "9464/tcp"] {
        assert!(config["ExposedPorts"].get(port).is_some(), "{config}");
    }
    for volume in ["/var/lib/corral", "/var/cache/corral"] {
        assert!(config["Volumes"].get(volume).is_some(), "{config}");
    }
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/corral"])
    );
    assert_eq!(
        config["Cmd"],
        serde_json::json!(["serve", "--config", "/etc/corral/corral.toml"])
    );

    // Run it, where this machine lets podman run containers.
    let ran = podman(&["run", "--rm", &image, "--version"]);
    if ran.status.success() {
        assert!(
            String::from_utf8_lossy(&ran.stdout).starts_with("corral "),
            "{}",
            text(&ran)
        );
    } else {
        eprintln!(
            "podman run is refused on this machine ({}); the image is proven by its root file system alone",
            String::from_utf8_lossy(&ran.stderr).trim()
        );
    }

    // Its root file system, as a container would see it.
    let root = tempfile::tempdir().unwrap();
    let created = podman(&["create", &image]);
    assert!(
        created.status.success(),
        "podman create: {}",
        text(&created)
    );
    let container = String::from_utf8_lossy(&created.stdout).trim().to_owned();
    let tar = root.path().join("rootfs.tar");
    let exported = podman(&["export", "-o", &tar.display().to_string(), &container]);
    let _ = podman(&["rm", "--force", &container]);
    assert!(
        exported.status.success(),
        "podman export: {}",
        text(&exported)
    );
    let rootfs = root.path().join("rootfs");
    std::fs::create_dir(&rootfs).unwrap();
    let untar = Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(&rootfs)
        .output()
        .unwrap();
    assert!(untar.status.success(), "tar: {}", text(&untar));

    // corral and what it links, certificates, its user: no shell, no
    // package manager, no compiler.
    let mut held = Vec::new();
    files(&rootfs, &rootfs, &mut held);
    let names: Vec<String> = held.iter().map(|p| p.display().to_string()).collect();
    assert!(
        names.contains(&"usr/local/bin/corral".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"etc/ssl/certs/ca-certificates.crt".to_owned()),
        "{names:?}"
    );
    for tool in [
        "sh", "bash", "dash", "busybox", "cc", "gcc", "apt", "dpkg", "pip",
    ] {
        assert!(
            !held
                .iter()
                .any(|p| p.file_name().is_some_and(|n| n == tool)),
            "the image holds `{tool}`: {names:?}"
        );
    }
    assert!(held.len() < 20, "more than corral needs: {names:?}");

    // A real task from its root file system: corral as the image's user,
    // its data directory root-owned and world-writable as an `emptyDir`
    // volume is.
    let server = TemporalServer::start();
    let queue = unique("image");
    let metrics = free_port();
    std::fs::copy(example("echo"), rootfs.join("etc/corral/echo.wasm")).unwrap();
    std::fs::write(
        rootfs.join("etc/corral/corral.toml"),
        format!(
            r#"[host]
data_dir = "/var/lib/corral"
cache_dir = "/var/cache/corral"
metrics_listen = "127.0.0.1:{metrics}"

[[tenant]]
name = "acme"
temporal = {{ address = "http://{address}", task_queue = "{queue}" }}
components = ["/etc/corral/echo.wasm"]
"#,
            address = server.address()
        ),
    )
    .unwrap();
    let data = rootfs.join("var/lib/corral");
    let chown = Command::new("chown")
        .arg("0:0")
        .arg(&data)
        .output()
        .unwrap();
    assert!(chown.status.success(), "{}", text(&chown));
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).unwrap();
    // The kernel's /proc, as every container has (corral finds its own
    // binary there to start its compile workers).
    let proc_mount = rootfs.join("proc");
    let mounted = Command::new("mount")
        .args(["-t", "proc", "proc"])
        .arg(&proc_mount)
        .output()
        .unwrap();
    assert!(
        mounted.status.success(),
        "mounting /proc in the root file system (the test needs root): {}",
        text(&mounted)
    );
    cleanup.proc_mount = Some(proc_mount);
    let corral = Corral::start_chrooted(&rootfs, "65532:65532");
    let result = execute_completed(
        &server,
        &corral,
        &queue,
        "demo:echo/api.echo-string",
        &["\"from the image\""],
    );
    assert_eq!(result, serde_json::json!("from the image"));
    // It wrote its data as its own user, owner-only.
    let index = std::fs::metadata(data.join("index.json")).unwrap();
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!(index.uid(), 65532);
    assert_eq!(index.mode() & 0o077, 0);
    drop(corral);
}
