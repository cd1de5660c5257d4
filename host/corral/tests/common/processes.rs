//! Real processes for end-to-end tests: a Temporal dev server and the
//! `corral` binary, on free loopback ports, cleaned up when dropped (and
//! when the test process dies, through a watchdog).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::open_fds;

/// A free TCP port on 127.0.0.1 (free when asked; the OS may reuse it later,
/// which is unlikely within a test).
pub fn free_port() -> u16 {
    corral::dev_server::free_loopback_port().expect("bind 127.0.0.1:0")
}

/// Starts a server on fresh free ports, up to three times: a port free when
/// chosen can be taken (by another test's server) before the server binds
/// it, and then the server exits at start. Panics with every attempt's
/// failure.
pub fn start_on_free_ports<T>(mut start: impl FnMut() -> Result<T, String>) -> T {
    let mut failures = Vec::new();
    for _ in 0..3 {
        match start() {
            Ok(server) => return server,
            Err(e) => failures.push(e),
        }
    }
    panic!("{}", failures.join("\n"));
}

/// Runs `program args…` under a shell watchdog that kills it when this test
/// process exits, however it exits.
pub fn spawn_watched(program: &str, args: &[String], stdout: Stdio, stderr: Stdio) -> Child {
    spawn_watched_in(None, program, args, stdout, stderr)
}

/// [`spawn_watched`] in directory `cwd`.
pub fn spawn_watched_in(
    cwd: Option<&Path>,
    program: &str,
    args: &[String],
    stdout: Stdio,
    stderr: Stdio,
) -> Child {
    spawn_watched_with(cwd, &[], program, args, stdout, stderr)
}

/// [`spawn_watched_in`], with `env` set for the program.
pub fn spawn_watched_with(
    cwd: Option<&Path>,
    env: &[(&str, &str)],
    program: &str,
    args: &[String],
    stdout: Stdio,
    stderr: Stdio,
) -> Child {
    let quote = |a: &str| format!("'{}'", a.replace('\'', r"'\''"));
    let quoted: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("{k}={}", quote(v)))
        .chain(
            std::iter::once(program.to_owned())
                .chain(args.iter().cloned())
                .map(|a| quote(&a)),
        )
        .collect();
    let script = format!(
        "{} & child=$!; trap 'kill -TERM $child 2>/dev/null; wait $child; exit $?' TERM INT; \
         while kill -0 {} 2>/dev/null && kill -0 $child 2>/dev/null; do sleep 0.5; done; \
         kill -TERM $child 2>/dev/null; sleep 2; kill -KILL $child 2>/dev/null; wait $child",
        quoted.join(" "),
        std::process::id()
    );
    let mut shell = Command::new("sh");
    if let Some(cwd) = cwd {
        shell.current_dir(cwd);
    }
    shell
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program}: {e}"))
}

pub fn stop(child: &mut Child, grace: Duration) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .stderr(Stdio::null())
        .status();
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The compile workers (`corral compile-worker`) running now, of any host.
pub fn compile_workers() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmdline.split(|b| *b == 0).any(|a| a == b"compile-worker")
        })
        .collect()
}

/// A process's state letter (`R`, `S`, `T`, `Z`…) and its parent's pid;
/// `None` once it is gone.
pub fn state_and_parent(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's name, which may hold spaces, in parentheses.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// A process's nice value (its main thread's); `None` once it is gone.
pub fn nice_of(pid: u32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The 19th field: the 17th after the command's name.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(16)?
        .parse()
        .ok()
}

/// Serves `serve` on a free loopback port, on a thread and runtime of its
/// own, for the life of the test process: a peer the test plays (a trace
/// receiver, a hostile engine). Its port.
pub fn loopback_peer<F, Fut>(serve: F) -> u16
where
    F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            serve(tokio::net::TcpListener::from_std(listener).unwrap()).await;
        });
    });
    port
}

/// How long [`serve_to_exit`] waits for corral to exit.
const EXIT_WITHIN: Duration = Duration::from_secs(120);

