//! A real OCI registry for end-to-end tests: Debian's `docker-registry`
//! (distribution 2.8) on a free loopback port, storing in a temp dir,
//! stopped when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use super::processes::{free_port, spawn_watched, start_on_free_ports, stop};

pub struct Registry {
    child: Child,
    port: u16,
    _storage: tempfile::TempDir,
}

impl Registry {
    pub fn start() -> Registry {
        start_on_free_ports(|| {
            let storage = tempfile::tempdir().expect("tempdir");
            let port = free_port();
            let config = storage.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                     http:\n  addr: 127.0.0.1:{port}\n",
                    storage.path().join("data").display()
                ),
            )
            .expect("write the registry's config");
            let mut child = spawn_watched(
                "docker-registry",
                &["serve".into(), config.display().to_string()],
                Stdio::null(),
                Stdio::piped(),
            );
            // Ready once it says it listens (its own log line). Its log is
            // drained to the end: a Go program dies writing to a closed pipe.
            let stderr = child.stderr.take().expect("stderr is piped");
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    let listening = line.contains("listening on");
                    let _ = tx.send((line, listening));
                }
            });
            let mut said = Vec::new();
            while let Ok((line, listening)) = rx.recv_timeout(Duration::from_secs(30)) {
                said.push(line);
                if listening {
                    return Ok(Registry {
                        child,
                        port,
                        _storage: storage,
                    });
                }
            }
            stop(&mut child, Duration::from_secs(5));
            Err(format!(
                "docker-registry did not start:\n{}",
                said.join("\n")
            ))
        })
    }

    /// `127.0.0.1:<port>`: the registry part of a reference.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        stop(&mut self.child, Duration::from_secs(5));
    }
}
