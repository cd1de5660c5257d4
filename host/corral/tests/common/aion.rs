//! A real Aion server (`aion server`, from `cargo install aion-cli`) on
//! loopback ports with its own home directory, and its CLI.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::processes::{free_port, spawn_watched, start_on_free_ports, stop};

/// The liveness window the test servers use, short so heartbeat tests are
/// (Aion's default is 30 s). Not shorter: a server that hears nothing from a
/// worker for a window declares it lost and fails its tasks, to be run
/// again; at 2 s, a loaded 2-core CI machine starved a debug `aion server`
/// or corral that long once, and a nap ran twice.
pub const HEARTBEAT_WINDOW_MS: u64 = 5000;

pub struct AionServer {
    pub grpc: u16,
    http: u16,
    home: PathBuf,
    child: Child,
    _dir: Option<tempfile::TempDir>,
}

impl AionServer {
    pub fn start() -> AionServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut server =
            start_on_free_ports(|| AionServer::try_start_in(dir.path(), free_port(), free_port()));
        server._dir = Some(dir);
        server
    }

    /// Starts (or restarts) a server whose state lives in `home`.
    pub fn start_in(home: &Path, grpc: u16, http: u16) -> AionServer {
        AionServer::try_start_in(home, grpc, http).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_start_in(home: &Path, grpc: u16, http: u16) -> Result<AionServer, String> {
        if Command::new("aion").arg("--version").output().is_err() {
            panic!(
                "the `aion` CLI is missing: cargo install aion-cli --locked --version 0.31.0 \
                 (tests/setup.sh installs it)"
            );
        }
        let config = home.join("server.toml");
        std::fs::write(
            &config,
            format!(
                "[worker]\nheartbeat_window = {HEARTBEAT_WINDOW_MS}\n[deploy]\nenabled = true\n"
            ),
        )
        .expect("write the server config");
        let earlier = incarnation(home).map(|record| record.pid);
        // `env` execs `aion`: the watchdog's signals reach the server.
        let args: Vec<String> = [
            &format!("AION_HOME={}", home.display()),
            "aion",
            "server",
            "--config",
            &config.display().to_string(),
            "--grpc-address",
            &format!("127.0.0.1:{grpc}"),
            "--listen-address",
            &format!("127.0.0.1:{http}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(home.join("server.log"))
            .expect("server log");
        let child = spawn_watched(
            "env",
            &args,
            Stdio::from(log.try_clone().expect("log")),
            Stdio::from(log),
        );
        let mut server = AionServer {
            grpc,
            http,
            home: home.to_owned(),
            child,
            _dir: None,
        };
        match server.wait_ready(earlier) {
            Ok(()) => Ok(server),
            Err(e) => {
                server.stop();
                Err(format!(
                    "the aion server on ports {grpc}/{http} {e}; its log:\n{}",
                    server.log()
                ))
            }
        }
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.grpc)
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    pub fn http(&self) -> u16 {
        self.http
    }

    /// Ready means this server's own record in its home (not whatever
    /// answers on the port) says it is a new incarnation serving on the
    /// asked-for address, and that address answers.
    fn wait_ready(&mut self, earlier: Option<u32>) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(90);
        let http = format!("127.0.0.1:{}", self.http);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited at start ({status})"));
            }
            let serving = incarnation(&self.home).is_some_and(|record| {
                Some(record.pid) != earlier
                    && record.state == "serving"
                    && record.http_address.as_deref() == Some(http.as_str())
            });
            if serving && live(self.http) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err("did not become ready in 90s".to_owned())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.home.join("server.log")).unwrap_or_default()
    }

    /// Runs the `aion` CLI against this server.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new("aion")
            .env("AION_HOME", &self.home)
            .args(["--endpoint", &self.address()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("the aion CLI runs")
    }

    /// `aion run FILE --input JSON`: deploys, starts and awaits a workflow.
    /// Returns the printed result document and the exit status.
    pub fn run(&self, awl: &Path, input: &str) -> (Option<Value>, Output) {
        let out = self.cli(&[
            "run",
            &awl.display().to_string(),
            "--input",
            input,
            "--timeout",
            "120s",
        ]);
        let json = serde_json::from_slice(&out.stdout).ok();
        (json, out)
    }

    /// Stops the server with SIGTERM (a drain), keeping its state.
    pub fn stop(&mut self) {
        stop(&mut self.child, Duration::from_secs(30));
    }
}

impl Drop for AionServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The part of the record a server keeps of itself in its home
/// (`run/aion-server.pid`) that readiness needs.
#[derive(serde::Deserialize)]
struct Incarnation {
    pid: u32,
    state: String,
    http_address: Option<String>,
}

fn incarnation(home: &Path) -> Option<Incarnation> {
    let text = std::fs::read_to_string(home.join("run").join("aion-server.pid")).ok()?;
    serde_json::from_str(&text).ok()
}

/// Whether the server's HTTP listener answers `/health/live` with 200.
fn live(port: u16) -> bool {
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /health/live HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200")
}

/// Writes an AWL document into `dir`.
pub fn awl(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(format!("{name}.awl"));
    std::fs::write(&path, text).expect("write the workflow");
    path
}
