//! The host's file descriptors: a guest's open files are the host process's
//! own, so `corral serve` raises its soft limit to the hard one and names a
//! configuration whose tasks could hold them all.

mod common;

use common::admin::Host;

/// Sets this process's open-file limit; its children inherit it.
fn set_open_files(soft: u64, hard: u64) {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `limit` is a valid `rlimit`.
    let set = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    assert_eq!(set, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

fn hard_open_files() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable `rlimit`.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(got, 0, "getrlimit: {}", std::io::Error::last_os_error());
    limit.rlim_max
}

/// This binary's only test: it lowers its own limit, which the Temporal
/// server and corral inherit.
#[test]
fn serve_raises_its_open_file_limit_and_names_a_worst_case_that_does_not_fit() {
    // A soft limit of 256 under a hard one of (at most) 4096: two tenants of
    // 4 tasks on 8 host slots, 1024 handles each, may hold 8192.
    let hard = hard_open_files().min(4096);
    set_open_files(256, hard);
    let host = Host::new("");
    let corral = host.serve(["", ""]);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", corral.pid()))
        .unwrap_or_else(|e| panic!("corral's limits: {e}"));
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("no open-file limit in:\n{limits}"));
    let soft_and_hard: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    let expected = hard.to_string();
    assert_eq!(soft_and_hard, [&expected, &expected], "{line}");
    let log = corral.stderr();
    assert!(
        log.contains(&format!("raised the open-file limit from 256 to {hard}")),
        "{log}"
    );
    assert!(
        log.contains("may hold up to 8192 open files")
            && log.contains(&format!("may open {hard} (hard limit {hard})")),
        "{log}"
    );
}
