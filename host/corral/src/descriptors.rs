//! File descriptors. A guest's open files and directories are the host
//! process's own descriptors, so tasks that together hold as many as the
//! process may open leave none for the host (its engine connections, its
//! compile workers, the admin API, the store) or for another tenant's
//! tasks. `corral serve` raises its soft limit to the hard one at start
//! (the kernel's default soft limit, often 1024, is a convention for
//! programs that use `select`, which corral does not), and says so when
//! the worst case its configuration allows does not fit under it.
//!
//! This is a check of the configuration, not a bound enforced while tasks
//! run: `docs/threat-model.md` says so.

use crate::config::Config;

/// Descriptors kept for the host's own use beyond its guests': engine
/// connections, admin API and `/metrics` connections (48 at most), compile
/// workers' pipes, the store's files, the log.
pub const HOST_RESERVE: u64 = 1024;

/// The soft limit set when the hard one is unlimited (Linux's default
/// `fs.nr_open`, above which `setrlimit` fails).
const UNLIMITED_SOFT: u64 = 1 << 20;

/// The process's open-file limit, before and after [`raise`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub before: u64,
    pub now: u64,
    pub hard: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit.
pub fn raise() -> std::io::Result<Limit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable `rlimit`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let (before, hard) = (limit.rlim_cur, limit.rlim_max);
    let wanted = if hard == libc::RLIM_INFINITY {
        UNLIMITED_SOFT
    } else {
        hard
    };
    if before >= wanted {
        return Ok(Limit {
            before,
            now: before,
            hard,
        });
    }
    let raised = libc::rlimit {
        rlim_cur: wanted,
        rlim_max: hard,
    };
    // SAFETY: `raised` is a valid `rlimit`; only the soft limit changes,
    // to at most the hard one.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Limit {
        before,
        now: wanted,
        hard,
    })
}

/// The most descriptors the configuration lets guests hold at once, and
/// the host's reserve: every task that may run at once (the host's slots,
/// or all the tenants' together if fewer) holding its tenant's
/// `max_handles` (the largest any tenant has), each handle a descriptor.
/// A warm instance between tasks holds only its output streams.
pub fn worst_case(config: &Config) -> u64 {
    let tenants: usize = config.tenants.iter().map(|t| t.max_concurrent).sum();
    let tasks = config.host.max_concurrent.min(tenants);
    let handles = config.largest(|limits| limits.max_handles);
    (tasks as u64)
        .saturating_mul(handles as u64)
        .saturating_add(HOST_RESERVE)
}

/// Raises the limit and logs what it found: a warning, naming the numbers
/// and what to change, when the worst case does not fit.
pub fn prepare(config: &Config) {
    let worst = worst_case(config);
    match raise() {
        Ok(limit) => {
            if limit.now > limit.before {
                tracing::info!(
                    "raised the open-file limit from {} to {} (its hard limit)",
                    limit.before,
                    limit.now
                );
            }
            if worst > limit.now {
                tracing::warn!(
                    "the tenants' tasks may hold up to {} open files and directories, with {} \
                     kept for the host, but this process may open {} (hard limit {}): one \
                     tenant's tasks holding files could leave none for the host or the others. \
                     Lower limits.max_handles or max_concurrent, or raise the hard limit \
                     (systemd: LimitNOFILE=)",
                    worst - HOST_RESERVE,
                    HOST_RESERVE,
                    limit.now,
                    limit.hard
                );
            }
        }
        Err(e) => tracing::warn!("cannot raise the open-file limit: {e}"),
    }
}
