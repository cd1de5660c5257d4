//! `corral dev`, end to end: the real binary, the real `temporal` CLI and
//! the dev server it starts.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::activities::text;
use common::example;
use common::processes::{Corral, free_port};

/// The README's `corral dev`, from the repository root with no files: it
/// serves everything `examples/build.sh` built.
#[test]
fn corral_dev_starts_a_server_prints_working_commands_and_stops_everything() {
    let greeter = example("greeter");
    let root = greeter
        .ancestors()
        .nth(3)
        .expect("the repository root")
        .to_owned();
    let port = free_port();
    let mut dev = Corral::start_in(
        Some(&root),
        &[
            "dev".into(),
            "--port".into(),
            port.to_string(),
            "--admin-port".into(),
            free_port().to_string(),
        ],
        tempfile::tempdir().unwrap(),
    );
    // Every example is served, `fetch` (which imports wasi:http) among
    // them, each as soon as it is compiled.
    dev.await_logged("component(s) served", 1);
    for ty in [
        "demo:fetch/api.get",
        "demo:progress/api.count-to",
        "demo:greeter/api.greet-all",
    ] {
        // The command line itself, not only the comment above it.
        dev.await_printed(&format!("--type '{ty}' "));
    }
    let stdout = dev.stdout();
    let command = stdout
        .lines()
        .find(|l| {
            l.starts_with("temporal activity execute") && l.contains("demo:greeter/api.greet-all")
        })
        .unwrap_or_else(|| panic!("no command for greet-all in:\n{stdout}"))
        .to_owned();
    assert!(
        command.contains(&format!("--address 127.0.0.1:{port}")),
        "{command}"
    );
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(&command)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("COMPLETED"),
        "{}",
        text(&out)
    );

    assert_eq!(
        dev.terminate(Duration::from_secs(20)),
        Some(0),
        "{}",
        dev.stderr()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the dev server outlived corral dev"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn corral_dev_stops_with_a_clear_error_when_its_server_cannot_start() {
    // The port is taken, so `temporal server start-dev` exits at once.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut dev = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["dev", &example("greeter").display().to_string()])
        .args(["--port", &port.to_string()])
        .args(["--admin-port", &free_port().to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(40);
    let status = loop {
        if let Some(status) = dev.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = dev.kill();
            panic!("corral dev kept running without its server");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut dev.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the Temporal dev server on 127.0.0.1:{port} exited"
        )),
        "{stderr}"
    );
}

/// A `corral dev` run on `files` with its own compile cache, stopped once
/// every file is served or refused; returns what it wrote to stderr.
/// `watch` sees the run while the files compile.
fn dev_run(cache: &Path, files: &[&Path], watch: impl FnOnce(&Corral)) -> String {
    let mut args = vec!["dev".to_owned()];
    args.extend(files.iter().map(|f| f.display().to_string()));
    args.extend([
        "--port".into(),
        free_port().to_string(),
        "--admin-port".into(),
        free_port().to_string(),
    ]);
    let cache = cache.display().to_string();
    let mut dev = Corral::start_with(
        None,
        &[("CORRAL_CACHE_DIR", &cache)],
        &args,
        tempfile::tempdir().unwrap(),
    );
    watch(&dev);
    dev.await_logged("component(s) served", 1);
    let stderr = dev.stderr();
    assert_eq!(dev.terminate(Duration::from_secs(20)), Some(0), "{stderr}");
    stderr
}

/// The compile workers (`corral compile-worker`) running now with `cache`
/// as their compile cache: the workers of one test's run.
fn compile_workers(cache: &Path) -> usize {
    let mark = format!("CORRAL_CACHE_DIR={}", cache.display());
    common::processes::compile_workers()
        .into_iter()
        .filter(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            environ.split(|b| *b == 0).any(|v| v == mark.as_bytes())
        })
        .count()
}

#[test]
fn corral_dev_compiles_side_by_side_serves_what_it_can_and_starts_from_the_cache_next_time() {
    let cache = tempfile::tempdir().unwrap();
    let bad_dir = tempfile::tempdir().unwrap();
    let bad = bad_dir.path().join("broken.wasm");
    std::fs::write(&bad, b"\0asm but not a component").unwrap();
    // The two slowest compiles (interpreters), and a Rust guest.
    let (python, js, greeter) = (
        example("python-shout"),
        example("js-greeter"),
        example("greeter"),
    );
    let files = [
        python.as_path(),
        js.as_path(),
        bad.as_path(),
        greeter.as_path(),
    ];
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut most = 0;
    let first = dev_run(cache.path(), &files, |dev| {
        // Until every file is served or refused.
        while cores > 1 && most < 2 && !dev.stderr().contains("component(s) served") {
            most = most.max(compile_workers(cache.path()));
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    assert!(
        first.contains(&format!(
            "compiling 4 component(s), {} at a time",
            cores.min(4)
        )),
        "{first}"
    );
    if cores > 1 {
        assert!(most >= 2, "never two compiles at once:\n{first}");
    }
    // Each is named as it is served, compiled now; the broken one with why,
    // and the others are served regardless.
    for file in [&python, &js, &greeter] {
        let name = file.display().to_string();
        assert!(
            first
                .lines()
                .any(|l| l.contains(&format!("serving {name} (compiled; "))),
            "{name}:\n{first}"
        );
    }
    assert!(
        first
            .lines()
            .any(|l| l.contains(&format!("{} is not served:", bad.display()))),
        "{first}"
    );
    assert!(first.contains("3 of 4 component(s) served"), "{first}");

    // The next run compiles nothing.
    let second = dev_run(cache.path(), &files, |_| {});
    for file in [&python, &js, &greeter] {
        let name = file.display().to_string();
        assert!(
            second.contains(&format!("serving {name} (from the compile cache)")),
            "{name}:\n{second}"
        );
    }
}

#[test]
fn corral_dev_names_a_file_it_cannot_read_before_starting_anything() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["dev", "no-such-file.wasm", "--port"])
        .arg(free_port().to_string())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("cannot read no-such-file.wasm"), "{said}");
    assert!(!said.contains("starting a Temporal dev server"), "{said}");
}

#[test]
fn corral_dev_refuses_two_files_that_would_be_one_deployment_before_starting_anything() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let greeter = example("greeter");
    let (first, second) = (a.path().join("greeter.wasm"), b.path().join("greeter.wasm"));
    std::fs::copy(&greeter, &first).unwrap();
    std::fs::copy(&greeter, &second).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
        .arg("dev")
        .args([&first, &second])
        .args(["--port", &free_port().to_string()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains(&format!(
            "{} and {} would both be deployment `greeter`",
            first.display(),
            second.display()
        )),
        "{said}"
    );
    assert!(!said.contains("starting a Temporal dev server"), "{said}");
}
