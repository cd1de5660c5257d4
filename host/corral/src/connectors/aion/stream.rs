//! The worker stream: register, serve frames until the stream ends, and
//! reconnect. Tasks already running keep running across a reconnect; their
//! results are reported on whichever stream is registered when they end.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;
use tonic::metadata::MetadataValue;

use super::wire::worker_protocol_client::WorkerProtocolClient;
use super::wire::{self, server_to_worker::Message as ServerFrame, worker_to_server::Message};
use super::{MAX_LOGGED, Shared, frames};
use corral_core::backoff::{Backoff, Try, patiently};
use corral_core::session::{CancelReason, Inbound};
use corral_core::shown::Shown;
use corral_core::sync::lock;

const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// A registered stream.
pub(super) struct Connection {
    sender: mpsc::UnboundedSender<wire::WorkerToServer>,
    frames: Streaming<wire::ServerToWorker>,
    ack: wire::RegisterAck,
    /// The activity types it was registered with.
    registered: Vec<wire::ActivityDescriptor>,
}

/// Why registering failed.
pub(super) enum Failed {
    /// The server could not be reached or the stream broke: try again.
    Transport(String),
    /// The server refused the registration (contract mismatch, denied
    /// namespace, malformed registration): trying again changes nothing
    /// until the workflow, the component or the configuration does.
    Refused(String),
}

impl Failed {
    fn message(&self) -> &str {
        match self {
            Failed::Transport(m) | Failed::Refused(m) => m,
        }
    }
}

/// A registration under way.
type Registering<'a> = Pin<Box<dyn Future<Output = Result<Connection, Failed>> + Send + 'a>>;

/// How a stream ended.
enum End {
    /// The server announced a drain and everything this worker held is
    /// reported and acknowledged (or the stream ended): reconnect from the
    /// first backoff.
    Drained,
    Dropped(String),
    /// The tenant's activity types changed and a new registration took
    /// over; the old stream's frames still in flight are read by
    /// [`drain`].
    Replaced(Box<(Connection, Streaming<wire::ServerToWorker>)>),
    /// The connector finished.
    Closed,
}

/// The first registration: unreachable servers are retried for `patience`,
/// a refusal is an error at once.
pub(super) async fn register_patiently(
    shared: &Shared,
    patience: Duration,
) -> anyhow::Result<Connection> {
    let attempt = || async {
        match register(shared).await {
            Ok(connection) => Try::Done(connection),
            Err(Failed::Transport(e)) => Try::Again(Failed::Transport(e)),
            Err(refused) => Try::Fail(refused),
        }
    };
    let backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
    let registered = patiently(patience, backoff, attempt, |failed, wait| {
        tracing::warn!(
            "cannot reach the Aion server at {} yet, retrying in {wait:?}: {}",
            shared.binding.address,
            Shown(failed.message(), MAX_LOGGED)
        );
    })
    .await;
    match registered {
        Ok(connection) => Ok(connection),
        Err(Failed::Transport(e)) => Err(anyhow::anyhow!(e)).with_context(|| {
            format!(
                "tenant `{}`: cannot reach the Aion server at {} (is `aion server` running?)",
                shared.tenant, shared.binding.address
            )
        }),
        Err(Failed::Refused(e)) => Err(anyhow::anyhow!(e)),
    }
}

/// Opens a stream and registers the tenant's current activity types.
async fn register(shared: &Shared) -> Result<Connection, Failed> {
    let binding = &shared.binding;
    let endpoint = tonic::transport::Endpoint::from_shared(binding.address.clone())
        .map_err(|e| Failed::Refused(format!("`{}`: {e}", binding.address)))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| Failed::Transport(with_sources(&e)))?;
    let registered = frames::descriptors(&shared.registry, &shared.tenant);
    let (sender, receiver) = mpsc::unbounded_channel();
    // The server reads the registration before it answers the call.
    let _ = sender.send(wire::WorkerToServer {
        message: Some(Message::Register(wire::RegisterWorker {
            namespaces: vec![binding.namespace.clone()],
            activity_types: registered.iter().map(|d| d.name.clone()).collect(),
            task_queue: binding.task_queue.clone(),
            node: binding.node.clone(),
            activities: registered.clone(),
            identity: super::super::identity(),
            max_concurrency: Some(shared.max_concurrency),
        })),
    });
    let mut request = tonic::Request::new(UnboundedReceiverStream::new(receiver));
    for (key, value) in [
        ("x-aion-namespaces", binding.namespace.as_str()),
        ("x-aion-subject", "corral"),
    ] {
        let value = MetadataValue::try_from(value)
            .map_err(|_| Failed::Refused(format!("`{value}` cannot be sent as gRPC metadata")))?;
        request.metadata_mut().insert(key, value);
    }
    let refused = |status: tonic::Status| {
        let message = format!(
            "tenant `{}`: the Aion server at {} refused to register task queue `{}` \
             (namespace `{}`): {:?}: {}",
            shared.tenant,
            binding.address,
            binding.task_queue,
            binding.namespace,
            status.code(),
            status.message()
        );
        match status.code() {
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
                Failed::Transport(message)
            }
            _ => Failed::Refused(message),
        }
    };
    let mut frames = WorkerProtocolClient::new(channel)
        .stream_worker(request)
        .await
        .map_err(refused)?
        .into_inner();
    let ack = match frames.message().await.map_err(refused)? {
        Some(wire::ServerToWorker {
            message: Some(ServerFrame::RegisterAck(ack)),
        }) => ack,
        other => {
            // Named by its kind: the frame's own text (a task's whole
            // input) is the server's, of any size.
            let got = match other {
                None => "the end of the stream",
                Some(wire::ServerToWorker { message: None }) => "an empty frame",
                Some(wire::ServerToWorker {
                    message: Some(frame),
                }) => frame_kind(&frame),
            };
            return Err(Failed::Transport(format!(
                "the Aion server answered the registration with {got}, not an acknowledgement"
            )));
        }
    };
    if ack.accepted_max_concurrency != shared.max_concurrency {
        tracing::warn!(
            tenant = %shared.tenant,
            "the Aion server recorded a concurrency of {} for this worker, not {}",
            ack.accepted_max_concurrency,
            shared.max_concurrency
        );
    }
    Ok(Connection {
        sender,
        frames,
        ack,
        registered,
    })
}

