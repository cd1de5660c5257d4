//! The listeners: the admin API (gRPC, optionally TLS) and the Prometheus
//! `/metrics` endpoint (plain HTTP/1.1).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response, StatusCode};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use tonic::service::interceptor::InterceptedService;

use super::api::AdminService;
use super::auth::Principal;
use super::gate::{Caller, ConnectionInfo, Gate, GateLimits, Strangers};
use super::proto::admin_server::AdminServer;
use crate::config::TlsFiles;
use crate::health::{Answer, Health};
use crate::token::TokenHash;
use corral_core::metrics::Gauges;
use corral_core::session::Permits;

/// What the admin endpoint holds against the network. Authentication comes
/// first of all: a call without a valid token is refused on its headers,
/// before any of its body is read.
const ADMIN_GATE: GateLimits = GateLimits {
    connections: 64,
    // Longer than the keepalive below: a live client answers its pings.
    idle: Duration::from_secs(60),
    // A connection makes its first call at once; until one authenticates
    // it is a stranger, with slots of its own (see `gate`).
    strangers: Some(Strangers {
        slots: 32,
        deadline: Duration::from_secs(10),
        // A tenant's own token cannot fill the slots either: 8 each, and 8
        // kept for the operator.
        per_tenant: 8,
        operator_reserve: 8,
    }),
};
/// Concurrent calls on one HTTP/2 connection.
const STREAMS_PER_CONNECTION: u32 = 16;
const KEEPALIVE: Duration = Duration::from_secs(20);
const TLS_HANDSHAKE: Duration = Duration::from_secs(10);
/// The longest call: an upload at `max_upload` over a slow link, or an
/// `invoke` of a long activity.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// Request headers (the token among them).
const MAX_HEADERS: u32 = 16 << 10;

/// What `/metrics` holds against the network.
const METRICS_GATE: GateLimits = GateLimits {
    connections: 16,
    idle: Duration::from_secs(10),
    // Nobody authenticates a connection here (a token, when required, is
    // checked per request): every connection is a stranger, lives at most
    // 10 s, and a new one closes the oldest, so clients that keep
    // connections open cannot keep a scraper out.
    strangers: Some(Strangers {
        slots: 16,
        deadline: Duration::from_secs(10),
        per_tenant: 0,
        operator_reserve: 0,
    }),
};
const METRICS_HEADER_READ: Duration = Duration::from_secs(5);

/// Binds the admin address now (so a taken port fails the start) and
/// serves until `shutdown`. `max_message` bounds one decoded message (an
/// upload chunk, a `Run`'s arguments).
pub async fn admin(
    address: SocketAddr,
    tls: Option<&TlsFiles>,
    service: AdminService,
    max_message: usize,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| anyhow::anyhow!("host.admin_listen: cannot listen on {address}: {e}"))?;
    let gate = Gate::new(listener, ADMIN_GATE, "admin API");
    let bound = gate.local_addr()?;
    let mut builder = tonic::transport::Server::builder()
        .max_concurrent_streams(STREAMS_PER_CONNECTION)
        .http2_keepalive_interval(Some(KEEPALIVE))
        .http2_keepalive_timeout(Some(KEEPALIVE))
        .http2_max_header_list_size(MAX_HEADERS)
        .timeout(REQUEST_TIMEOUT);
    if let Some(tls) = tls {
        let read = |p: &PathBuf, key: &str| {
            std::fs::read(p).map_err(|e| {
                anyhow::anyhow!("host.admin_tls.{key}: reading `{}`: {e}", p.display())
            })
        };
        let identity =
            tonic::transport::Identity::from_pem(read(&tls.cert, "cert")?, read(&tls.key, "key")?);
        builder = builder
            .tls_config(
                tonic::transport::ServerTlsConfig::new()
                    .identity(identity)
                    .timeout(TLS_HANDSHAKE),
            )
            .map_err(|e| anyhow::anyhow!("host.admin_tls: {e}"))?;
    }
    let auth = service.auth.clone();
    let admin = InterceptedService::new(
        AdminServer::new(service).max_decoding_message_size(max_message),
        move |mut request: tonic::Request<()>| {
            let principal = auth.principal(request.metadata())?;
            // The connection is no stranger now (see `gate`).
            if let Some(connection) = request.extensions().get::<ConnectionInfo>() {
                connection.authenticated(match &principal {
                    Principal::Operator => Caller::Operator,
                    Principal::Tenant(name) => Caller::Tenant(name.clone()),
                });
            }
            request.extensions_mut().insert(principal);
            Ok(request)
        },
    );
    let router = builder.add_service(admin);
    let (admitted, incoming) = tokio::sync::mpsc::channel(1);
    let accepting = shutdown.clone();
    tokio::spawn(async move {
        loop {
            let connection = tokio::select! {
                () = accepting.cancelled() => return,
                connection = gate.accept() => connection,
            };
            if admitted
                .send(Ok::<_, std::io::Error>(connection))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let incoming = tokio_stream::wrappers::ReceiverStream::new(incoming);
    let handle = tokio::spawn(async move {
        if let Err(e) = router
            .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
            .await
        {
            tracing::error!("the admin API stopped: {e}");
        }
    });
    Ok((bound, handle))
}

/// What `/metrics` shows: the page, once the host has made what it shows
/// (until then the endpoint answers that the host is starting).
pub type Page = Arc<std::sync::OnceLock<Box<dyn Fn() -> String + Send + Sync>>>;

/// Serves `GET /metrics`, `/livez` and `/readyz` until `shutdown`; with
/// `token_sha256`, `/metrics` and `/readyz?verbose` (which name tenants)
/// only to requests bearing that token. The probes need none: they say
/// only yes or no, and an orchestrator's probe carries no secret.
pub async fn metrics(
    address: SocketAddr,
    page: Page,
    health: Arc<Health>,
    token_sha256: Option<TokenHash>,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| anyhow::anyhow!("host.metrics_listen: cannot listen on {address}: {e}"))?;
    let gate = Gate::new(listener, METRICS_GATE, "metrics endpoint");
    let bound = gate.local_addr()?;
    let handle = tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                () = shutdown.cancelled() => return,
                stream = gate.accept() => stream,
            };
            let (page, health) = (page.clone(), health.clone());
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    let response = answer(&request, &page, &health, token_sha256);
                    async move { Ok::<_, Infallible>(response.unwrap_or_default()) }
                },
            );
            tokio::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                // One request per connection: a scrape needs no more.
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .keep_alive(false)
                    .header_read_timeout(METRICS_HEADER_READ)
                    .max_buf_size(64 << 10)
                    .serve_connection(io, service)
                    .await
                {
                    tracing::debug!("metrics connection: {e}");
                }
            });
        }
    });
    Ok((bound, handle))
}

