//! Where the OCI client's bytes come from. `oci-client` follows redirects,
//! token realms and a layer's `urls` wherever a registry points, and reads
//! a manifest, a token or an error page whole; it has no hook for either.
//! So every connection it makes goes through a proxy in this process, made
//! for one pull and gone with it, which
//! - connects only to the hosts the tenant's `registries` rules name (and
//!   the reference's own registry): a redirect, a token realm or a layer URL
//!   elsewhere is refused, and the pull fails naming where it was sent;
//! - counts every byte a registry sends, against an allowance the pull
//!   raises as it goes (the manifest's bound first, then the layer's
//!   declared size): what a registry sends beyond it cuts the connection,
//!   so nothing it sends is held unbounded in memory.
//!
//! HTTPS goes through as a `CONNECT` tunnel (the TLS session stays the
//! client's, end to end); plain HTTP, for registries listed as insecure, as
//! requests the proxy forwards. The proxy listens on loopback, on a port of
//! its own, for one pull. It asks for no credentials (an HTTP client drops
//! them on a redirect) and adds none: a local process that found it could
//! reach only the hosts it may reach itself, and would spend that pull's
//! allowance.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Empty};
use hyper::body::{Body, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use corral_core::shown::shown;

/// How long connecting to a registry may take.
const CONNECT: Duration = Duration::from_secs(10);
/// The longest destination a refusal quotes (the registry chose it).
const MAX_SHOWN: usize = 200;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = BoxBody<Bytes, BoxError>;

/// The hosts a pull may fetch from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destinations {
    /// Anywhere: a command-line pull of the user's own reference.
    Any,
    /// Only these `host:port`, or `host` on the scheme's own port (443, or
    /// 80 in plain HTTP); plain HTTP only to the registries listed as
    /// insecure. A rule naming a host so can reach no other port of it
    /// (its metrics, its admin port) and never in clear text by a redirect.
    Only {
        hosts: Vec<String>,
        insecure: Vec<String>,
    },
}

impl Destinations {
    fn allows(&self, host: &str, port: u16, https: bool) -> bool {
        let Destinations::Only { hosts, insecure } = self else {
            return true;
        };
        let host = host.to_ascii_lowercase();
        let default = if https { 443 } else { 80 };
        let named = |list: &[String]| {
            list.iter().any(|allowed| {
                let allowed = allowed.to_ascii_lowercase();
                allowed == format!("{host}:{port}") || (port == default && allowed == host)
            })
        };
        named(hosts) && (https || named(insecure))
    }
}

/// What one pull's proxy shares with its connections.
struct Shared {
    destinations: Destinations,
    /// Bytes registries may still send, raised as the pull goes.
    allowance: AtomicU64,
    received: AtomicU64,
    over: AtomicBool,
    /// The first destination refused.
    refused: Mutex<Option<String>>,
    /// The last destination that could not be reached, and why.
    unreachable: Mutex<Option<(String, std::io::Error)>>,
}

