//! A corral host with two tenants and its admin API, for the control-plane
//! end-to-end tests.

use std::cell::Cell;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use super::activities::{execute, json_of, text, unique};
use super::example;
use super::processes::{Corral, free_port};
use super::temporal::TemporalServer;

/// A token and its hash, from `corral token --json`.
pub struct Token {
    pub token: String,
    pub sha256: String,
}

pub fn token() -> Token {
    let out = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["token", "--json"])
        .output()
        .expect("corral token runs");
    let v = json_of(&out);
    let token = v["token"].as_str().expect("a token").to_owned();
    let sha256 = v["sha256"].as_str().expect("a hash").to_owned();
    assert_eq!(sha256.len(), 64);
    Token { token, sha256 }
}

/// One host with two tenants (`alpha`, `beta`) on their own queues, an
/// admin API, a metrics endpoint and a data directory that outlives it.
pub struct Host {
    pub server: TemporalServer,
    pub data: tempfile::TempDir,
    admin: Cell<u16>,
    metrics: Cell<u16>,
    pub queues: [String; 2],
    pub tokens: [Token; 2],
    pub operator: Token,
    pub extra: String,
}

impl Host {
    pub fn new(extra_host: &str) -> Host {
        Host {
            server: TemporalServer::start(),
            data: tempfile::tempdir().expect("tempdir"),
            admin: Cell::new(free_port()),
            metrics: Cell::new(free_port()),
            queues: [unique("alpha"), unique("beta")],
            tokens: [token(), token()],
            operator: token(),
            extra: extra_host.to_owned(),
        }
    }

    pub fn config(&self, tenant_extra: [&str; 2]) -> String {
        let greeter = format!("{:?}", example("greeter").display().to_string());
        let mut text = format!(
            r#"
[host]
max_concurrent = 8
shutdown_grace = "5s"
admin_listen = "127.0.0.1:{admin}"
metrics_listen = "127.0.0.1:{metrics}"
data_dir = {data:?}
operator_token_sha256 = "{operator}"
{extra}
"#,
            admin = self.admin(),
            metrics = self.metrics(),
            data = self.data.path().display().to_string(),
            operator = self.operator.sha256,
            extra = self.extra,
        );
        for (i, name) in ["alpha", "beta"].iter().enumerate() {
            text.push_str(&format!(
                r#"
[[tenant]]
name = "{name}"
token_sha256 = "{hash}"
temporal = {{ address = "http://{address}", namespace = "default", task_queue = "{queue}" }}
limits = {{ memory = "64MiB", timeout = "30s", max_concurrent = 4 }}
components = [{greeter}]
{tenant_extra}
"#,
                hash = self.tokens[i].sha256,
                address = self.server.address(),
                queue = self.queues[i],
                tenant_extra = tenant_extra[i],
            ));
        }
        text
    }

    /// Serves this host's configuration. A port free when chosen can be
    /// taken by another test's server before corral binds it: then the
    /// admin and metrics ports are chosen again, up to three times.
    pub fn serve(&self, tenant_extra: [&str; 2]) -> Corral {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Corral::try_serve(&self.config(tenant_extra)) {
                Ok(corral) => return corral,
                Err(stderr) if stderr.contains("Address already in use") => {
                    failures.push(stderr);
                    self.admin.set(free_port());
                    self.metrics.set(free_port());
                }
                Err(stderr) => panic!("corral serve did not become ready:\n{stderr}"),
            }
        }
        panic!(
            "corral serve did not become ready:\n{}",
            failures.join("\n")
        );
    }

    /// The admin API's port.
    pub fn admin(&self) -> u16 {
        self.admin.get()
    }

    /// The `/metrics` port.
    pub fn metrics(&self) -> u16 {
        self.metrics.get()
    }

    /// `corral <args>` against this host with `token`.
    pub fn cli(&self, token: &str, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(args)
            .env(
                "CORRAL_ENDPOINT",
                format!("http://127.0.0.1:{}", self.admin()),
            )
            .env("CORRAL_TOKEN", token)
            .output()
            .expect("corral runs")
    }

    /// As tenant `alpha`, expecting success; the JSON output.
    pub fn alpha(&self, args: &[&str]) -> Value {
        let out = self.cli(&self.tokens[0].token, args);
        assert!(out.status.success(), "corral {args:?}: {}", text(&out));
        json_of(&out)
    }

    pub fn run(&self, queue: usize, ty: &str, inputs: &[&str]) -> Value {
        execute(&self.server, &self.queues[queue], ty, inputs, &[]).1
    }

    pub fn scrape(&self) -> String {
        super::processes::scrape(self.metrics())
    }

    /// `config` with alpha's configured greeter at `greeter` instead (a
    /// copy, signed beside it).
    pub fn alpha_greeter(config: &str, greeter: &Path) -> String {
        config.replacen(
            &format!("{:?}", example("greeter").display().to_string()),
            &format!("{:?}", greeter.display().to_string()),
            1,
        )
    }
}

pub fn path(p: &Path) -> String {
    p.display().to_string()
}
