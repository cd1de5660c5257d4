//! The Temporal connector: an activity-only worker on Temporal's own Rust
//! worker core (`temporalio-sdk-core`), one per tenant (namespace + task
//! queue), whose activity slots are corral's permits.

mod failure;
pub mod payloads;
mod slots;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_trait::async_trait;
use temporalio_client::{Connection, ConnectionOptions, GrpcCompression};
use temporalio_common::protos::coresdk::activity_result::{
    self as ar, ActivityExecutionResult, activity_execution_result::Status,
};
use temporalio_common::protos::coresdk::activity_task::{
    ActivityCancelReason, ActivityTask, activity_task::Variant,
};
use temporalio_common::protos::coresdk::{ActivityHeartbeat, ActivityTaskCompletion};
use temporalio_common::protos::temporal::api::common::v1::Payload;
use temporalio_common::protos::temporal::api::workflowservice::v1::GetSystemInfoRequest;
use temporalio_common::worker::WorkerTaskTypes;
use temporalio_sdk_core::{
    CoreRuntime, PollError, PollerBehavior, RuntimeOptions, TunerBuilder, Url, Worker,
    WorkerConfig, WorkerVersioningStrategy, init_worker,
};

use super::MAX_LOGGED;
use crate::config::{Compression, TemporalBinding};
use crate::health::EngineLink;
use corral_core::backoff::{Backoff, Try, patiently};
use corral_core::sandbox::TaskInfo;
use corral_core::session::{
    Args, CancelReason, Connector, HeartbeatDetails, Inbound, InputError, Permits, Report,
    ReportError, TaskKey, TaskStart,
};
use corral_core::shown::Shown;

/// How soon an activity without a heartbeat timeout learns it was
/// cancelled.
const CANCEL_LATENCY: Duration = Duration::from_secs(2);

/// One tenant's Temporal worker.
pub struct TemporalConnector {
    worker: Worker,
    tenant: String,
    /// Its readiness: a poll that fails makes it not ready a while.
    link: Arc<EngineLink>,
}

/// How often the host asks each Temporal server whether it answers (the
/// readiness of its tenants), and how long it waits for the answer.
const SERVER_CHECK: Duration = Duration::from_secs(5);

/// The gRPC connections to Temporal servers, one per server address and
/// compression, shared by every tenant's worker on that server: a thousand
/// tenants on one server hold one HTTP/2 connection (and one descriptor),
/// not a thousand.
#[derive(Default)]
pub struct Connections {
    by_server: HashMap<(String, Compression), Server>,
}

/// One Temporal server's connection, and the links of the tenants on it.
struct Server {
    connection: Connection,
    links: Vec<Arc<EngineLink>>,
}

impl Connections {
    /// The connection to `binding`'s server, made (retrying for a while when
    /// the server is not up yet) by the first tenant that needs it.
    async fn get(
        &mut self,
        tenant: &str,
        binding: &TemporalBinding,
        patience: Duration,
        link: &Arc<EngineLink>,
    ) -> anyhow::Result<Connection> {
        let key = (binding.address.clone(), binding.compression);
        if let Some(server) = self.by_server.get_mut(&key) {
            server.links.push(link.clone());
            return Ok(server.connection.clone());
        }
        let url = Url::parse(&binding.address)
            .with_context(|| format!("tenant `{tenant}`: `{}` is not a URL", binding.address))?;
        let connection = connect_with_retry(&url, binding.compression, patience)
            .await
            .with_context(|| {
                format!(
                    "tenant `{tenant}`: cannot reach the Temporal server at {} (is it running? \
                 `temporal server start-dev` starts one)",
                    binding.address
                )
            })?;
        self.by_server.insert(
            key,
            Server {
                connection: connection.clone(),
                links: vec![link.clone()],
            },
        );
        Ok(connection)
    }

    /// Asks each server every [`SERVER_CHECK`] whether it answers (its
    /// system information, the cheapest call every server serves), until
    /// `stop`: its tenants are ready only while it does.
    pub fn watch(&self, stop: tokio_util::sync::CancellationToken) {
        for ((address, _), server) in &self.by_server {
            let (address, connection, links, stop) = (
                address.clone(),
                server.connection.clone(),
                server.links.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(SERVER_CHECK);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut service = connection.workflow_service();
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        _ = ticks.tick() => {}
                    }
                    let request = tonic::Request::new(GetSystemInfoRequest::default());
                    let asked =
                        tokio::time::timeout(SERVER_CHECK, service.get_system_info(request)).await;
                    let down = match asked {
                        Ok(Ok(_)) => None,
                        Ok(Err(status)) => Some(format!(
                            "the Temporal server at {address} answers {:?}: {}",
                            status.code(),
                            status.message()
                        )),
                        Err(_) => Some(format!(
                            "the Temporal server at {address} did not answer within {SERVER_CHECK:?}"
                        )),
                    };
                    for link in &links {
                        match &down {
                            None => link.up(),
                            Some(why) => link.down(why),
                        }
                    }
                }
            });
        }
    }
}

