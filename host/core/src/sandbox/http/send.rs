//! Sending one granted request: the name is resolved by corral, every
//! address checked against the grants before a connection is tried, and
//! the connection made to the checked address itself, so a name that
//! resolves differently a moment later (DNS rebinding) changes nothing.

use std::future::{Future, poll_fn};
use std::net::{IpAddr, SocketAddr};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::http::{Request, Response, Uri};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody};

use super::quiet::{Quiet, is_between_bytes};

/// Used where the guest sets no timeout of its own.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

pub(crate) type Worker = Box<dyn Future<Output = Result<(), Error>> + Send>;

trait Stream: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static> Stream for T {}

/// The host part of `uri` as a resolver takes it (no IPv6 brackets).
pub(crate) fn bare_host(uri: &Uri) -> Option<&str> {
    let host = uri.host()?;
    Some(
        host.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host),
    )
}

/// Resolves `host` (an address resolves to itself), within the guest's
/// connect timeout.
pub(crate) async fn resolve(
    host: &str,
    port: u16,
    options: Option<RequestOptions>,
) -> Result<Vec<SocketAddr>, Error> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let timeout = options
        .and_then(|o| o.connect_timeout)
        .unwrap_or(DEFAULT_TIMEOUT);
    match tokio::time::timeout(timeout, tokio::net::lookup_host((host, port))).await {
        Err(_) => Err(Error::DnsTimeout),
        Ok(Err(_)) => Err(Error::DestinationNotFound),
        Ok(Ok(addresses)) => {
            let addresses: Vec<SocketAddr> = addresses.collect();
            if addresses.is_empty() {
                Err(Error::DestinationNotFound)
            } else {
                Ok(addresses)
            }
        }
    }
}

/// The TLS configuration every request shares: the web's public roots,
/// ring, whatever provider the process installed.
fn tls_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let roots = rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.into(),
            };
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map(|b| b.with_root_certificates(roots).with_no_client_auth())
                // ring supports the default versions; this cannot fail.
                .unwrap_or_else(|_| {
                    rustls::ClientConfig::builder()
                        .with_root_certificates(rustls::RootCertStore::empty())
                        .with_no_client_auth()
                });
            Arc::new(config)
        })
        .clone()
}

/// Connects to the first of `addresses` that answers and sends `request`
/// over HTTP/1.1 (TLS for `https`, checked against the URI's host).
pub(crate) async fn send(
    mut request: Request<WasiBody>,
    options: Option<RequestOptions>,
    addresses: Vec<SocketAddr>,
) -> Result<(Response<WasiBody>, Worker), Error> {
    let timeout = |pick: fn(&RequestOptions) -> Option<Duration>| {
        options.as_ref().and_then(pick).unwrap_or(DEFAULT_TIMEOUT)
    };
    let connect_timeout = timeout(|o| o.connect_timeout);
    let first_byte_timeout = timeout(|o| o.first_byte_timeout);
    let between_bytes_timeout = timeout(|o| o.between_bytes_timeout).max(Duration::from_nanos(1));
    let tls = request.uri().scheme_str() == Some("https");
    let server_name = bare_host(request.uri())
        .map(str::to_owned)
        .ok_or(Error::HttpRequestUriInvalid)?;

    let mut last = Error::DestinationNotFound;
    let mut tcp = None;
    for address in addresses {
        match tokio::time::timeout(connect_timeout, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => {
                tcp = Some(stream);
                break;
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                last = Error::ConnectionRefused;
            }
            Ok(Err(e)) => last = Error::Connect(e),
            Err(_) => last = Error::ConnectionTimeout,
        }
    }
    // The between-bytes timer starts once the response's head is in; the
    // first-byte timer covers the time before.
    let body_started = Arc::new(AtomicBool::new(false));
    let tcp = Quiet::new(
        tcp.ok_or(last)?,
        between_bytes_timeout,
        body_started.clone(),
    );
    let stream: Box<dyn Stream> = if tls {
        let name = rustls::pki_types::ServerName::try_from(server_name)?;
        let connector = tokio_rustls::TlsConnector::from(tls_config());
        let connecting = connector.connect(name, tcp);
        match tokio::time::timeout(connect_timeout, connecting).await {
            Ok(Ok(stream)) => Box::new(stream),
            Ok(Err(e)) => return Err(Error::Tls(e)),
            Err(_) => return Err(Error::ConnectionTimeout),
        }
    } else {
        Box::new(tcp)
    };
    let (mut sender, conn) = tokio::time::timeout(
        connect_timeout,
        hyper::client::conn::http1::Builder::new().handshake(TokioIo::new(stream)),
    )
    .await
    .map_err(|_| Error::ConnectionTimeout)??;

    // Origin form on the wire: the scheme and authority went into choosing
    // the connection (and the Host header the guest sent).
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    *request.uri_mut() = Uri::builder()
        .path_and_query(path)
        .build()
        .map_err(|_| Error::HttpRequestUriInvalid)?;

    let sending = async move {
        let response = tokio::time::timeout(first_byte_timeout, sender.send_request(request))
            .await
            .map_err(|_| Error::ConnectionReadTimeout)??;
        body_started.store(true, Ordering::Release);
        Ok::<_, Error>(response.map(|incoming| ResponseBody { incoming }.boxed_unsync()))
    };
    let mut sending = pin!(sending);
    let mut conn = Some(conn);
    // The connection's I/O is driven here until the response's head is in.
    // The connection goes first: a head already in the socket is read
    // before the first-byte timer is looked at, so a task that was not
    // polled for a while (a busy host) does not time out a response that
    // came in time.
    let response = poll_fn(|cx| {
        let mut failed = None;
        if let Some(driving) = conn.as_mut()
            && let Poll::Ready(ended) = Pin::new(driving).poll(cx)
        {
            conn = None;
            failed = ended.err();
        }
        match (sending.as_mut().poll(cx), failed) {
            (Poll::Ready(done), _) => Poll::Ready(done),
            (Poll::Pending, Some(e)) => Poll::Ready(Err(Error::from(e))),
            (Poll::Pending, None) => Poll::Pending,
        }
    })
    .await?;
    let worker: Worker = Box::new(async move {
        match conn {
            None => Ok(()),
            Some(conn) => conn.await.map_err(|e| {
                if e.is_timeout() {
                    Error::HttpResponseTimeout
                } else {
                    Error::from(e)
                }
            }),
        }
    });
    Ok((response, worker))
}

