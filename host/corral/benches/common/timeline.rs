//! Where an activity's time went, by the engine's own timestamps: read back
//! (`DescribeActivityExecution`) once a phase is over, so the reads are no
//! load on the phase they measure. The engine and the bench share this
//! machine's clock.
//!
//! An activity's latency, start to result, is cut in four:
//! - **to scheduled**: the client's start call, until the engine scheduled it;
//! - **queued**: scheduled, until the engine handed it to a worker's poll
//!   (the engine's matching, and a poll of the worker's being there);
//! - **at the worker**: handed over, until the engine recorded its outcome
//!   (the poll's response on its way, the worker's run, its report);
//! - **to the result**: recorded, until the client had the result.

use std::time::{Duration, SystemTime};

use temporalio_client::{ActivityDescribeOptions, ActivityExecutionInfoLike, Client};
use tokio::sync::Semaphore;

/// One activity: its id, and when the client sent its start and had its
/// result (this machine's clock).
pub struct Sent {
    pub id: String,
    pub sent: SystemTime,
    pub received: SystemTime,
}

/// One activity's time, cut in four (see the module's docs).
#[derive(Clone, Copy)]
pub struct Stages([Duration; 4]);

const NAMES: [&str; 4] = ["to scheduled", "queued", "at the worker", "to the result"];

/// The engine's times for `activities`, read `concurrency` at a time; those
/// it could not say (one not found, a time missing) are left out and
/// counted.
pub async fn read(
    client: &Client,
    activities: Vec<Sent>,
    concurrency: usize,
) -> (Vec<Stages>, usize) {
    let permits = std::sync::Arc::new(Semaphore::new(concurrency));
    let mut reads = tokio::task::JoinSet::new();
    for activity in activities {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let client = client.clone();
        reads.spawn(async move {
            let stages = stages_of(&client, &activity).await;
            drop(permit);
            stages
        });
    }
    let (mut stages, mut missing) = (Vec::new(), 0);
    while let Some(read) = reads.join_next().await {
        match read.ok().flatten() {
            Some(one) => stages.push(one),
            None => missing += 1,
        }
    }
    (stages, missing)
}

async fn stages_of(client: &Client, activity: &Sent) -> Option<Stages> {
    let handle = client.get_untyped_activity_handle(activity.id.clone(), None);
    let described = handle
        .describe(ActivityDescribeOptions::default())
        .await
        .ok()?;
    let scheduled = described.schedule_time()?;
    let started = described.last_started_time()?;
    let closed = described.close_time()?;
    let between = |from: SystemTime, to: SystemTime| to.duration_since(from).unwrap_or_default();
    Some(Stages([
        between(activity.sent, scheduled),
        between(scheduled, started),
        between(started, closed),
        between(closed, activity.received),
    ]))
}

/// Each stage's p50 and p99, and how the slowest 1 % (start to result)
/// spent their time on average, one line each.
pub fn summary(stages: &[Stages], missing: usize) -> Vec<String> {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut lines = Vec::new();
    let percentiles: Vec<String> = (0..4)
        .map(|i| {
            let mut times: Vec<Duration> = stages.iter().map(|s| s.0[i]).collect();
            times.sort_unstable();
            format!(
                "{} p50 {:.1} / p99 {:.1} ms",
                NAMES[i],
                ms(super::percentile(&times, 0.5)),
                ms(super::percentile(&times, 0.99))
            )
        })
        .collect();
    lines.push(percentiles.join("; "));
    let mut by_total: Vec<Stages> = stages.to_vec();
    by_total.sort_unstable_by_key(|s| s.0.iter().sum::<Duration>());
    let slowest = &by_total[by_total.len() - by_total.len().div_ceil(100).min(by_total.len())..];
    if !slowest.is_empty() {
        let n = u32::try_from(slowest.len()).unwrap_or(u32::MAX);
        let means: Vec<String> = (0..4)
            .map(|i| {
                let sum: Duration = slowest.iter().map(|s| s.0[i]).sum();
                format!("{} {:.1} ms", NAMES[i], ms(sum / n))
            })
            .collect();
        lines.push(format!(
            "the slowest 1 % ({} activities) on average: {}",
            slowest.len(),
            means.join(", ")
        ));
    }
    if missing > 0 {
        lines.push(format!(
            "{missing} activities the engine could not describe"
        ));
    }
    lines
}
