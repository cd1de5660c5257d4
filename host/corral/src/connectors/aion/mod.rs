//! The Aion connector: a corral tenant as an Aion worker. Aion pushes tasks
//! down one registered bidirectional stream (`aion.WorkerProtocol/
//! StreamWorker`); this connector registers the tenant's activity types with
//! JSON Schemas derived from their WIT signatures, answers liveness pings,
//! renews the connection lease, refuses tasks it has no tenant permit for,
//! keeps every result until the server acknowledges it (re-reporting the
//! backlog after a reconnect), closes a drained stream once everything is
//! acknowledged, reconnects with capped backoff, and re-registers when the
//! tenant's activity types change.
//!
//! corral carries its own definition of the protocol (`proto/aion/
//! worker.proto`): the published `aion-proto-generated` crate pins a
//! `tonic-prost` that conflicts with Temporal's, and is AGPL-licensed.

mod frames;
mod stream;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::MAX_LOGGED;
use crate::config::AionBinding;
use crate::health::EngineLink;
use corral_core::session::{
    Connector, HeartbeatDetails, Inbound, Permit, Permits, Registry, Report, ReportError, TaskKey,
    TenantSlots, TypeAdmission,
};
use corral_core::shown::{MAX_NAME, Shown};
use corral_core::sync::lock;
use frames::Attempt;

/// The protocol's generated client and messages.
#[allow(clippy::all, clippy::pedantic)]
pub mod wire {
    tonic::include_proto!("aion");
}

/// How long a report waits for the server's acknowledgement before the
/// session loop retries it.
const ACK_WAIT: Duration = Duration::from_secs(10);
/// The least time between two heartbeats of one task.
const HEARTBEAT_THROTTLE: Duration = Duration::from_millis(250);
/// Aion's default heartbeat window, until the server states its own.
const DEFAULT_WINDOW: Duration = Duration::from_secs(30);

/// One tenant's Aion worker.
pub struct AionConnector {
    shared: Arc<Shared>,
    inbound: tokio::sync::Mutex<mpsc::UnboundedReceiver<Inbound>>,
    driver: Mutex<Option<JoinHandle<()>>>,
}

/// A task accepted from the server and not yet reported.
struct Held {
    attempt: Attempt,
    last_beat: Option<Instant>,
    _permit: Permit,
}

/// A result sent and not yet acknowledged, with the (workflow, activity)
/// pair the acknowledgement names.
struct Unacked {
    pair: (String, u64),
    frame: wire::ActivityResult,
}

/// What the connector and its stream driver share.
struct Shared {
    tenant: String,
    binding: AionBinding,
    registry: Arc<Registry>,
    /// For the activity types' own limits.
    permits: Permits,
    /// The tenant's own slots, held rather than looked up per task.
    slots: TenantSlots,
    max_concurrency: u32,
    /// The current stream, while one is registered.
    outbound: Mutex<Option<mpsc::UnboundedSender<wire::WorkerToServer>>>,
    held: Mutex<HashMap<TaskKey, Held>>,
    /// Results sent and not yet acknowledged, re-sent on every new stream.
    unacked: Mutex<HashMap<TaskKey, Unacked>>,
    acked: Notify,
    /// A held task was released, or polling stopped.
    changed: Notify,
    window: Mutex<Duration>,
    stopping: CancellationToken,
    closing: CancellationToken,
    /// Its readiness: up while a stream is registered.
    link: Arc<EngineLink>,
}

impl Shared {
    /// Sends a frame on the current stream; without one, the frame is
    /// dropped (results are kept in `unacked` and re-sent on reconnect).
    fn send(&self, message: wire::worker_to_server::Message) -> bool {
        let sender = lock(&self.outbound).clone();
        sender.is_some_and(|s| {
            s.send(wire::WorkerToServer {
                message: Some(message),
            })
            .is_ok()
        })
    }

    fn heartbeat_every(&self) -> Duration {
        (*lock(&self.window) / 4).max(HEARTBEAT_THROTTLE)
    }

