//! A `corral test` file: the component under test, the tenant's limits and
//! capabilities (as in `corral.toml`), and the cases with what each expects.
//!
//! ```toml
//! component = "dist/greeter.wasm"     # relative to this file, or oci://…
//! limits = { memory = "64MiB", timeout = "5s" }
//! capabilities = { env = { REGION = "eu" } }
//! config = { greeting = "Ahoy" }           # wasi:config
//!
//! [[case]]
//! name = "greets formally"
//! activity = "demo:greeter/api.greet"
//! args = [{ name = "Ada", language = "english" }, "formal"]
//! expect = { result = { message = "Good day, Ada!", calls-in-instance = 1, attempt = 1 } }
//!
//! [[case]]
//! name = "stops when cancelled"
//! activity = "demo:progress/api.count-to"
//! args = [100, 10]
//! cancel_at_heartbeat = 3          # or cancel_after = "50ms"
//! # also: attempt = 2, last_heartbeat = { count = 3 }, deadline = "2s",
//! #       args_json = ['…'] (JSON text, e.g. for null), named = { … }
//! expect = { failure = { class = "Cancelled" }, heartbeats = 3 }
//! # failure: class, and optionally kind, retryable, message (a part of it);
//! # logs = ["…"]: each is part of some log line
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use corral::config::{Config, ConfigError};
use corral_core::sandbox::{FailureClass, QuantityError, Tenant, parse_duration};
use corral_core::testing::{Call, TestComponent, TestRun};

