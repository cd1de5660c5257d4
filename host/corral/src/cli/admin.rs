//! The admin API's command line: `ls`, `describe`, `rm`, `activate`,
//! `invoke`, and the local `token` (`deploy`: `deploy.rs`; `status`:
//! `status.rs`). Tables for people,
//! `--json` for scripts. Exit codes: 0 done, 1 an invoked activity failed,
//! 2 the call was refused (the gRPC status and its message are printed).

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{Value, json};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Status};

use corral::control::proto::{self, admin_client::AdminClient, run_response};
use corral::token::generate_token;

use super::usage_error;

/// How to reach and authenticate to a host.
#[derive(clap::Args)]
pub struct Conn {
    /// The admin API's address.
    #[arg(long, env = "CORRAL_ENDPOINT", default_value = "http://127.0.0.1:7466")]
    endpoint: String,
    /// The bearer token (prefer the environment variable: command lines are visible to others).
    #[arg(long, env = "CORRAL_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The tenant to act on (required with the operator's token).
    #[arg(long)]
    tenant: Option<String>,
    /// A PEM CA certificate to trust for an https endpoint.
    #[arg(long, value_name = "FILE")]
    ca_cert: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(clap::Args)]
pub struct ConnOnly {
    #[command(flatten)]
    pub(super) conn: Conn,
}

#[derive(clap::Args)]
pub struct DigestArgs {
    #[command(flatten)]
    conn: Conn,
    /// `sha256:<hex>`, or at least 8 hex digits of it.
    digest: String,
}

#[derive(clap::Args)]
pub struct RemoveArgs {
    #[command(flatten)]
    conn: Conn,
    digest: String,
    /// Also remove the active version, which stops serving its activity types.
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args)]
pub struct InvokeArgs {
    #[command(flatten)]
    conn: Conn,
    /// The activity type (full name or alias).
    activity_type: String,
    /// One JSON value per parameter.
    args: Vec<String>,
}

#[derive(clap::Args)]
pub struct TokenArgs {
    /// Print `{"token":…,"sha256":…}`.
    #[arg(long)]
    json: bool,
}

/// Why the admin API could not be called.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnError {
    #[error("--endpoint `{endpoint}`: {source}")]
    Endpoint {
        endpoint: String,
        source: tonic::transport::Error,
    },
    #[error("--ca-cert `{}`: {source}", path.display())]
    CaCert {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("TLS for `{endpoint}`: {source}")]
    Tls {
        endpoint: String,
        source: tonic::transport::Error,
    },
    #[error("cannot reach the admin API at {endpoint}: {source}")]
    Unreachable {
        endpoint: String,
        source: tonic::transport::Error,
    },
    #[error("no token: set CORRAL_TOKEN (or pass --token)")]
    NoToken,
    #[error("the token has characters a header cannot carry")]
    TokenCharacters,
}

impl Conn {
    pub(super) async fn client(&self) -> Result<AdminClient<Channel>, ConnError> {
        let endpoint_error = |source| ConnError::Endpoint {
            endpoint: self.endpoint.clone(),
            source,
        };
        let mut endpoint = Endpoint::from_shared(self.endpoint.clone()).map_err(endpoint_error)?;
        if self.endpoint.starts_with("https://") {
            let mut tls = ClientTlsConfig::new().with_enabled_roots();
            if let Some(ca) = &self.ca_cert {
                let pem = std::fs::read(ca).map_err(|source| ConnError::CaCert {
                    path: ca.clone(),
                    source,
                })?;
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            endpoint = endpoint.tls_config(tls).map_err(|source| ConnError::Tls {
                endpoint: self.endpoint.clone(),
                source,
            })?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|source| ConnError::Unreachable {
                endpoint: self.endpoint.clone(),
                source,
            })?;
        Ok(AdminClient::new(channel).max_decoding_message_size(64 << 20))
    }

    pub(super) fn request<T>(&self, message: T) -> Result<Request<T>, ConnError> {
        let mut request = Request::new(message);
        let Some(token) = &self.token else {
            return Err(ConnError::NoToken);
        };
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| ConnError::TokenCharacters)?;
        request.metadata_mut().insert("authorization", value);
        Ok(request)
    }

    pub(super) fn tenant(&self) -> String {
        self.tenant.clone().unwrap_or_default()
    }
}

pub(super) fn refused(status: &Status) -> ExitCode {
    usage_error(format!("{:?}: {}", status.code(), status.message()))
}