    /// Accepts a pushed task when the tenant has a free permit; otherwise
    /// refuses it, so the server re-parks it for another worker or later.
    fn accept(&self, task: wire::ActivityTask) -> Option<Inbound> {
        let (attempt, mut start) = match frames::task(task, &self.tenant, self.heartbeat_every()) {
            Ok(parsed) => parsed,
            Err(e) => {
                let e = e.to_string();
                tracing::warn!(tenant = %self.tenant, "ignoring a malformed task: {}", Shown(&e, MAX_LOGGED));
                return None;
            }
        };
        // The engine's text: escaped and bounded in the log.
        let activity_type = Shown(&start.activity_type, MAX_NAME).to_string();
        let refuse = |reason: String| {
            tracing::info!(tenant = %self.tenant, %activity_type, "refusing a task: {reason}");
            self.send(attempt.refusal(reason));
            None
        };
        // Pushed again while it runs here: the running one reports. Run
        // twice, it held two permits' worth under one entry (and gave one
        // back early); refused, the server would hand it to another worker.
        // Checked and taken under one lock: the stream being replaced and
        // its successor accept at once.
        let mut held = lock(&self.held);
        if held.contains_key(&start.key) {
            tracing::info!(tenant = %self.tenant, %activity_type, "a task pushed again while it runs here: its run reports");
            return None;
        }
        // Pushed again after it ended here, its result not yet
        // acknowledged (lost on the way, or crossed with the push): the
        // result goes again; the task does not run twice. A report moves
        // its task from `held` to `unacked` under the `held` lock, so one
        // of the two has it.
        let sent = lock(&self.unacked).get(&start.key).map(|u| u.frame.clone());
        if let Some(frame) = sent {
            drop(held);
            tracing::info!(tenant = %self.tenant, %activity_type, "a task pushed again after it ended here: its result is sent again");
            self.send(wire::worker_to_server::Message::Result(frame));
            return None;
        }
        // Only a task new here is refused for shutting down: one running
        // or ended here is answered above (refused, the server would hand
        // it to another worker, a second run).
        if self.stopping.is_cancelled() {
            return refuse("the worker is shutting down".to_owned());
        }
        let names = self
            .permits
            .type_names(&self.registry, &self.tenant, &start.activity_type);
        // Taken, not just checked: the next task pushed must see it gone.
        start.type_slot = match self.permits.try_type_slot(&self.tenant, &names) {
            TypeAdmission::Unlimited => None,
            TypeAdmission::Held(slot) => Some(slot),
            TypeAdmission::Full => {
                return refuse(format!(
                    "activity type `{activity_type}` is at its own concurrency limit"
                ));
            }
        };
        let Some(permit) = self.slots.try_acquire() else {
            return refuse(format!(
                "tenant `{}` is at its concurrency limit",
                self.tenant
            ));
        };
        let task = Held {
            attempt,
            last_beat: None,
            _permit: permit,
        };
        held.insert(start.key.clone(), task);
        drop(held);
        Some(Inbound::Start(Box::new(start)))
    }

    /// Every running task of the (workflow, activity) pair the server named.
    fn keys_of(&self, pair: &(String, u64)) -> Vec<TaskKey> {
        lock(&self.held)
            .iter()
            .filter(|(_, h)| &h.attempt.pair() == pair)
            .map(|(key, _)| key.clone())
            .collect()
    }

    fn acknowledge(&self, pair: &(String, u64)) {
        lock(&self.unacked).retain(|_, u| &u.pair != pair);
        self.acked.notify_waiters();
    }

    /// Re-sends every result the server has not acknowledged.
    fn resend_backlog(&self) -> usize {
        let backlog: Vec<wire::ActivityResult> = lock(&self.unacked)
            .values()
            .map(|u| u.frame.clone())
            .collect();
        let count = backlog.len();
        for frame in backlog {
            self.send(wire::worker_to_server::Message::Result(frame));
        }
        count
    }

    fn idle(&self) -> bool {
        lock(&self.held).is_empty()
    }
}

