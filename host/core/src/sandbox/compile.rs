//! Compiling a tenant's component in a child process with its own limits.
//!
//! Cranelift's time and memory grow with what a component contains, and a
//! thread cannot be stopped halfway through a compile. So a host serving
//! uploads compiles each component in a child `corral` (`compile-worker`,
//! not shown in `--help`) that reads the component on stdin and writes the
//! compiled artifact on stdout: its writable memory is capped by
//! `RLIMIT_DATA`, what it writes by `RLIMIT_FSIZE`, its CPU by `RLIMIT_CPU`,
//! and it is killed when it passes its wall-clock time. Whatever the
//! component does to the compiler, the host's own memory and threads are
//! untouched and it serves on. The worker's stdin is the component's file
//! and its stdout the artifact's: the host holds neither in memory.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use wasmtime::Engine;

use super::config::{CompileLimits, wasm_config};
use super::limits::format_bytes;
use crate::session::cpu::GUEST_NICE;
use crate::shown::Shown;

/// Where a component's bytes are: in memory, or in a file (an upload or a
/// pull staged on disk, a stored version), which a compile worker reads
/// itself so the host never holds the whole component.
#[derive(Clone, Copy)]
pub(crate) enum ComponentBytes<'a> {
    Memory(&'a [u8]),
    File(&'a Path),
}

/// The most of a compiler's or a worker's words an error shows: they
/// quote the component (a name in it that is not kebab case), which a
/// tenant or a registry chose, so they are shown escaped and cut to this.
pub const MAX_REASON: usize = 2 << 10;

/// Why a compile in the worker produced nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    /// The component is not valid: the compiler's own words.
    #[error("{}", Shown(.0, MAX_REASON))]
    Invalid(String),
    #[error("compiling took longer than the host allows (compile_timeout = {})", humantime(*.0))]
    TooSlow(Duration),
    #[error("compiling needed more memory than the host allows (compile_memory = {})", format_bytes(*.0))]
    TooBig(u64),
    #[error("the compile worker failed: {}", Shown(.0, MAX_REASON))]
    Worker(String),
}

fn humantime(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// A compile worker, killed and reaped if the host gives up on it before
/// its end (an error, a panic): never left compiling on, nor unreaped.
struct Worker {
    child: std::process::Child,
    reaped: bool,
}

impl From<std::process::Child> for Worker {
    fn from(child: std::process::Child) -> Worker {
        Worker {
            child,
            reaped: false,
        }
    }
}

impl std::ops::Deref for Worker {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.child
    }
}

impl std::ops::DerefMut for Worker {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.child
    }
}