/// The worker core's runtime for every tenant's worker, on corral's Tokio
/// runtime. Worker heartbeats are off: sdk-core 0.10 gives every
/// heartbeating worker a system-information thread of its own, a thread
/// per tenant (1,000 tenants, 1,000 threads), and corral reports its
/// workers' health itself (`/metrics`, `/health`).
pub fn core_runtime() -> anyhow::Result<CoreRuntime> {
    let options = RuntimeOptions::builder()
        .heartbeat_interval(None)
        .build()
        .map_err(anyhow::Error::msg)
        .context("the Temporal worker runtime's options")?;
    CoreRuntime::new_assume_tokio(options).context("starting the Temporal worker runtime")
}

impl TemporalConnector {
    /// Registers an activity-only worker on the tenant's task queue, on
    /// the shared connection to its server.
    #[allow(clippy::too_many_arguments)]
    pub async fn connect(
        runtime: &CoreRuntime,
        connections: &mut Connections,
        tenant: &str,
        binding: &TemporalBinding,
        permits: &Permits,
        grace: Duration,
        patience: Duration,
        link: Arc<EngineLink>,
    ) -> anyhow::Result<Self> {
        let connection = connections.get(tenant, binding, patience, &link).await?;
        let slots = permits.slots_of(tenant)?;
        let mut tuner = TunerBuilder::default();
        tuner.activity_slot_supplier(Arc::new(slots::PermitSlots(slots)));
        let config = WorkerConfig::builder()
            .namespace(binding.namespace.clone())
            .task_queue(binding.task_queue.clone())
            .task_types(WorkerTaskTypes::activity_only())
            // A fixed number of polls (`temporal.pollers`): autoscaling
            // pollers each run a 100 ms ticker in sdk-core 0.10, which a
            // thousand idle tenants turn into 10,000 wakeups a second.
            .activity_task_poller_behavior(PollerBehavior::SimpleMaximum(binding.pollers.get()))
            .tuner(Arc::new(tuner.build()))
            .versioning_strategy(WorkerVersioningStrategy::None {
                build_id: format!("corral-{}", env!("CARGO_PKG_VERSION")),
            })
            .graceful_shutdown_period(grace)
            // Temporal delivers cancellation in heartbeat responses: an
            // activity without a heartbeat timeout still hears of a cancel
            // within this interval.
            .default_heartbeat_throttle_interval(CANCEL_LATENCY)
            .build()
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("tenant `{tenant}`: worker configuration"))?;
        let worker = init_worker(runtime, config, connection)
            .with_context(|| format!("tenant `{tenant}`: starting the Temporal worker"))?;
        worker.validate().await.with_context(|| {
            format!(
                "tenant `{tenant}`: the Temporal server refused the worker (does namespace `{}` exist?)",
                binding.namespace
            )
        })?;
        link.up();
        Ok(TemporalConnector {
            worker,
            tenant: tenant.to_owned(),
            link,
        })
    }
}

async fn connect_with_retry(
    url: &Url,
    compression: Compression,
    patience: Duration,
) -> anyhow::Result<Connection> {
    let attempt = || async {
        let options = ConnectionOptions::new(url.clone())
            .identity(super::identity())
            .connect_timeout(Duration::from_secs(5))
            .grpc_compression(match compression {
                Compression::Gzip => GrpcCompression::Gzip,
                Compression::None => GrpcCompression::None,
            })
            .build();
        match Connection::connect(options).await {
            Ok(connection) => Try::Done(connection),
            Err(e) => Try::Again(e),
        }
    };
    let backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    patiently(patience, backoff, attempt, |e, wait| {
        let e = e.to_string();
        tracing::warn!(
            "cannot reach {url} yet, retrying in {wait:?}: {}",
            Shown(&e, MAX_LOGGED)
        );
    })
    .await
    .map_err(anyhow::Error::new)
}

/// A protobuf duration (seconds and nanos); zero or negative is "none".
fn duration(seconds: i64, nanos: i32) -> Option<Duration> {
    let total = Duration::from_secs(u64::try_from(seconds).ok()?)
        + Duration::from_nanos(u64::try_from(nanos).ok()?);
    (!total.is_zero()).then_some(total)
}

macro_rules! proto_duration {
    ($field:expr) => {
        $field.as_ref().and_then(|d| duration(d.seconds, d.nanos))
    };
}

/// The header the Temporal SDKs' OpenTelemetry interceptors carry the
/// caller's trace context in: a JSON payload of W3C headers.
const TRACER_HEADER: &str = "_tracer-data";

