//! The listeners: the admin API (gRPC, optionally TLS) and the Prometheus
//! `/metrics` endpoint (plain HTTP/1.1).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response, StatusCode};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::api::AdminService;
use super::proto::admin_server::AdminServer;
use crate::metrics::{Gauges, Metrics};
use crate::session::Permits;

/// A certificate and key (PEM) for the admin endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Binds the admin address now (so a taken port fails the start) and
/// serves until `shutdown`.
pub async fn admin(
    address: SocketAddr,
    tls: Option<&TlsFiles>,
    service: AdminService,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| anyhow::anyhow!("host.admin_listen: cannot listen on {address}: {e}"))?;
    let bound = listener.local_addr()?;
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        let read = |p: &PathBuf, key: &str| {
            std::fs::read(p).map_err(|e| {
                anyhow::anyhow!("host.admin_tls.{key}: reading `{}`: {e}", p.display())
            })
        };
        let identity =
            tonic::transport::Identity::from_pem(read(&tls.cert, "cert")?, read(&tls.key, "key")?);
        builder = builder
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .map_err(|e| anyhow::anyhow!("host.admin_tls: {e}"))?;
    }
    let router = builder.add_service(AdminServer::new(service));
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
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

/// Serves `GET /metrics` until `shutdown`.
pub async fn metrics(
    address: SocketAddr,
    metrics: Arc<Metrics>,
    permits: Permits,
    tenants: Vec<String>,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| anyhow::anyhow!("host.metrics_listen: cannot listen on {address}: {e}"))?;
    let bound = listener.local_addr()?;
    let handle = tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!("metrics endpoint: accept failed: {e}");
                        continue;
                    }
                },
            };
            let metrics = metrics.clone();
            let permits = permits.clone();
            let tenants = tenants.clone();
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    let response =
                        if request.method() == Method::GET && request.uri().path() == "/metrics" {
                            let gauges = gauges(&permits, &tenants);
                            Response::builder()
                                .header("content-type", "text/plain; version=0.0.4")
                                .body(Full::new(Bytes::from(metrics.render(&gauges))))
                        } else {
                            Response::builder()
                                .status(StatusCode::NOT_FOUND)
                                .body(Full::new(Bytes::from_static(
                                    b"corral serves GET /metrics\n",
                                )))
                        };
                    async move { Ok::<_, Infallible>(response.unwrap_or_default()) }
                },
            );
            tokio::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                if let Err(e) = hyper::server::conn::http1::Builder::new()
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

fn gauges(permits: &Permits, tenants: &[String]) -> Gauges {
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
