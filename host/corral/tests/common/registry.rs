//! A real OCI registry for end-to-end tests: Debian's `docker-registry`
//! (distribution 2.8) on a free loopback port, storing in a temp dir,
//! stopped when dropped.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use super::activities::text;
use super::processes::{free_port, spawn_watched, start_on_free_ports, stop};

pub struct Registry {
    child: Child,
    port: u16,
    storage: tempfile::TempDir,
}

impl Registry {
    pub fn start() -> Registry {
        Registry::start_with(None)
    }

    /// A registry that demands HTTP basic authentication as `user`
    /// (`htpasswd`, from Debian's apache2-utils, writes its bcrypt file).
    pub fn start_with_auth(user: &str, password: &str) -> Registry {
        Registry::start_with(Some((user, password)))
    }

    fn start_with(auth: Option<(&str, &str)>) -> Registry {
        start_on_free_ports(|| {
            let storage = tempfile::tempdir().expect("tempdir");
            let port = free_port();
            let config = storage.path().join("config.yml");
            let mut text = format!(
                "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: 127.0.0.1:{port}\n",
                storage.path().join("data").display()
            );
            if let Some((user, password)) = auth {
                let out = std::process::Command::new("htpasswd")
                    .args(["-Bbn", user, password])
                    .output()
                    .expect("htpasswd runs (apt-get install apache2-utils)");
                assert!(out.status.success());
                let file = storage.path().join("htpasswd");
                std::fs::write(&file, &out.stdout).expect("write htpasswd");
                text.push_str(&format!(
                    "auth:\n  htpasswd:\n    realm: corral-test\n    path: {}\n",
                    file.display()
                ));
            }
            std::fs::write(&config, text).expect("write the registry's config");
            match listening(&config) {
                (Some(child), _) => Ok(Registry {
                    child,
                    port,
                    storage,
                }),
                (None, said) => Err(format!("docker-registry did not start:\n{said}")),
            }
        })
    }

    /// Stops the registry: clients now find nothing on its port.
    pub fn stop(&mut self) {
        stop(&mut self.child, Duration::from_secs(5));
    }

    /// Starts it again on the same port, with what it stored.
    pub fn restart(&mut self) {
        let (child, said) = listening(&self.storage.path().join("config.yml"));
        self.child = child.unwrap_or_else(|| panic!("docker-registry did not restart:\n{said}"));
    }

    /// `127.0.0.1:<port>`: the registry part of a reference.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `corral push FILE REFERENCE` to this (plain-HTTP, password-less)
    /// registry, asserting it succeeded; the manifest digest it printed.
    pub fn push(&self, file: &Path, reference: &str) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(["push", &file.display().to_string(), reference])
            .args(["--insecure-registry", &self.host()])
            .env_remove("CORRAL_REGISTRY_USERNAME")
            .env_remove("CORRAL_REGISTRY_PASSWORD")
            .output()
            .expect("corral runs");
        assert!(out.status.success(), "push: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("pushed {reference} (")))
            .and_then(|d| d.strip_suffix(')'))
            .unwrap_or_else(|| panic!("no digest in: {}", text(&out)))
            .to_owned()
    }

    /// oci-client, speaking plain HTTP to this registry: another tool.
    pub fn client(&self) -> Client {
        corral::oci::tls_provider();
        Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(vec![self.host()]),
            ..ClientConfig::default()
        })
    }

    /// Pushes, as another tool would, an artifact that is not a component
    /// (one `text/plain` layer) to `repository:tag`.
    pub fn push_not_a_component(&self, repository_tag: &str) {
        let reference: Reference = format!("{}/{repository_tag}", self.host())
            .parse()
            .expect("a reference");
        block_on(self.client().push(
            &reference,
            &[ImageLayer::new(
                b"just text".to_vec(),
                "text/plain".into(),
                None,
            )],
            Config::new(
                b"{}".to_vec(),
                "application/vnd.oci.image.config.v1+json".into(),
                None,
            ),
            &RegistryAuth::Anonymous,
            None,
        ))
        .expect("the registry takes any artifact");
    }
}

/// Drives one oci-client call from a synchronous test.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(future)
}

/// Starts `docker-registry serve config` until it says it listens (its own
/// log line); its log is drained to the end, since a Go program dies
/// writing to a closed pipe. The child, or what it said before it failed.
fn listening(config: &Path) -> (Option<Child>, String) {
    let mut child = spawn_watched(
        "docker-registry",
        &["serve".into(), config.display().to_string()],
        Stdio::null(),
        Stdio::piped(),
    );
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
            return (Some(child), String::new());
        }
    }
    stop(&mut child, Duration::from_secs(5));
    (None, said.join("\n"))
}

impl Drop for Registry {
    fn drop(&mut self) {
        stop(&mut self.child, Duration::from_secs(5));
    }
}
