//! The connector against a scripted Aion server (a real gRPC server in this
//! process): liveness answers, refusals at the tenant's limit, and a result
//! the server never acknowledged re-reported on the next stream.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::wire::worker_protocol_server::{WorkerProtocol, WorkerProtocolServer};
use super::wire::{self, server_to_worker::Message as Down, worker_to_server::Message as Up};
use super::*;
use crate::config::AionBinding;
use corral_core::sandbox::{Sandbox, SandboxConfig, Tenant};
use corral_core::session::{Permits, Registry, Session};

/// Every frame a worker sent, with the number of the stream it came on.
type Seen = Arc<Mutex<Vec<(usize, Up)>>>;

struct Scripted {
    streams: AtomicUsize,
    seen: Seen,
    /// The concurrency the worker must advertise.
    limit: u32,
    script: Script,
    /// The first stream's way down, for frames pushed on it later.
    first_sender: Mutex<Option<mpsc::UnboundedSender<Result<wire::ServerToWorker, Status>>>>,
}

/// What the scripted server does beyond acknowledging registrations.
#[derive(Default)]
struct Script {
    /// Pushed on the first stream after its ack.
    first: Vec<Down>,
    /// The first stream breaks when a result arrives, before acknowledging.
    break_first: bool,
    /// Pushed on the first stream when a second registration arrives; that
    /// one's ack then waits for `release`.
    on_replace: Vec<Down>,
    release: Arc<tokio::sync::Notify>,
    /// Pushed on the first stream right after the second one's ack.
    after_replace: Vec<Down>,
    /// The first result is not acknowledged: its task is pushed again
    /// instead (as a server that lost the result, or whose push crossed
    /// it, does).
    repush_first_result: bool,
}

fn ping(liveness_ping: u64) -> Down {
    Down::LivenessPing(wire::LivenessPing {
        liveness_ping,
        silence_window_ms: 2000,
    })
}

fn task(token: &str) -> Down {
    task_at(token, 1)
}

fn task_at(token: &str, sequence_position: u64) -> Down {
    task_of("w", sequence_position, token)
}

fn task_of(workflow: &str, sequence_position: u64, token: &str) -> Down {
    Down::Task(wire::ActivityTask {
        workflow_id: Some(wire::WorkflowId {
            uuid: workflow.into(),
        }),
        activity_id: Some(wire::ActivityId { sequence_position }),
        activity_type: "answer".into(),
        input: Some(frames::payload(&serde_json::json!({}))),
        attempt: 1,
        run_id: Some(wire::RunId { uuid: "r".into() }),
        completion_token: token.into(),
    })
}

#[tonic::async_trait]
impl WorkerProtocol for Scripted {
    type StreamWorkerStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<wire::ServerToWorker, Status>> + Send>>;

    async fn stream_worker(
        &self,
        request: Request<Streaming<wire::WorkerToServer>>,
    ) -> Result<Response<Self::StreamWorkerStream>, Status> {
        let mut up = request.into_inner();
        let Some(wire::WorkerToServer {
            message: Some(Up::Register(register)),
        }) = up.message().await?
        else {
            return Err(Status::invalid_argument("register first"));
        };
        assert_eq!(register.max_concurrency, Some(self.limit));
        assert!(register.activity_types.contains(&"answer".to_owned()));
        let stream = self.streams.fetch_add(1, Ordering::SeqCst);
        let (down, receiver) = mpsc::unbounded_channel();
        let push = |down: &mpsc::UnboundedSender<_>, frame: Down| {
            let _ = down.send(Ok(wire::ServerToWorker {
                message: Some(frame),
            }));
        };
        let ack = Down::RegisterAck(wire::RegisterAck {
            worker_id: 1,
            namespace: "default".into(),
            heartbeat_window_ms: 2000,
            accepted_max_concurrency: self.limit,
        });
        let first = self.first_sender.lock().unwrap().clone();
        match first {
            Some(first) if stream == 1 && !self.script.on_replace.is_empty() => {
                for frame in &self.script.on_replace {
                    push(&first, frame.clone());
                }
                let (release, after) = (
                    self.script.release.clone(),
                    self.script.after_replace.clone(),
                );
                let down = down.clone();
                tokio::spawn(async move {
                    release.notified().await;
                    push(&down, ack);
                    for frame in after {
                        push(&first, frame);
                    }
                });
            }
            _ => push(&down, ack),
        }
        if stream == 0 {
            // Kept only for a replacement to come: it holds the stream open.
            if !self.script.on_replace.is_empty() {
                *self.first_sender.lock().unwrap() = Some(down.clone());
            }
            for frame in &self.script.first {
                push(&down, frame.clone());
            }
        }
        let send = move |frame: Down| push(&down, frame);
        let break_first = self.script.break_first;
        let mut repush = self.script.repush_first_result;
        let seen = self.seen.clone();
        tokio::spawn(async move {
            while let Ok(Some(wire::WorkerToServer {
                message: Some(frame),
            })) = up.message().await
            {
                if let (Up::Result(r), true) = (&frame, repush) {
                    repush = false;
                    let workflow = r.workflow_id.clone().unwrap_or_default().uuid;
                    let position = r.activity_id.unwrap_or_default().sequence_position;
                    seen.lock().unwrap().push((stream, frame.clone()));
                    send(task_of(&workflow, position, &r.completion_token));
                    continue;
                }
                let ack = match &frame {
                    Up::Result(r) => Some(Down::ResultAck(wire::ResultAck {
                        workflow_id: r.workflow_id.clone(),
                        activity_id: r.activity_id,
                    })),
                    _ => None,
                };
                seen.lock().unwrap().push((stream, frame));
                if ack.is_some() && stream == 0 && break_first {
                    // The first stream breaks before acknowledging.
                    return;
                }
                if let Some(ack) = ack {
                    send(ack);
                }
            }
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(
            receiver,
        ))))
    }
}