macro_rules! call {
    ($conn:expr, $method:ident, $message:expr) => {{
        let mut client = match $conn.client().await {
            Ok(client) => client,
            // With its causes: tonic's own text is only "transport error".
            Err(e) => return $crate::cli::error_exit(&e),
        };
        let request = match $conn.request($message) {
            Ok(request) => request,
            Err(e) => return $crate::cli::error_exit(&e),
        };
        match client.$method(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return $crate::cli::admin::refused(&status),
        }
    }};
}
pub(super) use call;

pub async fn list(args: ConnOnly) -> ExitCode {
    let request = proto::ListRequest {
        tenant: args.conn.tenant(),
    };
    let response = call!(args.conn, list, request);
    if args.conn.json {
        let all: Vec<Value> = response.components.iter().map(component_json).collect();
        println!("{}", Value::Array(all));
        return ExitCode::SUCCESS;
    }
    println!(
        "{:<12} {:<20} {:<8} {:>10}  {:<20} {:<16} DIGEST",
        "TENANT", "DEPLOYMENT", "ACTIVE", "SIZE", "UPLOADED", "SIGNER"
    );
    for c in &response.components {
        println!(
            "{:<12} {:<20} {:<8} {:>10}  {:<20} {:<16} {}",
            c.tenant,
            c.name,
            if c.active {
                "yes"
            } else if c.canary_percent > 0 {
                "canary"
            } else if c.held.is_empty() {
                ""
            } else {
                "held"
            },
            corral_core::sandbox::format_bytes(c.size),
            time_text(c.uploaded_at_ms),
            short_signer(&c.signer),
            c.digest
        );
    }
    ExitCode::SUCCESS
}

pub async fn describe(args: DigestArgs) -> ExitCode {
    let request = proto::DescribeRequest {
        tenant: args.conn.tenant(),
        digest: args.digest.clone(),
    };
    let c = call!(args.conn, describe, request);
    if args.conn.json {
        println!("{}", component_json(&c));
        return ExitCode::SUCCESS;
    }
    println!("{} of `{}` (tenant {})", c.digest, c.name, c.tenant);
    println!("  size:     {}", corral_core::sandbox::format_bytes(c.size));
    println!("  uploaded: {}", time_text(c.uploaded_at_ms));
    println!("  active:   {}", if c.active { "yes" } else { "no" });
    if c.canary_percent > 0 {
        println!(
            "  canary:   takes {}% of its deployment's tasks",
            c.canary_percent
        );
    }
    print_held(&c);
    print_signer(&c);
    for (k, v) in &c.labels {
        println!("  label:    {k}={v}");
    }
    for (alias, target) in &c.aliases {
        println!("  alias:    {alias} -> {target}");
    }
    for (k, v) in &c.config {
        println!("  config:   {k}={v}");
    }
    match &c.reuse {
        Some(r) if r.max_tasks == 0 => println!("  reuse:    off (a new instance for every task)"),
        Some(r) => println!(
            "  reuse:    up to {} tasks per instance, kept {:?} idle",
            r.max_tasks,
            std::time::Duration::from_millis(r.idle_ms)
        ),
        None => {}
    }
    print_activity_types(&c);
    for u in &c.unsupported {
        println!("  unsupported: {u}");
    }
    print_outbound_http(&c);
    println!("imports:");
    for import in &c.imports {
        println!("  {import}");
    }
    ExitCode::SUCCESS
}

pub async fn remove(args: RemoveArgs) -> ExitCode {
    let request = proto::RemoveRequest {
        tenant: args.conn.tenant(),
        digest: args.digest.clone(),
        force: args.force,
    };
    let c = call!(args.conn, remove, request);
    if args.conn.json {
        println!("{}", component_json(&c));
    } else {
        println!("removed {} of `{}`", c.digest, c.name);
    }
    ExitCode::SUCCESS
}

/// `activate`, or the operator's `approve` (`approve`) past the tenant's
/// rollout.
pub async fn activate(args: DigestArgs, approve: bool) -> ExitCode {
    let request = proto::ActivateRequest {
        tenant: args.conn.tenant(),
        digest: args.digest.clone(),
    };
    let response = if approve {
        call!(args.conn, approve, request)
    } else {
        call!(args.conn, activate, request)
    };
    let Some(c) = response.component else {
        return usage_error("the host answered without the activated component");
    };
    if args.conn.json {
        let mut value = component_json(&c);
        value["previous_digest"] = json!(response.previous_digest);
        println!("{value}");
    } else if !c.active && c.canary_percent > 0 {
        println!(
            "{} of `{}` is a canary taking {}% of its deployment's tasks (the tenant's rollout ramps it up)",
            c.digest, c.name, c.canary_percent
        );
    } else if response.previous_digest.is_empty() {
        println!("{} of `{}` is active", c.digest, c.name);
    } else {
        println!(
            "{} of `{}` is active (was {})",
            c.digest, c.name, response.previous_digest
        );
    }
    ExitCode::SUCCESS
}

