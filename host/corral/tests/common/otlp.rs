//! An OTLP/gRPC trace receiver on a loopback port: collects every span
//! corral exports, so a test can check their parents and attributes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;

/// One received span, ids in hex.
#[derive(Debug, Clone)]
pub struct Span {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_id: String,
    pub attributes: HashMap<String, String>,
    /// Each event's name (a log line's message) and attributes.
    pub events: Vec<(String, HashMap<String, String>)>,
}

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<Span>>>);

fn attributes(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Any::StringValue(s)) => s.clone(),
                Some(Any::IntValue(i)) => i.to_string(),
                Some(Any::BoolValue(b)) => b.to_string(),
                Some(Any::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut sink = self.0.lock().unwrap();
        for resource in &request.get_ref().resource_spans {
            for scope in &resource.scope_spans {
                for s in &scope.spans {
                    sink.push(Span {
                        name: s.name.clone(),
                        trace_id: hex::encode(&s.trace_id),
                        span_id: hex::encode(&s.span_id),
                        parent_id: hex::encode(&s.parent_span_id),
                        attributes: attributes(&s.attributes),
                        events: s
                            .events
                            .iter()
                            .map(|e| (e.name.clone(), attributes(&e.attributes)))
                            .collect(),
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// The receiver; stops with the test process.
pub struct Receiver {
    pub port: u16,
    sink: Sink,
}

impl Receiver {
    pub fn start() -> Receiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let sink = Sink::default();
        let service = TraceServiceServer::new(sink.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                let _ = tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming(incoming)
                    .await;
            });
        });
        Receiver { port, sink }
    }

    /// How many spans arrived so far.
    pub fn received(&self) -> usize {
        self.sink.0.lock().unwrap().len()
    }

    /// Waits (at most 60 s) until a received span matches `found`; all
    /// spans received by then.
    pub fn await_span(&self, found: impl Fn(&Span) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let spans = self.sink.0.lock().unwrap().clone();
            if spans.iter().any(&found) {
                return spans;
            }
            assert!(Instant::now() < deadline, "no such span in: {spans:#?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