/// An error with its causes, each said once (tonic's transport errors
/// repeat their source's text in their own).
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text = format!("{text}: {part}");
        }
        source = s.source();
    }
    text
}

/// Serves streams until the connector finishes: after a drop or a drain,
/// registers again with capped exponential backoff from the first.
pub(super) async fn drive(
    shared: Arc<Shared>,
    first: Connection,
    inbound: mpsc::UnboundedSender<Inbound>,
) {
    let mut connection = first;
    loop {
        let end = serve(&shared, connection, &inbound).await;
        *lock(&shared.outbound) = None;
        match end {
            End::Closed => return,
            End::Replaced(replaced) => {
                let (next, old) = *replaced;
                tokio::spawn(drain(shared.clone(), old, inbound.clone()));
                connection = next;
                continue;
            }
            End::Drained => {
                shared
                    .link
                    .down("the Aion server drained this worker; registering again");
                tracing::info!(tenant = %shared.tenant, "drained: everything reported; registering again");
            }
            End::Dropped(e) => {
                shared.link.down(&format!("the Aion stream dropped: {e}"));
                tracing::warn!(tenant = %shared.tenant, "the Aion stream dropped: {}", Shown(&e, MAX_LOGGED));
            }
        }
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        connection = loop {
            tokio::select! {
                () = shared.closing.cancelled() => return,
                () = backoff.wait() => {}
            }
            match register(&shared).await {
                Ok(connection) => break connection,
                Err(failed) => {
                    let wait = backoff.upcoming();
                    match &failed {
                        Failed::Refused(message) => {
                            tracing::error!(tenant = %shared.tenant, "{}", Shown(message, MAX_LOGGED))
                        }
                        Failed::Transport(message) => tracing::warn!(
                            tenant = %shared.tenant,
                            "reconnecting to the Aion server failed, retrying in {wait:?}: {}",
                            Shown(message, MAX_LOGGED)
                        ),
                    }
                }
            }
        };
    }
}

/// Serves one registered stream until it ends.
async fn serve(
    shared: &Shared,
    connection: Connection,
    inbound: &mpsc::UnboundedSender<Inbound>,
) -> End {
    let Connection {
        sender,
        mut frames,
        ack,
        registered,
    } = connection;
    let window = Duration::from_millis(ack.heartbeat_window_ms);
    if !window.is_zero() {
        *lock(&shared.window) = window;
    }
    *lock(&shared.outbound) = Some(sender);
    shared.link.up();
    let resent = shared.resend_backlog();
    tracing::info!(
        tenant = %shared.tenant,
        worker_id = ack.worker_id,
        "registered with the Aion server ({} activity type(s), heartbeat window {:?}{})",
        registered.len(),
        *lock(&shared.window),
        if resent > 0 { format!(", {resent} unacknowledged result(s) re-reported") } else { String::new() }
    );
    let mut lease = tokio::time::interval(shared.heartbeat_every());
    let mut changes = shared.registry.subscribe();
    // A registration runs beside this stream, which is served meanwhile
    // (liveness pings answered, acknowledgements read, tasks taken). One
    // starts at once when the types changed while this one registered.
    let mut replacing: Option<Registering<'_>> = None;
    if frames::descriptors(&shared.registry, &shared.tenant) != registered {
        replacing = Some(Box::pin(register(shared)));
    }
    let mut drained = false;
    loop {
        tokio::select! {
            () = shared.closing.cancelled() => return End::Closed,
            // Drained and done: close this stream (the server waits for it)
            // and register again, with the restarted server or another.
            () = settled(shared), if drained => return End::Drained,
            _ = lease.tick() => {
                // Without ids a heartbeat renews the connection's lease.
                shared.send(Message::Heartbeat(wire::Heartbeat::default()));
            }
            Ok(()) = changes.changed(), if replacing.is_none() => {
                let now = frames::descriptors(&shared.registry, &shared.tenant);
                if now != registered {
                    replacing = Some(Box::pin(register(shared)));
                }
            }
            result = finished(&mut replacing) => {
                replacing = None;
                match result {
                    Ok(next) => return End::Replaced(Box::new((next, frames))),
                    Err(failed) => tracing::error!(
                        tenant = %shared.tenant,
                        "the new activity types are not served on Aion (still serving the previous ones): {}",
                        Shown(failed.message(), MAX_LOGGED)
                    ),
                }
            }
            frame = frames.message() => match frame {
                Ok(Some(wire::ServerToWorker { message: Some(frame) })) => {
                    if let Some(drain) = handle(shared, frame, inbound) {
                        drained |= drain;
                    }
                }
                Ok(Some(_)) => tracing::warn!(tenant = %shared.tenant, "an empty frame from the Aion server"),
                Ok(None) if drained => return End::Drained,
                Ok(None) => return End::Dropped("the server closed the stream".to_owned()),
                Err(_) if drained => return End::Drained,
                Err(status) => return End::Dropped(format!("{:?}: {}", status.code(), status.message())),
            },
        }
    }
}