/// A response body with hyper's errors turned into the guest's: a quiet
/// server ([`Quiet`]) as `connection-read-timeout`.
struct ResponseBody {
    incoming: Incoming,
}

impl Body for ResponseBody {
    type Data = bytes::Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Error>>> {
        Poll::Ready(match ready!(Pin::new(&mut self.incoming).poll_frame(cx)) {
            Some(Ok(frame)) => Some(Ok(frame)),
            Some(Err(e)) if is_between_bytes(&e) => Some(Err(Error::ConnectionReadTimeout)),
            Some(Err(e)) if e.is_timeout() => Some(Err(Error::HttpResponseTimeout)),
            Some(Err(e)) => Some(Err(Error::from(e))),
            None => None,
        })
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};

    use http_body_util::BodyExt as _;

    use super::*;

    /// A server for one request, on a thread of its own: once the request
    /// is in it tells `received` and sends `head`, then `rest` once `go`
    /// says so, and tells `answered`; then it holds the connection open
    /// until the client lets it go.
    struct Serving {
        address: SocketAddr,
        received: tokio::sync::oneshot::Receiver<()>,
        go: std::sync::mpsc::Sender<()>,
        answered: std::sync::mpsc::Receiver<()>,
        server: std::thread::JoinHandle<()>,
    }