impl Shared {
    /// Counts `n` bytes a registry sent; `false` once over the allowance.
    fn take(&self, n: usize) -> bool {
        let total = self.received.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        if total > self.allowance.load(Ordering::Relaxed) {
            self.over.store(true, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn refuse(&self, destination: String) {
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        refused.get_or_insert(destination);
    }
}

/// One pull's proxy. Dropping it closes the listener and every connection.
pub struct Egress {
    url: String,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Egress {
    /// Starts a proxy admitting `destinations`, with `allowance` bytes to
    /// receive until [`Egress::allow`] raises it.
    pub async fn start(destinations: Destinations, allowance: u64) -> std::io::Result<Egress> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            destinations,
            allowance: AtomicU64::new(allowance),
            received: AtomicU64::new(0),
            over: AtomicBool::new(false),
            refused: Mutex::new(None),
            unreachable: Mutex::new(None),
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, shared.clone(), stop.clone()));
        Ok(Egress {
            url: format!("http://{address}"),
            shared,
            stop,
        })
    }

    /// The proxy's URL, for the OCI client.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A handle that raises the allowance, for the pull in progress.
    pub fn allowance(&self) -> Allowance {
        Allowance(self.shared.clone())
    }

    /// Whether a registry sent more than it was allowed.
    pub fn over(&self) -> bool {
        self.shared.over.load(Ordering::Relaxed)
    }

    /// Bytes registries sent so far.
    pub fn received(&self) -> u64 {
        self.shared.received.load(Ordering::Relaxed)
    }

    /// The last destination the proxy could not connect to, and why.
    pub fn unreachable(&self) -> Option<(String, std::io::Error)> {
        self.shared
            .unreachable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// The first destination refused, as `host:port`, escaped and bounded.
    pub fn refused(&self) -> Option<String> {
        self.shared
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Raises a pull's allowance as it learns what it will fetch.
pub struct Allowance(Arc<Shared>);

impl Allowance {
    /// Lets registries send `bytes` more.
    pub fn allow(&self, bytes: u64) {
        self.0.allowance.fetch_add(bytes, Ordering::Relaxed);
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::debug!("registry proxy: accept failed: {e}");
                    return;
                }
            },
        };
        let (shared, stop) = (shared.clone(), stop.clone());
        tokio::spawn(async move {
            let serving = stop.clone();
            let service = hyper::service::service_fn(move |request| {
                handle(request, shared.clone(), serving.clone())
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::select! {
                () = stop.cancelled() => {}
                result = connection => if let Err(e) = result {
                    tracing::debug!("registry proxy connection: {e}");
                },
            }
        });
    }
}

fn plain(status: StatusCode) -> Response<ProxyBody> {
    let mut response = Response::new(Empty::new().map_err(|e| match e {}).boxed());
    *response.status_mut() = status;
    response
}

async fn handle(
    request: Request<Incoming>,
    shared: Arc<Shared>,
    stop: CancellationToken,
) -> Result<Response<ProxyBody>, Infallible> {
    let https = request.method() == Method::CONNECT;
    let Some(authority) = request.uri().authority().cloned() else {
        return Ok(plain(StatusCode::BAD_REQUEST));
    };
    if !https && request.uri().scheme_str() != Some("http") {
        return Ok(plain(StatusCode::BAD_REQUEST));
    }
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let host = authority.host();
    if !shared.destinations.allows(host, port, https) {
        shared.refuse(shown(&format!("{host}:{port}"), MAX_SHOWN));
        return Ok(plain(StatusCode::FORBIDDEN));
    }
    let bare = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let upstream =
        match tokio::time::timeout(CONNECT, TcpStream::connect((bare.as_str(), port))).await {
            Ok(Ok(stream)) => stream,
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e,
                    _ => std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no connection within {CONNECT:?}"),
                    ),
                };
                *shared.unreachable.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((shown(&format!("{host}:{port}"), MAX_SHOWN), error));
                return Ok(plain(StatusCode::BAD_GATEWAY));
            }
        };
    if https {
        tokio::spawn(async move {
            if let Ok(upgraded) = hyper::upgrade::on(request).await {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tunnel(TokioIo::new(upgraded), upstream, &shared) => {}
                }
            }
        });
        return Ok(plain(StatusCode::OK));
    }
    let destination = shown(&format!("{host}:{port}"), MAX_SHOWN);
    Ok(forward(request, upstream, shared.clone(), stop)
        .await
        .unwrap_or_else(|e| {
            // Connected, then the exchange broke: the pull names why, as
            // for a registry it could not reach.
            *shared.unreachable.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((destination, std::io::Error::other(e)));
            plain(StatusCode::BAD_GATEWAY)
        }))
}