/// `answer`'s spin for a task that must still hold its permits when the
/// task pushed right behind it is read: about half a second of guest work
/// (one that returned at once could end first and give them back, on a
/// loaded host).
const HOLDS_ITS_PERMITS: u32 = 500_000_000;

/// A component whose `answer` returns 42 after `spin` loop iterations.
fn answer(spin: u32) -> String {
    format!(
        r#"(component
            (core module $m
              (func (export "answer") (result i32) (local i32)
                (loop $l
                  (local.set 0 (i32.add (local.get 0) (i32.const 1)))
                  (br_if $l (i32.lt_u (local.get 0) (i32.const {spin}))))
                i32.const 42))
            (core instance $i (instantiate $m))
            (func (export "answer") (result u32) (canon lift (core func $i "answer"))))"#
    )
}

/// A session serving tenant `t` through the connector, against a scripted
/// server that pushes `first` on its first stream.
struct Served {
    session: Arc<Session>,
    registry: Arc<Registry>,
    seen: Seen,
    shutdown: CancellationToken,
    serving: tokio::task::JoinHandle<usize>,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

async fn serve(
    first: Vec<Down>,
    component: &str,
    limit: usize,
    type_limits: &[(&str, usize)],
) -> Served {
    let script = Script {
        first,
        break_first: true,
        ..Script::default()
    };
    serve_script(script, component, limit, type_limits).await
}

async fn serve_script(
    script: Script,
    component: &str,
    limit: usize,
    type_limits: &[(&str, usize)],
) -> Served {
    let seen: Seen = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(WorkerProtocolServer::new(Scripted {
                streams: AtomicUsize::new(0),
                seen: seen.clone(),
                limit: limit as u32,
                script,
                first_sender: Mutex::new(None),
            }))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );

    let sandbox = Sandbox::new(SandboxConfig {
        max_instances: 4,
        ..SandboxConfig::default()
    })
    .unwrap();
    let component = sandbox.load(&wat::parse_str(component).unwrap()).unwrap();
    let registry = Arc::new(Registry::default());
    let tenant = Tenant {
        name: "t".into(),
        ..Tenant::default()
    };
    let tenant = sandbox.prepare(tenant).unwrap();
    registry.set_tenant(tenant, &[component], &[]).unwrap();
    let permits = Permits::new(4, [("t".to_owned(), limit)])
        .with_type_limits("t", type_limits.iter().map(|(n, l)| ((*n).to_owned(), *l)));
    let binding = AionBinding {
        address: format!("http://{address}"),
        namespace: "default".into(),
        task_queue: "q".into(),
        node: String::new(),
    };
    let connector = AionConnector::connect(
        "t",
        &binding,
        registry.clone(),
        permits.clone(),
        Duration::from_secs(5),
        crate::health::Health::new(["t"]).link("t"),
    )
    .await
    .unwrap();
    let session = Session::new(sandbox, registry.clone(), Default::default(), permits);
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn({
        let (session, shutdown) = (session.clone(), shutdown.clone());
        async move {
            session
                .serve(Arc::new(connector), shutdown, Duration::from_secs(1))
                .await
        }
    });
    Served {
        session,
        registry,
        seen,
        shutdown,
        serving,
        server,
    }
}