/// Why a test file cannot be run, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("`{path}`: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{path}`: {source}")]
    Syntax {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("`{path}`: its limits or capabilities: {source}")]
    Policy {
        path: PathBuf,
        source: Box<ConfigError>,
    },
    #[error("`{path}`, case `{case}`: {source}")]
    Case {
        path: PathBuf,
        case: String,
        source: CaseError,
    },
    #[error("`{path}`: no [[case]] to run")]
    NoCases { path: PathBuf },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    component: String,
    limits: Option<toml::Table>,
    capabilities: Option<toml::Table>,
    /// What the guest reads through `wasi:config`.
    config: Option<toml::Table>,
    #[serde(default, rename = "case")]
    cases: Vec<RawCase>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    activity: String,
    #[serde(default)]
    args: Vec<toml::Value>,
    args_json: Option<Vec<String>>,
    named: Option<toml::Table>,
    attempt: Option<u32>,
    last_heartbeat: Option<toml::Value>,
    deadline: Option<String>,
    cancel_after: Option<String>,
    cancel_at_heartbeat: Option<u32>,
    expect: RawExpect,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExpect {
    result: Option<toml::Value>,
    result_json: Option<String>,
    failure: Option<RawFailure>,
    heartbeats: Option<usize>,
    #[serde(default)]
    logs: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFailure {
    class: String,
    kind: Option<String>,
    retryable: Option<bool>,
    message: Option<String>,
}

/// A test file, checked: its component, the tenant policy, its cases.
pub struct Spec {
    /// A path (resolved against the file's directory) or `oci://…`.
    pub component: String,
    pub tenant: Tenant,
    pub cases: Vec<Case>,
}

/// One case, checked.
pub struct Case {
    pub name: String,
    activity: String,
    args: Vec<Value>,
    named: Option<serde_json::Map<String, Value>>,
    attempt: Option<u32>,
    last_heartbeat: Option<Value>,
    deadline: Option<Duration>,
    cancel_after: Option<Duration>,
    cancel_at_heartbeat: Option<u32>,
    expect: Expect,
}

enum Outcome {
    Result(Value),
    Failure {
        class: FailureClass,
        kind: Option<String>,
        retryable: Option<bool>,
        message: Option<String>,
    },
}

struct Expect {
    outcome: Outcome,
    heartbeats: Option<usize>,
    logs: Vec<String>,
}

fn json(value: toml::Value) -> Value {
    // Every TOML value has a JSON form (dates become their text).
    serde_json::to_value(value).unwrap_or(Value::Null)
}

impl Spec {
    pub fn read(path: &Path) -> Result<Spec, SpecError> {
        let text = std::fs::read_to_string(path).map_err(|source| SpecError::Read {
            path: path.to_owned(),
            source,
        })?;
        let raw: RawFile = toml::from_str(&text).map_err(|source| SpecError::Syntax {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let component = if corral::oci::is_reference(&raw.component) {
            raw.component.clone()
        } else {
            base.join(&raw.component).display().to_string()
        };
        let tenant = policy(&raw, &component, base).map_err(|source| SpecError::Policy {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        if raw.cases.is_empty() {
            return Err(SpecError::NoCases {
                path: path.to_owned(),
            });
        }
        let cases = raw
            .cases
            .into_iter()
            .map(|case| {
                let name = case.name.clone();
                Case::check(case).map_err(|source| SpecError::Case {
                    path: path.to_owned(),
                    case: name,
                    source,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Spec {
            component,
            tenant,
            cases,
        })
    }
}

/// The tenant's limits and capabilities, read through the same checks as
/// `corral serve`'s configuration (a one-tenant file, as `corral dev`
/// writes one).
fn policy(raw: &RawFile, component: &str, base: &Path) -> Result<Tenant, ConfigError> {
    let mut tenant = toml::Table::new();
    tenant.insert("name".into(), "test".into());
    let mut temporal = toml::Table::new();
    temporal.insert("address".into(), "http://127.0.0.1:1".into());
    temporal.insert("task_queue".into(), "corral-test".into());
    tenant.insert("temporal".into(), temporal.into());
    tenant.insert(
        "components".into(),
        vec![toml::Value::from(component)].into(),
    );
    if let Some(limits) = &raw.limits {
        tenant.insert("limits".into(), limits.clone().into());
    }
    if let Some(capabilities) = &raw.capabilities {
        tenant.insert("capabilities".into(), capabilities.clone().into());
    }
    if let Some(config) = &raw.config {
        tenant.insert("config".into(), config.clone().into());
    }
    let mut root = toml::Table::new();
    root.insert("tenant".into(), vec![toml::Value::from(tenant)].into());
    // The keys it names are the test file's own (`limits.memory`), not
    // those of the one-tenant configuration it was written into.
    let own_key = |key: String| key.replace("tenant[0] (`test`).", "");
    let config = Config::parse(&root.to_string(), base).map_err(|e| match e {
        ConfigError::Invalid { key, problem } => ConfigError::Invalid {
            key: own_key(key),
            problem,
        },
        ConfigError::Policy { key, source } => ConfigError::Policy {
            key: own_key(key),
            source,
        },
        other => other,
    })?;
    Ok(config
        .tenants
        .into_iter()
        .next()
        .map(|t| t.tenant)
        .unwrap_or_default())
}

/// Why a case of a spec cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    #[error("{key}: {source}")]
    Duration {
        key: &'static str,
        source: QuantityError,
    },
    #[error("args_json[{index}] is not JSON: {source}")]
    ArgsJson {
        index: usize,
        source: serde_json::Error,
    },
    #[error("give args or args_json, not both")]
    BothArgs,
    #[error("expect.result_json is not JSON: {0}")]
    ResultJson(#[source] serde_json::Error),
    #[error(
        "expect.failure.class: `{0}` is not a failure class ({known})",
        known = FailureClass::ALL.map(FailureClass::as_str).join(", ")
    )]
    FailureClass(String),
    #[error("expect exactly one of result, result_json or failure")]
    Expectation,
}

impl Case {
    fn check(raw: RawCase) -> Result<Case, CaseError> {
        let duration = |text: Option<String>, key: &'static str| {
            text.map(|t| parse_duration(&t).map_err(|source| CaseError::Duration { key, source }))
                .transpose()
        };
        let args = match raw.args_json {
            Some(texts) if raw.args.is_empty() => texts
                .iter()
                .enumerate()
                .map(|(index, t)| {
                    serde_json::from_str(t).map_err(|source| CaseError::ArgsJson { index, source })
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(CaseError::BothArgs),
            None => raw.args.into_iter().map(json).collect(),
        };
        let e = raw.expect;
        let outcome = match (e.result, e.result_json, e.failure) {
            (Some(value), None, None) => Outcome::Result(json(value)),
            (None, Some(text), None) => {
                Outcome::Result(serde_json::from_str(&text).map_err(CaseError::ResultJson)?)
            }
            (None, None, Some(f)) => Outcome::Failure {
                class: FailureClass::ALL
                    .into_iter()
                    .find(|c| c.as_str() == f.class)
                    .ok_or_else(|| CaseError::FailureClass(f.class.clone()))?,
                kind: f.kind,
                retryable: f.retryable,
                message: f.message,
            },
            _ => return Err(CaseError::Expectation),
        };
        Ok(Case {
            name: raw.name,
            activity: raw.activity,
            args,
            named: raw
                .named
                .map(|t| t.into_iter().map(|(k, v)| (k, json(v))).collect()),
            attempt: raw.attempt,
            last_heartbeat: raw.last_heartbeat.map(json),
            deadline: duration(raw.deadline, "deadline")?,
            cancel_after: duration(raw.cancel_after, "cancel_after")?,
            cancel_at_heartbeat: raw.cancel_at_heartbeat,
            expect: Expect {
                outcome,
                heartbeats: e.heartbeats,
                logs: e.logs,
            },
        })
    }

    /// The call this case makes.
    pub fn call(&self, component: &TestComponent) -> Call {
        let mut call = component.call(&self.activity).args(self.args.clone());
        if let Some(named) = &self.named {
            call = call.named(named.clone());
        }
        if let Some(attempt) = self.attempt {
            call = call.attempt(attempt);
        }
        if let Some(details) = &self.last_heartbeat {
            call = call.last_heartbeat(details.clone());
        }
        if let Some(deadline) = self.deadline {
            call = call.deadline(deadline);
        }
        if let Some(delay) = self.cancel_after {
            call = call.cancel_after(delay);
        }
        if let Some(n) = self.cancel_at_heartbeat {
            call = call.cancel_at_heartbeat(n);
        }
        call
    }

    /// What differs from the expectation, one line each (none: it passed).
    pub fn mismatches(&self, run: &TestRun) -> Vec<String> {
        let mut problems = Vec::new();
        match (&self.expect.outcome, &run.outcome) {
            (Outcome::Result(want), Ok(got)) if want != got => {
                problems.push(format!("expected result {want}, got {got}"));
            }
            (Outcome::Result(_), Ok(_)) => {}
            (Outcome::Result(want), Err(failure)) => {
                problems.push(format!("expected result {want}, got {failure}"));
            }
            (Outcome::Failure { class, .. }, Ok(got)) => {
                problems.push(format!("expected a {class} failure, got result {got}"));
            }
            (
                Outcome::Failure {
                    class,
                    kind,
                    retryable,
                    message,
                },
                Err(failure),
            ) => {
                if failure.class != *class {
                    problems.push(format!("expected a {class} failure, got {failure}"));
                } else {
                    if let Some(kind) = kind.as_ref().filter(|k| **k != failure.kind) {
                        problems.push(format!("expected kind `{kind}`, got {failure}"));
                    }
                    if let Some(r) = retryable.filter(|r| *r != failure.retryable) {
                        problems.push(format!("expected retryable = {r}, got {failure}"));
                    }
                    if let Some(part) = message.as_ref().filter(|m| !failure.message.contains(*m)) {
                        problems.push(format!(
                            "expected a message containing `{part}`, got {failure}"
                        ));
                    }
                }
            }
        }
        if let Some(n) = self
            .expect
            .heartbeats
            .filter(|n| *n != run.heartbeats.len())
        {
            problems.push(format!(
                "expected {n} heartbeats, got {}",
                run.heartbeats.len()
            ));
        }
        for part in &self.expect.logs {
            if !run
                .logs
                .iter()
                .any(|line| line.message.contains(part.as_str()))
            {
                let seen: Vec<&str> = run.logs.iter().map(|l| l.message.as_str()).collect();
                problems.push(format!("no log line contains `{part}` (logged: {seen:?})"));
            }
        }
        problems
    }
}