impl Worker {
    fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        let status = self.child.wait()?;
        self.reaped = true;
        Ok(status)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Blocks until child `pid` has exited, leaving it unreaped: its pid stays
/// its own (a kill cannot reach another process) until it is waited for.
fn exited_unreaped(pid: libc::id_t) {
    loop {
        // SAFETY: waitid writes only the siginfo it is given, which is
        // plain data that may be all zeroes.
        let ended = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT)
        };
        if ended == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// The worker's exit code for a component the compiler refused.
const INVALID: i32 = 3;
/// At most this much of the worker's stderr is read into a message.
const MAX_MESSAGE: u64 = 16 << 10;

/// Compiles `bytes` in a worker under `limits`, writing the artifact to
/// `artifact` (for `Component::deserialize_file` with an engine of
/// `max_wasm_stack`).
pub(crate) fn compile_in_worker(
    limits: &CompileLimits,
    max_wasm_stack: usize,
    bytes: ComponentBytes<'_>,
    artifact: &std::fs::File,
) -> Result<(), CompileError> {
    let worker_error = |what: &str, e: std::io::Error| CompileError::Worker(format!("{what}: {e}"));
    let cpu_seconds = limits.time.as_secs().saturating_add(1);
    let memory = limits.memory;
    let stdin = match bytes {
        ComponentBytes::Memory(_) => Stdio::piped(),
        ComponentBytes::File(path) => std::fs::File::open(path)
            .map(Stdio::from)
            .map_err(|e| worker_error(&format!("opening `{}`", path.display()), e))?,
    };
    let stdout = artifact
        .try_clone()
        .map(Stdio::from)
        .map_err(|e| worker_error("opening the artifact file", e))?;
    let mut command = Command::new(&limits.worker);
    command
        .arg("compile-worker")
        .arg("--max-wasm-stack")
        .arg(max_wasm_stack.to_string())
        .arg("--host-pid")
        .arg(std::process::id().to_string())
        .stdin(stdin)
        .stdout(stdout)
        .stderr(Stdio::piped())
        // Only the worker's own message, never the host's log settings.
        .env_remove("RUST_LOG");
    let host = std::process::id();
    // SAFETY: between fork and exec the closure calls only setrlimit, prctl,
    // getppid, getpriority and setpriority (system calls, async-signal-safe
    // in practice), and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            // The worker dies with the thread that waits for it, so with
            // the host: a host that exits mid-compile (its stop does not
            // wait for one) leaves no worker compiling on. A host already
            // gone before this line is the parent no more.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if u32::try_from(libc::getppid()).ok() != Some(host) {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            let cap = |resource, value: u64| {
                let limit = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                if libc::setrlimit(resource, &limit) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            };
            // Below the host's priority, as guests run: a tenant's uploads
            // (a compile may take minutes of CPU on several cores) take
            // the CPU the host's own work leaves. Refused, it compiles at
            // the host's.
            let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
            let _ = libc::setpriority(libc::PRIO_PROCESS, 0, (nice + GUEST_NICE).min(19));
            cap(libc::RLIMIT_DATA, memory)?;
            // The artifact is built in the worker's memory: it cannot be
            // larger, and a worker writing more is stopped (SIGXFSZ).
            cap(libc::RLIMIT_FSIZE, memory)?;
            cap(libc::RLIMIT_CPU, cpu_seconds)?;
            cap(libc::RLIMIT_CORE, 0)
        });
    }
    let mut child = Worker::from(
        command
            .spawn()
            .map_err(|e| worker_error(&format!("starting `{}`", limits.worker.display()), e))?,
    );
    let pid = child.id();

    // The wall clock: a watcher kills the worker at its deadline unless the
    // compile ends first. The worker is not reaped before the watcher is
    // done, so its pid cannot be reused under the kill.
    let (done, finished) = mpsc::channel::<()>();
    let time = limits.time;
    let watcher = std::thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(time) {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            return true;
        }
        false
    });

    let Some(stderr) = child.stderr.take() else {
        return Err(CompileError::Worker("its pipes were not opened".into()));
    };
    let message = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.take(MAX_MESSAGE).read_to_string(&mut text);
        text
    });
    // The worker reads all of its input before it writes anything, so
    // writing first cannot deadlock; a worker that died early breaks the
    // pipe, and its status says why.
    let fed = match (bytes, child.stdin.take()) {
        (ComponentBytes::Memory(bytes), Some(mut stdin)) => stdin.write_all(bytes),
        _ => Ok(()),
    };
    // Exited, not yet reaped: the watcher is done before the pid is freed.
    exited_unreaped(pid);
    let _ = done.send(());
    let killed = watcher.join().unwrap_or(false);
    let status = child.wait();
    let message = message.join().unwrap_or_default();
    let message = message.trim();
    let status = status.map_err(|e| worker_error("waiting for it", e))?;

    if killed || status.signal() == Some(libc::SIGXCPU) {
        return Err(CompileError::TooSlow(limits.time));
    }
    // Rust's allocation failure, the OS refusing a mapping (ENOMEM), or an
    // artifact over the size limit (EFBIG).
    if message.contains("memory allocation of")
        || message.contains("os error 12")
        || message.contains("os error 27")
        || status.signal() == Some(libc::SIGXFSZ)
    {
        return Err(CompileError::TooBig(limits.memory));
    }
    match status.code() {
        Some(0) => Ok(()),
        Some(INVALID) => Err(CompileError::Invalid(message.to_owned())),
        _ => {
            let fed = fed
                .err()
                .map(|e| format!(" (feeding it: {e})"))
                .unwrap_or_default();
            Err(CompileError::Worker(format!("{status}{fed}: {message}")))
        }
    }
}

/// `corral compile-worker`: stdin → compiled artifact on stdout. `host`
/// is the host that started it (`None`: started by hand).
pub fn worker_main(max_wasm_stack: usize, host: Option<u32>) -> ExitCode {
    // Again after exec, which clears it when it changes credentials (a
    // binary with file capabilities): the worker dies with its host.
    // SAFETY: prctl sets this process's own parent-death signal.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    // A host that died before that line (between exec and here) sent no
    // signal: its worker has another parent now, and stops.
    // SAFETY: getppid has no preconditions.
    let parent = u32::try_from(unsafe { libc::getppid() }).ok();
    if host.is_some_and(|host| parent != Some(host)) {
        eprintln!("the host that started this compile is gone");
        return ExitCode::FAILURE;
    }
    let mut bytes = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut bytes) {
        eprintln!("reading the component: {e}");
        return ExitCode::FAILURE;
    }
    let engine = match Engine::new(&wasm_config(max_wasm_stack)) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("creating the engine: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let artifact = match engine.precompile_component(&bytes) {
        Ok(artifact) => artifact,
        Err(e) => {
            eprintln!("{e:#}");
            return ExitCode::from(INVALID as u8);
        }
    };
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(&artifact).and_then(|()| out.flush()) {
        eprintln!("writing the artifact: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