/// Copies a CONNECT tunnel both ways, counting what the registry sends.
async fn tunnel(client: TokioIo<hyper::upgrade::Upgraded>, upstream: TcpStream, shared: &Shared) {
    let (mut from_client, mut to_client) = tokio::io::split(client);
    let (mut from_registry, mut to_registry) = upstream.into_split();
    let outbound = async {
        let _ = tokio::io::copy(&mut from_client, &mut to_registry).await;
        let _ = to_registry.shutdown().await;
    };
    let inbound = async {
        let mut buffer = vec![0u8; 16 << 10];
        loop {
            match from_registry.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if !shared.take(n) || to_client.write_all(&buffer[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to_client.shutdown().await;
    };
    // The registry's side ends the tunnel (over its allowance, or done); the
    // client's may half-close before it.
    tokio::select! {
        () = inbound => {}
        () = async {
            outbound.await;
            std::future::pending::<()>().await
        } => {}
    }
}

/// Forwards one plain-HTTP request to the registry, counting its response.
async fn forward(
    request: Request<Incoming>,
    upstream: TcpStream,
    shared: Arc<Shared>,
    stop: CancellationToken,
) -> Result<Response<ProxyBody>, hyper::Error> {
    let (mut parts, body) = request.into_parts();
    parts.uri = parts
        .uri
        .path_and_query()
        .map_or_else(|| "/".parse(), |p| p.as_str().parse())
        .unwrap_or_default();
    parts.headers.remove(hyper::header::PROXY_AUTHORIZATION);
    parts.headers.remove("proxy-connection");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await?;
    tokio::spawn(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            _ = connection => {}
        }
    });
    let response = sender
        .send_request(Request::from_parts(parts, body))
        .await?;
    Ok(response.map(|body| {
        Counted {
            inner: body,
            shared,
        }
        .boxed()
    }))
}

/// A registry's response body, counted against the pull's allowance.
struct Counted {
    inner: Incoming,
    shared: Arc<Shared>,
}

#[derive(Debug, thiserror::Error)]
#[error("the registry sent more than this pull allows")]
struct OverAllowance;

impl Body for Counted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, Bytes::len);
                if self.shared.take(n) {
                    Poll::Ready(Some(Ok(frame)))
                } else {
                    Poll::Ready(Some(Err(Box::new(OverAllowance))))
                }
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The address a test's client connects to through an [`Egress`].
#[cfg(test)]
fn proxy_address(egress: &Egress) -> std::net::SocketAddr {
    let address = egress.url.trim_start_matches("http://");
    address
        .parse()
        .unwrap_or(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn server(body: Vec<u8>) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut head = [0u8; 4096];
                    let _ = stream.read(&mut head).await;
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(reply.as_bytes()).await;
                    let _ = stream.write_all(&body).await;
                });
            }
        });
        port
    }

    async fn get(egress: &Egress, url: &str) -> (u16, Vec<u8>) {
        let mut stream = TcpStream::connect(proxy_address(egress)).await.unwrap();
        let request = format!("GET {url} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out).await;
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.as_bytes().to_vec())
            .unwrap_or_default();
        (status, body)
    }

    #[tokio::test]
    async fn only_the_named_hosts_are_reached() {
        let port = server(b"manifest".to_vec()).await;
        let allowed = vec![format!("127.0.0.1:{port}")];
        let egress = Egress::start(
            Destinations::Only {
                hosts: allowed.clone(),
                insecure: allowed,
            },
            1 << 20,
        )
        .await
        .unwrap();
        let url = format!("http://127.0.0.1:{port}/v2/");
        assert_eq!(get(&egress, &url).await, (200, b"manifest".to_vec()));
        let elsewhere = format!("http://localhost:{port}/v2/");
        assert_eq!(get(&egress, &elsewhere).await.0, 403);
        assert_eq!(
            egress.refused().as_deref(),
            Some(&*format!("localhost:{port}"))
        );
    }

    #[test]
    fn a_host_named_alone_is_reached_on_its_schemes_port_and_in_clear_only_if_insecure() {
        let only = Destinations::Only {
            hosts: vec!["registry.example.com".into(), "10.0.0.5:5000".into()],
            insecure: vec!["10.0.0.5:5000".into()],
        };
        assert!(only.allows("registry.example.com", 443, true));
        assert!(only.allows("REGISTRY.example.com", 443, true));
        assert!(
            !only.allows("registry.example.com", 8443, true),
            "another port"
        );
        assert!(!only.allows("registry.example.com", 80, false), "in clear");
        assert!(only.allows("10.0.0.5", 5000, false));
        assert!(only.allows("10.0.0.5", 5000, true));
        assert!(!only.allows("10.0.0.5", 5001, false));
        assert!(!only.allows("elsewhere.example.com", 443, true));
        assert!(Destinations::Any.allows("anywhere", 1, false));
    }

    #[tokio::test]
    async fn a_registry_sending_more_than_allowed_is_cut_off() {
        let port = server(vec![b'x'; 64 << 10]).await;
        let egress = Egress::start(Destinations::Any, 4 << 10).await.unwrap();
        let url = format!("http://127.0.0.1:{port}/v2/big");
        let (_, body) = get(&egress, &url).await;
        assert!(body.len() < 64 << 10, "{} bytes came through", body.len());
        assert!(egress.over());
        // Raised, the next response fits.
        egress.allowance().allow(128 << 10);
        let (status, body) = get(&egress, &url).await;
        assert_eq!((status, body.len()), (200, 64 << 10));
    }
}