/// The answer to one request on the metrics listener.
fn answer<B>(
    request: &hyper::Request<B>,
    page: &Page,
    health: &Health,
    token_sha256: Option<TokenHash>,
) -> Result<Response<Full<Bytes>>, hyper::http::Error> {
    if request.method() != Method::GET {
        return plain(StatusCode::METHOD_NOT_ALLOWED, SERVED);
    }
    let verbose = request.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|p| p == "verbose" || p.starts_with("verbose="))
    });
    let probe = |said: Answer, content_type: &'static str| {
        let status = match said.ok {
            true => StatusCode::OK,
            false => StatusCode::SERVICE_UNAVAILABLE,
        };
        Response::builder()
            .status(status)
            .header("content-type", content_type)
            .header("cache-control", "no-store")
            .body(Full::new(Bytes::from(said.text)))
    };
    let authorized = bearer_matches(request, token_sha256);
    match request.uri().path() {
        "/livez" => probe(health.live(), "text/plain"),
        "/readyz" if verbose && !authorized => unauthorized(),
        "/readyz" if verbose => probe(health.ready(true), "application/json"),
        "/readyz" => probe(health.ready(false), "text/plain"),
        "/metrics" if !authorized => unauthorized(),
        "/metrics" => match page.get() {
            Some(render) => Response::builder()
                .header("content-type", "text/plain; version=0.0.4")
                .body(Full::new(Bytes::from(render()))),
            None => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "corral is starting: /metrics answers once it serves\n",
            ),
        },
        _ => plain(StatusCode::NOT_FOUND, SERVED),
    }
}

/// What the metrics listener serves, for a request it does not.
const SERVED: &str = "corral serves GET /metrics, /livez and /readyz (?verbose)\n";

fn unauthorized() -> Result<Response<Full<Bytes>>, hyper::http::Error> {
    plain(
        StatusCode::UNAUTHORIZED,
        "send `authorization: Bearer <token>` (host.metrics_token_sha256)\n",
    )
}

fn plain(
    status: StatusCode,
    text: &'static str,
) -> Result<Response<Full<Bytes>>, hyper::http::Error> {
    Response::builder()
        .status(status)
        .body(Full::new(Bytes::from_static(text.as_bytes())))
}

/// Whether the request bears the token whose SHA-256 is `expected` (any
/// request does when no token is configured).
fn bearer_matches<B>(request: &hyper::Request<B>, expected: Option<TokenHash>) -> bool {
    let Some(expected) = expected else {
        return true;
    };
    request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(TokenHash::of_bearer)
        .is_some_and(|hash| hash == expected)
}

/// The permits' gauges for a scrape.
pub fn gauges(permits: &Permits, tenants: &[String]) -> Gauges {
    let host = permits.host_usage();
    Gauges {
        host_permits: (host.in_use, host.limit),
        tenant_permits: tenants
            .iter()
            .filter_map(|t| {
                permits
                    .tenant_usage(t)
                    .map(|u| (t.clone(), (u.in_use, u.limit)))
            })
            .collect(),
        type_permits: permits
            .type_usage()
            .into_iter()
            .map(|(key, u)| (key, (u.in_use, u.limit)))
            .collect(),
    }
}