/// The caller's `traceparent`, when its SDK sent one (anything malformed
/// is ignored: it only decides a span's parent).
fn traceparent(headers: &HashMap<String, Payload>) -> Option<String> {
    let data = payloads::to_json(headers.get(TRACER_HEADER)?).ok()?;
    let parent = data.get("traceparent")?.as_str()?;
    let well_formed =
        parent.len() == 55 && parent.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit());
    well_formed.then(|| parent.to_owned())
}

fn inbound(task: ActivityTask, tenant: &str) -> Option<Inbound> {
    match task.variant? {
        Variant::Start(start) => {
            let deadline = match (
                proto_duration!(start.start_to_close_timeout),
                proto_duration!(start.schedule_to_close_timeout),
            ) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let workflow_id = start
                .workflow_execution
                .as_ref()
                .map(|w| w.workflow_id.clone())
                .filter(|id| !id.is_empty());
            Some(Inbound::Start(Box::new(TaskStart {
                key: task.task_token,
                tenant: tenant.to_owned(),
                activity_type: start.activity_type.clone(),
                args: payloads::args_to_json(&start.input)
                    .map(Args::Positional)
                    .map_err(InputError::new),
                info: TaskInfo {
                    tenant: tenant.to_owned(),
                    activity_id: start.activity_id.clone(),
                    workflow_id,
                    attempt: start.attempt,
                    last_heartbeat: start
                        .heartbeat_details
                        .first()
                        .and_then(|p| payloads::to_json(p).ok())
                        .map(|details| HeartbeatDetails::of(&details)),
                    traceparent: traceparent(&start.header_fields),
                },
                deadline,
                // Well within the heartbeat timeout; tasks without one are
                // pumped too, since heartbeat responses carry cancellation.
                heartbeat_every: proto_duration!(start.heartbeat_timeout)
                    .map_or(Duration::from_secs(1), |t| {
                        (t / 3).max(Duration::from_millis(200))
                    }),
                // A type at its limit waits in the session, heartbeated.
                type_slot: None,
                observer: None,
            })))
        }
        Variant::Cancel(cancel) => {
            let reason = match cancel.reason() {
                ActivityCancelReason::Cancelled => CancelReason::Requested,
                ActivityCancelReason::NotFound | ActivityCancelReason::TimedOut => {
                    CancelReason::Gone
                }
                ActivityCancelReason::WorkerShutdown
                | ActivityCancelReason::Paused
                | ActivityCancelReason::Reset => CancelReason::Interrupted,
            };
            Some(Inbound::Cancel {
                key: task.task_token,
                reason,
            })
        }
    }
}

#[async_trait]
impl Connector for TemporalConnector {
    /// Polls sdk-core in the session loop's own task (which never drops a
    /// poll midway: a task taken from the server would be lost).
    async fn next(&self) -> Option<Inbound> {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        loop {
            match self.worker.poll_activity_task().await {
                Ok(task) => {
                    backoff.reset();
                    self.link.polled();
                    if let Some(inbound) = inbound(task, &self.tenant) {
                        return Some(inbound);
                    }
                }
                Err(PollError::ShutDown) => return None,
                Err(e) => {
                    let wait = backoff.upcoming();
                    let e = e.to_string();
                    self.link.poll_failed(&e);
                    tracing::warn!(tenant = %self.tenant, "polling Temporal failed, retrying in {wait:?}: {}", Shown(&e, MAX_LOGGED));
                    backoff.wait().await;
                }
            }
        }
    }

    async fn report(&self, key: &TaskKey, report: Report) -> Result<(), ReportError> {
        let status = match &report {
            Report::Completed(value) => Status::Completed(ar::Success {
                result: Some(payloads::from_json(value)),
            }),
            Report::Failed(f) => Status::Failed(ar::Failure {
                failure: Some(failure::application(f)),
                ..Default::default()
            }),
            Report::Cancelled(f) => Status::Cancelled(ar::Cancellation {
                failure: Some(failure::cancelled(f)),
            }),
        };
        // sdk-core retries transport errors itself and drops reports for
        // tasks the server no longer knows; what it returns is final.
        self.worker
            .complete_activity_task(ActivityTaskCompletion {
                task_token: key.clone(),
                result: Some(ActivityExecutionResult {
                    status: Some(status),
                }),
            })
            .await
            .map_err(|e| ReportError {
                retryable: false,
                message: e.to_string(),
            })
    }

    fn heartbeat(&self, key: &TaskKey, details: Option<&HeartbeatDetails>) {
        self.worker.record_activity_heartbeat(ActivityHeartbeat {
            task_token: key.clone(),
            details: details
                .map(|d| vec![payloads::from_json_text(d.json())])
                .unwrap_or_default(),
        });
    }

    fn stop_polling(&self) {
        self.worker.initiate_shutdown();
    }

    async fn finish(&self) {
        self.worker.shutdown().await;
    }
}
