//! The baselines: the echo activity answered natively in Rust, by a worker
//! on the Temporal Rust SDK (what an activity author would write instead of
//! a component) and by a bare worker on the SDK's worker core (the least any
//! worker can do per task).

use std::sync::Arc;

use anyhow::{Result, bail};
use temporalio_client::{Client, ClientOptions};
use temporalio_common::protos::coresdk::ActivityTaskCompletion;
use temporalio_common::protos::coresdk::activity_result::{
    self as ar, ActivityExecutionResult, activity_execution_result::Status,
};
use temporalio_common::protos::coresdk::activity_task::activity_task::Variant;
use temporalio_common::worker::WorkerTaskTypes;
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};
use temporalio_sdk::runtime::worker_tuner::{FixedSizeSlotSupplier, TunerHolder};
use temporalio_sdk::{Runtime, Worker, WorkerOptions};
use temporalio_sdk_core::{
    CoreRuntime, PollError, WorkerConfig, WorkerVersioningStrategy, init_worker,
};

use crate::{ACTIVITY, CONCURRENCY, connect};

/// Which baseline a `--native-worker` process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `temporalio-sdk` 1.1.1 with an `#[activities]` implementation.
    Sdk,
    /// `temporalio-sdk-core` 0.10.1 polled and completed by hand.
    Core,
}

impl Kind {
    pub const ALL: [Kind; 2] = [Kind::Sdk, Kind::Core];

    /// The name on the command line, the task queue and the report.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Sdk => "sdk",
            Kind::Core => "core",
        }
    }

    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Serves the echo activity on `queue` until killed.
pub async fn serve(kind: Kind, address: &str, queue: &str) -> Result<()> {
    match kind {
        // As the SDK's documentation runs it: from `main` (its `run` is not
        // `Send`); it spawns each activity onto the runtime's workers.
        Kind::Sdk => sdk_worker(address, queue).await,
        // On a runtime worker, as corral's poller is: polling from the main
        // thread would add a thread hop per task to this baseline.
        Kind::Core => {
            let (address, queue) = (address.to_owned(), queue.to_owned());
            tokio::spawn(async move { core_worker(&address, &queue).await }).await?
        }
    }
}

struct Echo;

#[activities]
impl Echo {
    #[activity(name = ACTIVITY)]
    async fn echo_u32(_ctx: ActivityContext, value: u32) -> Result<u32, ActivityError> {
        Ok(value)
    }
}

/// An activity worker as the SDK's documentation shows it, with corral's
/// tenant concurrency as its activity slots.
async fn sdk_worker(address: &str, queue: &str) -> Result<()> {
    let name = Echo::echo_u32.name();
    anyhow::ensure!(
        name == ACTIVITY,
        "the SDK registers `{name}`, not `{ACTIVITY}`"
    );
    let runtime = Runtime::from_current_tokio(Default::default())?;
    let client = Client::new(
        connect(address, crate::grpc_compression()).await?,
        ClientOptions::new("default").build(),
    )?;
    let slots = |n| FixedSizeSlotSupplier::new(n);
    let options = WorkerOptions::new(queue)
        .tuner(
            TunerHolder::builder()
                .workflow_task_slot_supplier(slots(1))
                .activity_task_slot_supplier(slots(CONCURRENCY))
                .local_activity_task_slot_supplier(slots(1))
                .nexus_task_slot_supplier(slots(1))
                .build(),
        )
        .register_activities(Echo)
        .build();
    let mut worker = Worker::new(&runtime, client, options)?;
    worker.run().await?;
    Ok(())
}

/// An activity-only worker core that returns its input, with the same
/// concurrency as corral's tenant.
async fn core_worker(address: &str, queue: &str) -> Result<()> {
    let runtime = CoreRuntime::new_assume_tokio(Default::default())?;
    let config = WorkerConfig::builder()
        .namespace("default")
        .task_queue(queue)
        .task_types(WorkerTaskTypes::activity_only())
        .max_outstanding_activities(CONCURRENCY)
        .versioning_strategy(WorkerVersioningStrategy::None {
            build_id: "native".into(),
        })
        .build()
        .map_err(anyhow::Error::msg)?;
    let worker = Arc::new(init_worker(
        &runtime,
        config,
        connect(address, crate::grpc_compression()).await?,
    )?);
    loop {
        let task = match worker.poll_activity_task().await {
            Ok(task) => task,
            Err(PollError::ShutDown) => return Ok(()),
            Err(e) => bail!("poll: {e}"),
        };
        let Some(Variant::Start(start)) = task.variant else {
            continue;
        };
        let worker = worker.clone();
        tokio::spawn(async move {
            let status = Status::Completed(ar::Success {
                result: start.input.first().cloned(),
            });
            let _ = worker
                .complete_activity_task(ActivityTaskCompletion {
                    task_token: task.task_token,
                    result: Some(ActivityExecutionResult {
                        status: Some(status),
                    }),
                })
                .await;
        });
    }
}