impl Served {
    /// Waits (at most a minute) until `done` holds of the frames seen.
    async fn until(&self, done: impl Fn(&[(usize, Up)]) -> bool) {
        for _ in 0..1200 {
            if done(&self.seen.lock().unwrap()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("not seen: {:?}", self.seen.lock().unwrap());
    }

    async fn stop(self) {
        self.shutdown.cancel();
        // A report the script never acknowledges waits `ACK_WAIT` before
        // shutdown gives it up: the session stops within that, plus margin
        // for a loaded machine (a 10 s bound here raced the 10 s wait).
        tokio::time::timeout(super::ACK_WAIT * 3, self.serving)
            .await
            .expect("the session stops")
            .unwrap();
        self.server.abort();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unacknowledged_result_is_reported_again_on_the_next_stream() {
    let first = vec![
        Down::LivenessPing(wire::LivenessPing {
            liveness_ping: 7,
            silence_window_ms: 2000,
        }),
        task("t1"),
        // Over the limit of one: refused, not queued.
        task("t2"),
    ];
    let served = serve(first, &answer(HOLDS_ITS_PERMITS), 1, &[]).await;
    let (session, seen) = (served.session.clone(), served.seen.clone());

    let reported_again = || {
        seen.lock()
            .unwrap()
            .iter()
            .any(|(stream, frame)| *stream == 1 && matches!(frame, Up::Result(_)))
    };
    for _ in 0..1200 {
        if reported_again() && session.in_flight_count() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(reported_again(), "{:?}", seen.lock().unwrap());
    assert_eq!(
        session.in_flight_count(),
        0,
        "acknowledged on the second stream"
    );
    let frames = seen.lock().unwrap().clone();
    // Re-sent as the new stream's first frame (before its first lease
    // heartbeat), not by the session loop retrying after a timeout.
    let first_on_new = frames.iter().find(|(s, _)| *s == 1).map(|(_, f)| f);
    assert!(
        matches!(first_on_new, Some(Up::Result(_))),
        "{first_on_new:?}"
    );
    assert!(
        frames
            .iter()
            .any(|(s, f)| *s == 0 && matches!(f, Up::LivenessAnswer(a) if a.liveness_ping == 7))
    );
    assert!(
        frames
            .iter()
            .any(|(s, f)| *s == 0 && matches!(f, Up::TaskRefused(r) if r.completion_token == "t2")),
        "{frames:?}"
    );
    let results: Vec<&wire::ActivityResult> = frames
        .iter()
        .filter_map(|(_, f)| match f {
            Up::Result(r) => Some(r),
            _ => None,
        })
        .collect();
    assert!(results.len() >= 2, "{results:?}");
    for result in results {
        assert_eq!(result.completion_token, "t1");
        assert_eq!(result.run_id.as_ref().map(|r| r.uuid.as_str()), Some("r"));
        let Some(wire::activity_result::Outcome::Result(payload)) = &result.outcome else {
            panic!("{result:?}")
        };
        assert_eq!(payload.bytes, b"42");
    }

    served.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_type_at_its_own_limit_is_refused_even_when_pushed_back_to_back() {
    // The tenant could run two, the type one: the second task pushed right
    // behind the first (which runs for a while) is refused at once.
    let first = vec![task_at("t1", 1), task_at("t2", 2)];
    let served = serve(first, &answer(HOLDS_ITS_PERMITS), 2, &[("answer", 1)]).await;
    served
        .until(|frames| frames.iter().any(|(_, f)| matches!(f, Up::Result(_))))
        .await;
    let frames = served.seen.lock().unwrap().clone();
    let refused: Vec<&wire::TaskRefused> = frames
        .iter()
        .filter_map(|(_, f)| match f {
            Up::TaskRefused(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(refused.len(), 1, "{frames:?}");
    assert_eq!(refused[0].completion_token, "t2");
    assert!(
        refused[0].reason.contains("its own concurrency limit"),
        "{:?}",
        refused[0]
    );
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_registration_runs_beside_the_old_stream_which_loses_nothing() {
    // The server holds the new registration's ack; meanwhile it pings and
    // pushes a task on the old stream, and one more right after the ack.
    let script = Script {
        on_replace: vec![ping(77), task_at("t9", 9)],
        after_replace: vec![task_at("t10", 10)],
        ..Script::default()
    };
    let release = script.release.clone();
    let served = serve_script(script, &answer(0), 4, &[]).await;
    served
        .until(|frames| frames.iter().any(|(s, _)| *s == 0))
        .await;

    // A deploy adds an activity type: the connector registers again.
    let sandbox = Sandbox::new(SandboxConfig {
        max_instances: 2,
        ..SandboxConfig::default()
    })
    .unwrap();
    let wider = answer(0).replace(
        r#"(func (export "answer") (result u32)"#,
        r#"(func (export "other") (result u32) (canon lift (core func $i "answer")))
            (func (export "answer") (result u32)"#,
    );
    let wider = sandbox.load(&wat::parse_str(&wider).unwrap()).unwrap();
    let tenant = Tenant {
        name: "t".into(),
        ..Tenant::default()
    };
    let tenant = sandbox.prepare(tenant).unwrap();
    served.registry.set_tenant(tenant, &[wider], &[]).unwrap();

    let result_of = |token: &'static str| {
        move |frames: &[(usize, Up)]| {
            frames
                .iter()
                .any(|(_, f)| matches!(f, Up::Result(r) if r.completion_token == token))
        }
    };
    // Served while the registration waits: the ping answered, the task run.
    served
        .until(|frames| {
            frames.iter().any(|(s, f)| {
                *s == 0 && matches!(f, Up::LivenessAnswer(a) if a.liveness_ping == 77)
            })
        })
        .await;
    served.until(result_of("t9")).await;
    release.notify_one();
    // A task the server sent on the old stream as the new one took over.
    served.until(result_of("t10")).await;
    // The new stream took over: the worker talks on it (its lease
    // heartbeats; results are no longer re-sent there, now that the script
    // acknowledges each by its own ids).
    served
        .until(|frames| frames.iter().any(|(s, _)| *s == 1))
        .await;
    served.stop().await;
}

/// The results and refusals the worker sent, as (workflow, token).
fn answered(frames: &[(usize, Up)]) -> (Vec<(String, String)>, Vec<String>) {
    let mut results = Vec::new();
    let mut refused = Vec::new();
    for (_, frame) in frames {
        match frame {
            Up::Result(r) => results.push((
                r.workflow_id.clone().unwrap_or_default().uuid,
                r.completion_token.clone(),
            )),
            Up::TaskRefused(r) => refused.push(r.completion_token.clone()),
            _ => {}
        }
    }
    (results, refused)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_pushed_again_while_it_runs_is_neither_run_twice_nor_refused() {
    // Refused at the tenant's limit of one, the server would hand the task
    // to another worker while it runs here.
    let script = Script {
        first: vec![task_at("t1", 1), task_at("t1", 1)],
        ..Script::default()
    };
    let served = serve_script(script, &answer(HOLDS_ITS_PERMITS), 1, &[]).await;
    served.until(|frames| !answered(frames).0.is_empty()).await;
    let (session, seen) = (served.session.clone(), served.seen.clone());
    for _ in 0..1200 {
        if session.in_flight_count() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (results, refused) = answered(&seen.lock().unwrap());
    assert_eq!(results, [("w".to_owned(), "t1".to_owned())]);
    assert!(refused.is_empty(), "refused {refused:?}");
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn attempts_whose_ids_would_join_to_one_key_are_kept_apart() {
    // `w/1`, 2, `t` and `w`, 1, `2/t`: one key when joined with `/`, so the
    // second replaced the first, and one result was lost.
    let script = Script {
        first: vec![task_of("w/1", 2, "t"), task_of("w", 1, "2/t")],
        ..Script::default()
    };
    let served = serve_script(script, &answer(HOLDS_ITS_PERMITS), 2, &[]).await;
    served.until(|frames| answered(frames).0.len() >= 2).await;
    let (mut results, refused) = answered(&served.seen.lock().unwrap());
    results.sort();
    assert_eq!(
        results,
        [
            ("w".to_owned(), "2/t".to_owned()),
            ("w/1".to_owned(), "t".to_owned())
        ]
    );
    assert!(refused.is_empty(), "refused {refused:?}");
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_pushed_again_before_its_result_is_acknowledged_gets_the_result_not_a_second_run() {
    let script = Script {
        first: vec![task_at("t1", 1)],
        repush_first_result: true,
        ..Script::default()
    };
    let served = serve_script(script, &answer(0), 1, &[]).await;
    served.until(|frames| !answered(frames).0.is_empty()).await;
    // Answered at the push, not by the report's own retry after its wait
    // for an acknowledgement.
    let first = std::time::Instant::now();
    served.until(|frames| answered(frames).0.len() >= 2).await;
    assert!(
        first.elapsed() < ACK_WAIT,
        "the result went again only after {:?}",
        first.elapsed()
    );
    let (results, refused) = answered(&served.seen.lock().unwrap());
    assert_eq!(
        results,
        [
            ("w".to_owned(), "t1".to_owned()),
            ("w".to_owned(), "t1".to_owned())
        ]
    );
    assert!(refused.is_empty(), "refused {refused:?}");
    let outcomes = served.session.metrics.outcomes("t");
    assert_eq!(outcomes.values().sum::<u64>(), 1, "ran {outcomes:?}");
    served.stop().await;
}