/// `corral serve` on `config`, written to a temporary directory (its
/// relative paths are under it), run to its exit. A corral that has not
/// exited within [`EXIT_WITHIN`] is killed and fails the test with what it
/// printed: a hang is this test's failure, not CI's time limit.
pub fn serve_to_exit(config: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("corral.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["serve", "--config", &path.display().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    /// All of a pipe, read on a thread of its own.
    fn drain(mut pipe: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    }
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let deadline = Instant::now() + EXIT_WITHIN;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let said = stderr.join().unwrap_or_default();
            panic!(
                "corral serve did not exit within {EXIT_WITHIN:?}:\n{}",
                String::from_utf8_lossy(&said)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// The start of the line [`forgery`] forges in corral's log.
pub const FORGED_AT: &str = "2026-12-05T05:30:00";

/// Text a caller chooses to forge a line in corral's log: `start`, a
/// newline, a line in corral's own format with a terminal escape, then
/// `filler` bytes of `x`.
pub fn forgery(start: &str, filler: usize) -> String {
    format!(
        "{start}\n{FORGED_AT}.000000Z ERROR corral::control: FORGED wiping data_dir{}[2J{}",
        '\u{1b}',
        "x".repeat(filler)
    )
}

/// `corral serve` (or `corral dev`), its output collected.
pub struct Corral {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

/// Collects a pipe's lines; signals `ready` at the line saying so.
fn collect(
    pipe: impl std::io::Read + Send + 'static,
    ready: std::sync::mpsc::Sender<()>,
) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if line.contains("corral: ready") {
                let _ = ready.send(());
            }
            sink.lock().unwrap().push(line);
        }
    });
    lines
}

impl Corral {
    /// Writes `config` (TOML) to a file and serves it until "ready".
    pub fn serve(config: &str) -> Corral {
        Corral::try_serve(config)
            .unwrap_or_else(|stderr| panic!("corral serve did not become ready:\n{stderr}"))
    }

