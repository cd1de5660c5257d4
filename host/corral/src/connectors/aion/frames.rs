//! Aion's frames ⇄ the session loop's terms: a pushed task becomes a
//! [`TaskStart`], a [`Report`] becomes a result frame, and a tenant's
//! activity types become the registration's typed descriptors.

use std::time::Duration;

use serde_json::{Value, json};

use super::wire;
use corral_core::sandbox::{TaskInfo, convert};
use corral_core::session::{
    Args, HeartbeatDetails, InputError, Registry, Report, TaskKey, TaskStart,
};

/// Every payload corral reads or writes is JSON.
pub const JSON: &str = "application/json";

/// One activity attempt as Aion names it. Results, heartbeats and refusals
/// echo these; the completion token fences one execution generation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attempt {
    pub workflow: String,
    pub activity: u64,
    pub run: Option<String>,
    pub token: String,
}

impl Attempt {
    /// The pair the server's cancels and acknowledgements address.
    pub fn pair(&self) -> (String, u64) {
        (self.workflow.clone(), self.activity)
    }

    /// The session loop's key: unique per execution generation, and one
    /// attempt's only (a JSON array: no workflow id or token can make
    /// another attempt's, as `w/1`, 2, `t` and `w`, 1, `2/t` did joined
    /// with `/`).
    pub fn key(&self) -> TaskKey {
        serde_json::json!([self.workflow, self.activity, self.token])
            .to_string()
            .into_bytes()
    }

    pub fn workflow_id(&self) -> Option<wire::WorkflowId> {
        Some(wire::WorkflowId {
            uuid: self.workflow.clone(),
        })
    }

    pub fn activity_id(&self) -> Option<wire::ActivityId> {
        Some(wire::ActivityId {
            sequence_position: self.activity,
        })
    }

    pub fn refusal(&self, reason: String) -> wire::worker_to_server::Message {
        wire::worker_to_server::Message::TaskRefused(wire::TaskRefused {
            workflow_id: self.workflow_id(),
            activity_id: self.activity_id(),
            reason,
            completion_token: self.token.clone(),
        })
    }

    pub fn heartbeat(&self, details: Option<&HeartbeatDetails>) -> wire::worker_to_server::Message {
        wire::worker_to_server::Message::Heartbeat(wire::Heartbeat {
            workflow_id: self.workflow_id(),
            activity_id: self.activity_id(),
            progress: details.map(|d| json_payload(d.json())),
        })
    }

    /// The result frame for a report. Failures keep corral's class, kind
    /// and details in a JSON payload; `retryable` decides the kind Aion
    /// acts on. A requested cancel is terminal.
    pub fn result(&self, report: &Report) -> wire::ActivityResult {
        use wire::activity_result::Outcome;
        let outcome = match report {
            Report::Completed(value) => Outcome::Result(payload(value)),
            Report::Failed(f) | Report::Cancelled(f) => {
                let retryable = f.retryable && matches!(report, Report::Failed(_));
                Outcome::Error(wire::ActivityError {
                    kind: if retryable {
                        wire::ActivityErrorKind::Retryable
                    } else {
                        wire::ActivityErrorKind::Terminal
                    } as i32,
                    message: format!("{}: {}", f.class, f.message),
                    details: Some(payload(&json!({
                        "class": f.class.as_str(),
                        "kind": f.kind,
                        "retryable": retryable,
                        "details": f.details,
                    }))),
                })
            }
        };
        wire::ActivityResult {
            workflow_id: self.workflow_id(),
            activity_id: self.activity_id(),
            outcome: Some(outcome),
            run_id: self.run.clone().map(|uuid| wire::RunId { uuid }),
            completion_token: self.token.clone(),
        }
    }
}

pub fn payload(value: &Value) -> wire::Payload {
    json_payload(&value.to_string())
}

/// A payload of JSON text.
fn json_payload(json: &str) -> wire::Payload {
    wire::Payload {
        content_type: JSON.to_owned(),
        bytes: json.as_bytes().to_vec(),
    }
}

/// Why a pushed task cannot be one: it names no attempt to report to.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum MalformedTask {
    #[error("the task has no workflow id")]
    NoWorkflowId,
    #[error("the task has no activity id")]
    NoActivityId,
}

/// Why a pushed task's input is not named arguments.
#[derive(Debug, thiserror::Error)]
pub enum BadInput {
    #[error("the input payload is `{0}`, not {JSON}")]
    ContentType(String),
    #[error("the input must be an object of named arguments, got {0}")]
    NotAnObject(String),
    #[error("the input payload is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
}

