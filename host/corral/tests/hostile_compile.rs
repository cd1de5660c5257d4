//! Attacks on the compiler: a tenant's upload that would take the host's
//! memory or time to compile is refused by the limits of the worker process
//! it compiles in (`host.compile_memory`, `host.compile_timeout`), with the
//! limit named, and the host serves on; a compile under way when the host
//! stops neither delays its exit nor outlives it. The expensive component
//! is the Python example: 18 MB of CPython that takes Cranelift about 15 s
//! and 380 MiB here.

mod common;

use std::time::{Duration, Instant};

use common::activities::text;
use common::admin::{Host, path};
use common::example;
use common::processes::{compile_workers, nice_of, state_and_parent};

/// How late a deadline may be met on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(8);

/// Deploys the Python example as tenant `alpha`; its refusal, and how long
/// the call took.
fn deploy_python(host: &Host) -> (String, Duration) {
    let started = Instant::now();
    let out = host.cli(
        &host.tokens[0].token,
        &["deploy", &path(&example("python-shout")), "--json"],
    );
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    (String::from_utf8_lossy(&out.stderr).into_owned(), took)
}

/// The host still serves: a small upload compiles and runs, and the
/// configured greeter answers through Temporal.
fn serves_on(host: &Host) {
    let deployed = host.alpha(&["deploy", &path(&example("echo")), "--json"]);
    assert_eq!(deployed["active"], true, "{deployed}");
    let greeted = host.run(
        0,
        "demo:greeter/api.greet",
        &[r#"{"name":"Ada","language":"english"}"#, r#""casual""#],
    );
    assert_eq!(greeted["result"]["message"], "Hi, Ada!", "{greeted}");
}

#[test]
fn a_compile_over_its_memory_is_refused_by_name_and_costs_the_host_nothing() {
    let host = Host::new("compile_memory = \"128MiB\"");
    let corral = host.serve(["", ""]);
    let before = corral.status_kib("VmHWM");
    let (said, _) = deploy_python(&host);
    assert!(said.contains("ResourceExhausted"), "{said}");
    assert!(
        said.contains("compile_memory = 128 MiB"),
        "the refusal names the limit: {said}"
    );
    // The upload (18 MB) is staged on disk as it arrives and the worker
    // reads it from there: the host holds a message at a time (this bound
    // was 150 MiB while uploads were held whole). Compiled in the host, it
    // would have taken 380 MiB more.
    let grew = corral.status_kib("VmHWM").saturating_sub(before);
    eprintln!("the host's peak memory grew by {grew} KiB");
    assert!(grew < 32 << 10, "the host's peak memory grew by {grew} KiB");
    serves_on(&host);
}

#[test]
fn a_compile_over_its_time_is_stopped_at_its_deadline_and_refused_by_name() {
    let host = Host::new("compile_timeout = \"1s\"");
    let _corral = host.serve(["", ""]);
    let (said, took) = deploy_python(&host);
    assert!(said.contains("ResourceExhausted"), "{said}");
    assert!(
        said.contains("compile_timeout = 1s"),
        "the refusal names the limit: {said}"
    );
    assert!(
        took < Duration::from_secs(1) + SLACK,
        "refused after {took:?}, not at its 1 s deadline"
    );
    serves_on(&host);
}

#[test]
fn a_compile_under_way_neither_holds_the_host_past_its_stop_nor_outlives_it() {
    let host = Host::new("compile_timeout = \"30s\"");
    let mut corral = host.serve(["", ""]);
    let pid = corral.pid();
    let deploy = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["deploy", &path(&example("python-shout"))])
        .env(
            "CORRAL_ENDPOINT",
            format!("http://127.0.0.1:{}", host.admin()),
        )
        .env("CORRAL_TOKEN", &host.tokens[0].token)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let worker = loop {
        let of_this_host = |worker: &u32| state_and_parent(*worker).is_some_and(|(_, p)| p == pid);
        if let Some(worker) = compile_workers().into_iter().find(of_this_host) {
            break worker;
        }
        assert!(Instant::now() < deadline, "no compile worker started");
        std::thread::sleep(Duration::from_millis(50));
    };
    // It compiles below the host's priority, as guests run.
    let (host_nice, worker_nice) = (nice_of(pid), nice_of(worker));
    assert_eq!(
        worker_nice,
        host_nice.map(|n| (n + 10).min(19)),
        "the compile worker's nice beside the host's"
    );
    // Held where it is: the compile outlasts the stop, however fast the
    // machine (until its 30 s deadline, when its host's watcher kills it).
    for (signal, whom) in [("-STOP", worker), ("-TERM", pid)] {
        let _ = std::process::Command::new("kill")
            .args([signal, &whom.to_string()])
            .status();
    }
    // Drained (nothing ran), and the upload's call given its 5 s.
    corral.await_logged("every accepted task was reported", 1);
    let stopped = Instant::now();
    let running = |pid| state_and_parent(pid).is_some_and(|(state, _)| state != 'Z');
    assert!(
        running(worker),
        "the compile worker is gone before the exit"
    );
    // Its own exit, seen in /proc (its watchdog shell notices it later).
    while running(pid) && stopped.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (took, exited) = (stopped.elapsed(), Instant::now());
    eprintln!("corral exited {took:?} after it said it stopped");
    // The worker is killed with the host, not left compiling on.
    while running(worker) {
        if exited.elapsed() > Duration::from_secs(1) {
            // Not left behind, stopped, by a failing run.
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &worker.to_string()])
                .status();
            panic!("the compile worker outlived corral by 1 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        corral.terminate(Duration::from_secs(10)),
        Some(0),
        "{}",
        corral.stderr()
    );
    // Not after the compile: exiting waited for it, up to its timeout. It
    // waits 1 s for what is left.
    assert!(
        took < Duration::from_secs(4),
        "corral exited {took:?} after it said it stopped"
    );
    // The upload was cut off, not stored, and its client says so.
    let out = deploy.wait_with_output().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(!out.stderr.is_empty(), "{}", text(&out));
}

/// A compile worker whose host died as it started (between the host's
/// check before exec and the worker setting its death signal again after)
/// has another parent: it stops instead of compiling on unwatched.
#[test]
fn a_compile_worker_whose_host_is_gone_stops_at_once() {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    // Its parent is this test, not the host it names.
    let mut worker = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["compile-worker", "--max-wasm-stack", "1048576"])
        .args(["--host-pid", &u32::MAX.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let component = std::fs::read(example("echo")).unwrap();
    // It may be gone before it reads a byte.
    let _ = worker.stdin.take().unwrap().write_all(&component);
    let out = worker.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("the host that started this compile is gone"),
        "{said}"
    );
}