    /// [`Corral::serve`], or what corral said when it did not become ready.
    pub fn try_serve(config: &str) -> Result<Corral, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("corral.toml");
        std::fs::write(&path, config).expect("write config");
        let args = [
            "serve".into(),
            "--config".into(),
            path.display().to_string(),
        ];
        Corral::try_start_with(None, &[], &args, dir)
    }

    /// Runs `corral <args>` until it says it is ready.
    pub fn start(args: &[String], dir: tempfile::TempDir) -> Corral {
        Corral::start_in(None, args, dir)
    }

    /// Runs `corral <args>` in directory `cwd` until it says it is ready.
    pub fn start_in(cwd: Option<&Path>, args: &[String], dir: tempfile::TempDir) -> Corral {
        Corral::start_with(cwd, &[], args, dir)
    }

    /// Serves `config` with `env` set (e.g. `CORRAL_LOG`).
    pub fn serve_with(env: &[(&str, &str)], config: &str) -> Corral {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("corral.toml");
        std::fs::write(&path, config).expect("write config");
        let args = [
            "serve".into(),
            "--config".into(),
            path.display().to_string(),
        ];
        Corral::start_with(None, env, &args, dir)
    }

    /// Runs `corral <args>` in `cwd` with `env` set, until it says it is
    /// ready.
    pub fn start_with(
        cwd: Option<&Path>,
        env: &[(&str, &str)],
        args: &[String],
        dir: tempfile::TempDir,
    ) -> Corral {
        Corral::try_start_with(cwd, env, args, dir)
            .unwrap_or_else(|stderr| panic!("corral serve did not become ready:\n{stderr}"))
    }

    /// [`Corral::start_with`], or what corral said when it did not become
    /// ready.
    pub fn try_start_with(
        cwd: Option<&Path>,
        env: &[(&str, &str)],
        args: &[String],
        dir: tempfile::TempDir,
    ) -> Result<Corral, String> {
        let (corral, ready) = Corral::spawn(cwd, env, args, dir);
        if ready.recv_timeout(Duration::from_secs(90)).is_err() {
            return Err(corral.stderr());
        }
        Ok(corral)
    }

    /// `corral serve --config /etc/corral/corral.toml` from the root file
    /// system at `rootfs` (in a `chroot`, as `user` `uid:gid`), until it
    /// says it is ready.
    pub fn start_chrooted(rootfs: &Path, user: &str) -> Corral {
        let dir = tempfile::tempdir().expect("tempdir");
        let args = [
            format!("--userspec={user}"),
            rootfs.display().to_string(),
            "/usr/local/bin/corral".to_owned(),
            "serve".to_owned(),
            "--config".to_owned(),
            "/etc/corral/corral.toml".to_owned(),
        ];
        let (corral, ready) = Corral::spawn_program(None, &[], "chroot", &args, dir);
        if ready.recv_timeout(Duration::from_secs(90)).is_err() {
            panic!(
                "corral did not become ready in its chroot:\n{}",
                corral.stderr()
            );
        }
        corral
    }

    /// Writes `config` to a file and starts serving it, without waiting
    /// for it to be ready (for what it says while it starts).
    pub fn launch(config: &str) -> Corral {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("corral.toml");
        std::fs::write(&path, config).expect("write config");
        let args = [
            "serve".into(),
            "--config".into(),
            path.display().to_string(),
        ];
        Corral::spawn(None, &[], &args, dir).0
    }

    /// Starts `corral <args>`; the receiver hears when it says it is ready.
    fn spawn(
        cwd: Option<&Path>,
        env: &[(&str, &str)],
        args: &[String],
        dir: tempfile::TempDir,
    ) -> (Corral, std::sync::mpsc::Receiver<()>) {
        Corral::spawn_program(cwd, env, env!("CARGO_BIN_EXE_corral"), args, dir)
    }

    /// Starts `program <args>` (corral, or what execs it).
    fn spawn_program(
        cwd: Option<&Path>,
        env: &[(&str, &str)],
        program: &str,
        args: &[String],
        dir: tempfile::TempDir,
    ) -> (Corral, std::sync::mpsc::Receiver<()>) {
        let mut child = spawn_watched_with(cwd, env, program, args, Stdio::piped(), Stdio::piped());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let stdout = collect(
            child.stdout.take().expect("stdout is piped"),
            ready_tx.clone(),
        );
        let stderr = collect(child.stderr.take().expect("stderr is piped"), ready_tx);
        let corral = Corral {
            child,
            stdout,
            stderr,
            _dir: dir,
        };
        (corral, ready_rx)
    }

    /// Waits (at most 90 s) until corral has logged `line` `times` times:
    /// its own account of an event, not a guess at how long one takes.
    pub fn await_logged(&self, line: &str, times: usize) {
        let deadline = Instant::now() + Duration::from_secs(90);
        while self.stderr().matches(line).count() < times {
            assert!(
                Instant::now() < deadline,
                "`{line}` not logged {times} times:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits (at most 90 s) until corral has printed `text` on stdout: its
    /// stdout is read by a thread of its own, which may still be behind the
    /// "ready" line on stderr.
    pub fn await_printed(&self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(90);
        while !self.stdout().contains(text) {
            assert!(
                Instant::now() < deadline,
                "`{text}` not printed:\n{}\n{}",
                self.stdout(),
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Everything corral wrote to stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().join("\n")
    }

    /// Everything corral wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// Asserts that a [`forgery`] left no line of its own in corral's log,
    /// no terminal escape, and no run of `kept` bytes of its filler.
    pub fn assert_not_forged(&self, kept: usize) {
        let log = self.stderr();
        assert!(
            !log.lines().any(|line| line.starts_with(FORGED_AT)),
            "a forged line in the host's log:\n{log}"
        );
        assert!(!log.contains('\u{1b}'), "an escape in the host's log");
        assert!(
            !log.contains(&"x".repeat(kept)),
            "the caller's text whole in the host's log"
        );
    }

    /// The process id of corral itself (the child of its watchdog shell).
    pub fn pid(&self) -> u32 {
        let shell = self.child.id();
        let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children"))
            .unwrap_or_else(|e| panic!("the watchdog shell's children: {e}"));
        // The shell also runs its `sleep`s: find corral by name.
        children
            .split_whitespace()
            .filter_map(|pid| pid.parse().ok())
            .find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.trim() == "corral")
            })
            .unwrap_or_else(|| panic!("the watchdog shell runs no corral: `{children}`"))
    }

    /// A line of corral's `/proc/<pid>/status` in KiB (`VmHWM`, `VmRSS`).
    pub fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .unwrap_or_else(|e| panic!("corral's status: {e}"));
        status
            .lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in corral's status"))
    }

    /// How many file descriptors corral holds open.
    pub fn open_fds(&self) -> usize {
        open_fds(&self.pid().to_string())
    }

    /// Sends SIGTERM to corral (through its watchdog) and waits for it.
    pub fn terminate(&mut self, grace: Duration) -> Option<i32> {
        stop(&mut self.child, grace);
        self.child.try_wait().ok().flatten().and_then(|s| s.code())
    }
}

impl Drop for Corral {
    fn drop(&mut self) {
        stop(&mut self.child, Duration::from_secs(15));
    }
}

/// `GET /metrics` from a corral on `port`.
pub fn scrape(port: u16) -> String {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())",
            &format!("http://127.0.0.1:{port}/metrics"),
        ])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of one sample line (`name{labels}`) in a Prometheus scrape.
pub fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}