/// A pushed task, or why it cannot be one (it is then refused).
pub fn task(
    task: wire::ActivityTask,
    tenant: &str,
    heartbeat_every: Duration,
) -> Result<(Attempt, TaskStart), MalformedTask> {
    let workflow = task
        .workflow_id
        .map(|w| w.uuid)
        .filter(|w| !w.is_empty())
        .ok_or(MalformedTask::NoWorkflowId)?;
    let activity = task
        .activity_id
        .ok_or(MalformedTask::NoActivityId)?
        .sequence_position;
    let attempt = Attempt {
        workflow,
        activity,
        run: task.run_id.map(|r| r.uuid),
        token: task.completion_token,
    };
    let start = TaskStart {
        key: attempt.key(),
        tenant: tenant.to_owned(),
        activity_type: task.activity_type,
        args: arguments(task.input.as_ref()).map_err(InputError::new),
        info: TaskInfo {
            tenant: tenant.to_owned(),
            activity_id: attempt.activity.to_string(),
            workflow_id: Some(attempt.workflow.clone()),
            // Zero is a server that did not stamp it; count it as the first.
            attempt: task.attempt.max(1),
            last_heartbeat: None,
            // Aion's tasks carry no trace context.
            traceparent: None,
        },
        deadline: None,
        heartbeat_every,
        type_slot: None,
        observer: None,
    };
    Ok((attempt, start))
}

/// The input payload: a JSON object of named arguments.
fn arguments(input: Option<&wire::Payload>) -> Result<Args, BadInput> {
    let Some(input) = input else {
        return Ok(Args::Named(Default::default()));
    };
    if input.content_type != JSON {
        return Err(BadInput::ContentType(input.content_type.clone()));
    }
    match serde_json::from_slice(&input.bytes) {
        Ok(Value::Object(named)) => Ok(Args::Named(named)),
        Ok(Value::Null) => Ok(Args::Named(Default::default())),
        Ok(other) => Err(BadInput::NotAnObject(
            corral_core::sandbox::convert::describe_json(&other),
        )),
        Err(e) => Err(BadInput::NotJson(e)),
    }
}

/// The typed action surface a tenant registers: every name it serves
/// (full WIT names and aliases) with its input and output JSON Schemas.
pub fn descriptors(registry: &Registry, tenant: &str) -> Vec<wire::ActivityDescriptor> {
    registry
        .routes(tenant)
        .into_iter()
        .filter_map(|(name, route)| {
            let activity = route.component.activity(&route.activity)?;
            Some(wire::ActivityDescriptor {
                name,
                input_schema_json: convert::input_schema(activity).to_string(),
                output_schema_json: convert::output_schema(activity).to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_core::sandbox::{Failure, FailureClass, RetryPolicy};

    fn wire_task(input: &str) -> wire::ActivityTask {
        wire::ActivityTask {
            workflow_id: Some(wire::WorkflowId { uuid: "w".into() }),
            activity_id: Some(wire::ActivityId {
                sequence_position: 3,
            }),
            activity_type: "greet".into(),
            input: Some(wire::Payload {
                content_type: JSON.into(),
                bytes: input.as_bytes().to_vec(),
            }),
            attempt: 2,
            run_id: Some(wire::RunId { uuid: "r".into() }),
            completion_token: "t1".into(),
        }
    }

    #[test]
    fn a_task_becomes_a_start_with_named_arguments() {
        let (attempt, start) = task(
            wire_task(r#"{"name":"Ada"}"#),
            "acme",
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(start.key, br#"["w",3,"t1"]"#);
        assert_eq!(start.info.attempt, 2);
        assert_eq!(start.info.workflow_id.as_deref(), Some("w"));
        let Ok(Args::Named(named)) = start.args else {
            panic!("{:?}", start.args)
        };
        assert_eq!(named["name"], "Ada");
        assert_eq!(attempt.pair(), ("w".to_owned(), 3));

        let (_, bad) = task(wire_task("[1]"), "acme", Duration::from_secs(1)).unwrap();
        assert_eq!(
            bad.args.map(|_| ()).map_err(|e| e.to_string()),
            Err("the input must be an object of named arguments, got array [1]".into())
        );
        let mut missing = wire_task("{}");
        missing.workflow_id = None;
        assert_eq!(
            task(missing, "acme", Duration::from_secs(1)).err(),
            Some(MalformedTask::NoWorkflowId)
        );
    }

    #[test]
    fn failures_keep_their_class_and_only_retryable_failures_are_retried() {
        let (attempt, _) = task(wire_task("{}"), "acme", Duration::from_secs(1)).unwrap();
        let policy = RetryPolicy::default();
        let timeout = Failure::new(FailureClass::Timeout, &policy, "too slow");
        let trap = Failure::new(FailureClass::Trap, &policy, "unreachable");
        let kind = |report: Report| match attempt.result(&report).outcome {
            Some(wire::activity_result::Outcome::Error(e)) => (e.kind, e.message),
            other => panic!("{other:?}"),
        };
        let retryable = wire::ActivityErrorKind::Retryable as i32;
        let terminal = wire::ActivityErrorKind::Terminal as i32;
        assert_eq!(
            kind(Report::Failed(timeout.clone())),
            (retryable, "Timeout: too slow".into())
        );
        assert_eq!(kind(Report::Failed(trap)).0, terminal);
        assert_eq!(kind(Report::Cancelled(timeout)).0, terminal);
        let done = attempt.result(&Report::Completed(json!({"ok": 1})));
        assert_eq!(done.completion_token, "t1");
        assert_eq!(done.run_id.map(|r| r.uuid).as_deref(), Some("r"));
    }
}