    fn serving(head: &'static [u8], rest: &'static [u8]) -> Serving {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let (received, received_rx) = tokio::sync::oneshot::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let (answered, answered_rx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") {
                socket.read_exact(&mut byte).unwrap();
                request.push(byte[0]);
            }
            let _ = received.send(());
            socket.write_all(head).unwrap();
            let _ = go_rx.recv();
            socket.write_all(rest).unwrap();
            let _ = answered.send(());
            while socket.read(&mut byte).is_ok_and(|n| n > 0) {}
        });
        Serving {
            address,
            received: received_rx,
            go,
            answered: answered_rx,
            server,
        }
    }

    /// A response that reached the socket in time is not lost to the
    /// first-byte timer when the task is next polled only after that timer
    /// has run out (a host too busy to poll it).
    #[test]
    fn a_response_in_the_socket_beats_a_first_byte_timer_that_ran_out_meanwhile() {
        let Serving {
            address,
            received,
            go,
            answered,
            server,
        } = serving(b"", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
        // Long enough that the request's way to the server cannot outlast
        // it, even on a slow machine.
        let first_byte_timeout = Duration::from_secs(1);
        let options = RequestOptions {
            connect_timeout: None,
            first_byte_timeout: Some(first_byte_timeout),
            between_bytes_timeout: None,
        };
        let runtime = current_thread();
        let status = runtime.block_on(async move {
            let mut sending = pin!(send(get(address), Some(options), vec![address]));
            tokio::select! {
                biased;
                done = &mut sending => panic!(
                    "done before the server had the request: {:?}",
                    done.map(|(r, _)| r.status())
                ),
                _ = received => {}
            }
            // The server answers while another task holds the thread past
            // the first-byte timer: when the runtime next turns, the timer
            // has fired and the socket is readable, as on a busy host.
            go.send(()).unwrap();
            tokio::spawn(async move {
                answered.recv().unwrap();
                std::thread::sleep(first_byte_timeout * 2);
            });
            let (response, _worker) = sending.await.expect("the response came in time");
            response.status()
        });
        assert_eq!(status, 200);
        // The connection's task goes with its runtime, and so the server's wait.
        drop(runtime);
        server.join().unwrap();
    }

    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn get(address: SocketAddr) -> Request<WasiBody> {
        let body = http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed_unsync();
        Request::builder()
            .uri(format!("http://{address}/"))
            .body(body)
            .unwrap()
    }

    fn between_bytes(timeout: Duration) -> Option<RequestOptions> {
        Some(RequestOptions {
            connect_timeout: None,
            first_byte_timeout: None,
            between_bytes_timeout: Some(timeout),
        })
    }

    /// A body's bytes that the server sent in time are the guest's when the
    /// connection's task (the guests' runtime, on a busy host) gets a thread
    /// only after the between-bytes timer ran out: the timer is looked at
    /// where the socket is read, after the read, not beside the guest's
    /// reader, which saw nothing only because the connection had not run.
    #[test]
    fn body_bytes_sent_in_time_beat_the_timer_while_the_connection_waits_for_a_thread() {
        let Serving {
            address,
            go,
            answered,
            server,
            ..
        } = serving(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n", b"ok");
        let timeout = Duration::from_millis(300);
        let runtime = current_thread();
        let connections = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (response, worker) = runtime
            .block_on(send(get(address), between_bytes(timeout), vec![address]))
            .expect("the head came");
        // The connections' only thread is held from before the server sends
        // the body until well past the timer.
        let (held, held_rx) = std::sync::mpsc::channel();
        connections.spawn(async move {
            held.send(()).unwrap();
            let _ = answered.recv();
            std::thread::sleep(timeout * 3);
        });
        held_rx.recv().unwrap();
        connections.spawn(Box::into_pin(worker));
        go.send(()).unwrap();
        let body = runtime
            .block_on(response.into_body().collect())
            .expect("the body came in time")
            .to_bytes();
        assert_eq!(&body[..], b"ok");
        // Its tasks (the connection) end with it, and so the server's wait.
        drop(connections);
        server.join().unwrap();
    }

    /// A server that goes quiet after the head or in the middle of a body
    /// fails the guest's read with `connection-read-timeout` after the
    /// between-bytes timeout.
    #[test]
    fn a_body_that_stops_fails_with_a_read_timeout() {
        a_body_that_stops_after(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n");
        a_body_that_stops_after(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nok");
    }

    fn a_body_that_stops_after(sent: &'static [u8]) {
        let Serving {
            address,
            go,
            server,
            ..
        } = serving(sent, b"");
        let runtime = current_thread();
        let ended = runtime.block_on(async move {
            let (response, worker) = send(
                get(address),
                between_bytes(Duration::from_millis(100)),
                vec![address],
            )
            .await
            .expect("the head came");
            tokio::spawn(Box::into_pin(worker));
            let body = response.into_body().collect();
            tokio::time::timeout(Duration::from_secs(10), body)
                .await
                .map(|ended| ended.map(|b| b.to_bytes()))
        });
        assert!(
            matches!(ended, Ok(Err(Error::ConnectionReadTimeout))),
            "after {:?}, the body (an outer error: no timeout within 10 s): {ended:?}",
            String::from_utf8_lossy(sent)
        );
        // The connection's task goes with its runtime, and so the server's wait.
        drop(runtime);
        drop(go);
        server.join().unwrap();
    }
}