/// The outcome of a registration under way; never resolves without one.
async fn finished(registration: &mut Option<Registering<'_>>) -> Result<Connection, Failed> {
    match registration {
        Some(registration) => registration.await,
        None => std::future::pending().await,
    }
}

/// How long a replaced stream is read for frames the server sent before it
/// saw the new registration.
const DRAIN_PATIENCE: Duration = Duration::from_secs(60);

/// Reads a replaced stream until the server ends it (this worker's side
/// of it is closed): a task, cancel or acknowledgement sent on it while the
/// new stream registered is acted on, not dropped.
async fn drain(
    shared: Arc<Shared>,
    mut old: Streaming<wire::ServerToWorker>,
    inbound: mpsc::UnboundedSender<Inbound>,
) {
    let read = async {
        while let Ok(Some(wire::ServerToWorker {
            message: Some(frame),
        })) = old.message().await
        {
            // A drain of a stream already replaced asks nothing more.
            let _ = handle(&shared, frame, &inbound);
        }
    };
    tokio::select! {
        () = read => {}
        () = shared.closing.cancelled() => {}
        () = tokio::time::sleep(DRAIN_PATIENCE) => {
            tracing::debug!(tenant = %shared.tenant, "a replaced Aion stream was still open; no longer read");
        }
    }
}

/// Returns once no task is held and every result is acknowledged.
async fn settled(shared: &Shared) {
    loop {
        let changed = shared.changed.notified();
        let acked = shared.acked.notified();
        tokio::pin!(changed, acked);
        changed.as_mut().enable();
        acked.as_mut().enable();
        if shared.idle() && lock(&shared.unacked).is_empty() {
            return;
        }
        tokio::select! {
            () = changed => {}
            () = acked => {}
        }
    }
}

/// What a server frame is, in the host's words.
fn frame_kind(frame: &ServerFrame) -> &'static str {
    match frame {
        ServerFrame::Task(_) => "a task",
        ServerFrame::CancelActivity(_) => "a cancel",
        ServerFrame::ResultAck(_) => "a result's acknowledgement",
        ServerFrame::LivenessPing(_) => "a liveness ping",
        ServerFrame::Drain(_) => "a drain",
        ServerFrame::RegisterAck(_) => "a registration's acknowledgement",
    }
}

/// Acts on one server frame; `Some(true)` for a drain.
fn handle(
    shared: &Shared,
    frame: ServerFrame,
    inbound: &mpsc::UnboundedSender<Inbound>,
) -> Option<bool> {
    match frame {
        ServerFrame::Task(task) => {
            if let Some(start) = shared.accept(task) {
                let _ = inbound.send(start);
            }
        }
        ServerFrame::CancelActivity(cancel) => {
            let pair = (
                cancel.workflow_id.map(|w| w.uuid).unwrap_or_default(),
                cancel.activity_id.map_or(0, |a| a.sequence_position),
            );
            for key in shared.keys_of(&pair) {
                let _ = inbound.send(Inbound::Cancel {
                    key,
                    reason: CancelReason::Requested,
                });
            }
        }
        ServerFrame::ResultAck(ack) => {
            let pair = (
                ack.workflow_id.map(|w| w.uuid).unwrap_or_default(),
                ack.activity_id.map_or(0, |a| a.sequence_position),
            );
            shared.acknowledge(&pair);
        }
        ServerFrame::LivenessPing(ping) => {
            shared.send(Message::LivenessAnswer(wire::LivenessAnswer {
                liveness_ping: ping.liveness_ping,
            }));
        }
        ServerFrame::Drain(_) => {
            tracing::info!(tenant = %shared.tenant, "the Aion server is draining this worker: finishing and reporting what runs here");
            return Some(true);
        }
        ServerFrame::RegisterAck(_) => {
            tracing::warn!(tenant = %shared.tenant, "a second registration acknowledgement on one stream; ignored");
        }
    }
    None
}