impl AionConnector {
    /// Registers the tenant's activity types with the server (retrying for
    /// up to `patience` while it is unreachable), then serves the stream.
    /// A registration the server refuses is an error naming its reason.
    pub async fn connect(
        tenant: &str,
        binding: &AionBinding,
        registry: Arc<Registry>,
        permits: Permits,
        patience: Duration,
        link: Arc<EngineLink>,
    ) -> anyhow::Result<Self> {
        let slots = permits.slots_of(tenant)?;
        let max_concurrency = u32::try_from(slots.usage().limit).unwrap_or(u32::MAX);
        let shared = Arc::new(Shared {
            tenant: tenant.to_owned(),
            binding: binding.clone(),
            registry,
            permits,
            slots,
            max_concurrency,
            outbound: Mutex::new(None),
            held: Mutex::new(HashMap::new()),
            unacked: Mutex::new(HashMap::new()),
            acked: Notify::new(),
            changed: Notify::new(),
            window: Mutex::new(DEFAULT_WINDOW),
            stopping: CancellationToken::new(),
            closing: CancellationToken::new(),
            link,
        });
        let first = stream::register_patiently(&shared, patience).await?;
        let (sender, receiver) = mpsc::unbounded_channel();
        let driver = tokio::spawn(stream::drive(shared.clone(), first, sender));
        Ok(AionConnector {
            shared,
            inbound: tokio::sync::Mutex::new(receiver),
            driver: Mutex::new(Some(driver)),
        })
    }
}

#[async_trait]
impl Connector for AionConnector {
    async fn next(&self) -> Option<Inbound> {
        let mut inbound = self.inbound.lock().await;
        loop {
            let changed = self.shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            // Once stopping, cancels still arrive while tasks run.
            if self.shared.stopping.is_cancelled() && self.shared.idle() {
                return None;
            }
            tokio::select! {
                received = inbound.recv() => return received,
                () = changed => {}
            }
        }
    }

    async fn report(&self, key: &TaskKey, report: Report) -> Result<(), ReportError> {
        let shared = &self.shared;
        // The frame is built outside the lock (a result of up to the output
        // limit); only a report takes a task out of `held`, so it is still
        // there after.
        let attempt = lock(&shared.held).get(key).map(|h| h.attempt.clone());
        let frame = match attempt {
            Some(attempt) => {
                let frame = attempt.result(&report);
                let unacked = Unacked {
                    pair: attempt.pair(),
                    frame: frame.clone(),
                };
                // From `held` to `unacked` under the `held` lock: a push of
                // this task in between finds it in one of the two (see
                // `accept`).
                let held = {
                    let mut running = lock(&shared.held);
                    lock(&shared.unacked).insert(key.clone(), unacked);
                    running.remove(key)
                };
                // The permit goes back with `held`: the task is done.
                drop(held);
                shared.changed.notify_waiters();
                frame
            }
            None => match lock(&shared.unacked).get(key) {
                Some(unacked) => unacked.frame.clone(),
                None => return Ok(()),
            },
        };
        shared.send(wire::worker_to_server::Message::Result(frame));
        let give_up = tokio::time::sleep(ACK_WAIT);
        tokio::pin!(give_up);
        loop {
            let acked = shared.acked.notified();
            tokio::pin!(acked);
            acked.as_mut().enable();
            if !lock(&shared.unacked).contains_key(key) {
                return Ok(());
            }
            tokio::select! {
                () = acked => {}
                () = &mut give_up => break,
            }
        }
        if shared.closing.is_cancelled() || shared.stopping.is_cancelled() {
            lock(&shared.unacked).remove(key);
            return Err(ReportError {
                retryable: false,
                message: format!(
                    "the Aion server did not acknowledge the result within {ACK_WAIT:?} while \
                     shutting down; it re-dispatches the activity once its heartbeats stop"
                ),
            });
        }
        Err(ReportError {
            retryable: true,
            message: format!("no acknowledgement from the Aion server within {ACK_WAIT:?}"),
        })
    }

    fn heartbeat(&self, key: &TaskKey, details: Option<&HeartbeatDetails>) {
        let frame = {
            let mut held = lock(&self.shared.held);
            let Some(task) = held.get_mut(key) else {
                return;
            };
            let now = Instant::now();
            if task
                .last_beat
                .is_some_and(|at| now.duration_since(at) < HEARTBEAT_THROTTLE)
            {
                return;
            }
            task.last_beat = Some(now);
            task.attempt.heartbeat(details)
        };
        self.shared.send(frame);
    }

    fn stop_polling(&self) {
        self.shared.stopping.cancel();
        self.shared.changed.notify_waiters();
    }

    async fn finish(&self) {
        self.shared.closing.cancel();
        let driver = lock(&self.driver).take();
        if let Some(driver) = driver {
            let _ = driver.await;
        }
    }
}

#[cfg(test)]
mod tests;