pub async fn invoke(args: InvokeArgs) -> ExitCode {
    let request = proto::RunRequest {
        tenant: args.conn.tenant(),
        activity_type: args.activity_type.clone(),
        args_json: args.args.clone(),
    };
    let response = call!(args.conn, run, request);
    match response.outcome {
        Some(run_response::Outcome::ResultJson(result)) => {
            println!("{result}");
            ExitCode::SUCCESS
        }
        Some(run_response::Outcome::Failure(f)) => {
            let details: Value = serde_json::from_str(&f.details_json).unwrap_or(Value::Null);
            if args.conn.json {
                println!(
                    "{}",
                    json!({"class": f.class, "kind": f.kind, "retryable": f.retryable, "message": f.message, "details": details})
                );
            } else {
                let retry = if f.retryable {
                    "retryable"
                } else {
                    "non-retryable"
                };
                eprintln!(
                    "activity failed: {} ({}, {retry}): {}",
                    f.class, f.kind, f.message
                );
                if !details.is_null() {
                    eprintln!("details: {details}");
                }
            }
            ExitCode::from(1)
        }
        None => usage_error("the host answered without an outcome"),
    }
}

pub fn token(args: TokenArgs) -> ExitCode {
    let (token, hash) = match generate_token() {
        Ok(pair) => pair,
        Err(e) => return usage_error(format!("no randomness available: {e}")),
    };
    if args.json {
        println!("{}", json!({"token": token, "sha256": hash.to_string()}));
    } else {
        println!("token:  {token}");
        println!("sha256: {hash}");
        eprintln!("Give the token to its user (CORRAL_TOKEN); put only the sha256 in corral.toml.");
    }
    ExitCode::SUCCESS
}

pub(super) fn print_held(c: &proto::Component) {
    for reason in &c.held {
        println!("  held:     {reason}");
    }
}

/// A signer's fingerprint as `ls` shows it: `sha256:` and 8 hex digits
/// (`describe` shows it whole), or `unsigned`.
fn short_signer(signer: &str) -> &str {
    if signer.is_empty() {
        return "unsigned";
    }
    signer.get(..15).unwrap_or(signer)
}

pub(super) fn print_signer(c: &proto::Component) {
    if c.signer.is_empty() {
        println!("  signed:   no");
    } else {
        println!("  signed:   by key {}", c.signer);
    }
}

pub(super) fn print_outbound_http(c: &proto::Component) {
    if !c.outbound_http.is_empty() {
        println!("  outbound HTTP: {}", c.outbound_http);
    }
}

pub(super) fn print_activity_types(c: &proto::Component) {
    for a in &c.activity_types {
        println!("  {}: {}", a.name, a.signature);
    }
}

fn sorted(
    m: &std::collections::HashMap<String, String>,
) -> std::collections::BTreeMap<&String, &String> {
    m.iter().collect()
}

pub(super) fn component_json(c: &proto::Component) -> Value {
    json!({
        "tenant": c.tenant,
        "name": c.name,
        "digest": c.digest,
        "size": c.size,
        "uploaded_at_ms": c.uploaded_at_ms,
        "active": c.active,
        "activity_types": c.activity_types.iter().map(|a| json!({"name": a.name, "signature": a.signature})).collect::<Vec<_>>(),
        "imports": c.imports,
        "aliases": sorted(&c.aliases),
        "labels": sorted(&c.labels),
        "config": sorted(&c.config),
        "reuse": c.reuse.as_ref().map(|r| json!({"max_tasks": r.max_tasks, "idle_ms": r.idle_ms})),
        "unsupported": c.unsupported,
        "outbound_http": c.outbound_http,
        "held": c.held,
        "canary_percent": c.canary_percent,
        "signer": (!c.signer.is_empty()).then_some(&c.signer),
    })
}

/// `2026-11-29 18:00:00 UTC` from milliseconds since the epoch.
fn time_text(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_printed_as_utc_dates() {
        assert_eq!(time_text(0), "1970-01-01 00:00:00");
        assert_eq!(time_text(1_795_975_200_000), "2026-11-29 18:00:00");
        assert_eq!(time_text(951_782_400_000), "2000-02-29 00:00:00");
    }
}
