//! Outbound HTTP (`wasi:http`), granted per tenant and per destination: a
//! guest's request goes out only when its host (and port, when the grant
//! names one) is on the tenant's `http_hosts` list. The host makes the
//! connection; the guest's own sockets stay closed.
//!
//! Grants: `api.example.com` (any port), `api.example.com:8443`,
//! `*.example.com` (any subdomain, not the apex), `127.0.0.1:8080`,
//! `[::1]:8080`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use hyper::http::uri::Authority;
use wasmtime_wasi_http::{RequestOptions, WasiBody, WasiHttpHooks};

/// One allowed destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpHost {
    /// Lower-case host; for a wildcard, the suffix after `*.`.
    host: String,
    wildcard: bool,
    port: Option<u16>,
}

impl FromStr for HttpHost {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (wildcard, rest) = match text.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let authority: Authority = rest.parse().map_err(|_| {
            format!("`{text}` is not a host such as api.example.com, api.example.com:8443 or *.example.com")
        })?;
        if authority.as_str().contains('@') || authority.host().is_empty() {
            return Err(format!(
                "`{text}` must be a host name or address with an optional port"
            ));
        }
        if wildcard && authority.host().starts_with('[') {
            return Err(format!("`{text}`: a wildcard needs a domain name"));
        }
        Ok(HttpHost {
            host: authority.host().to_ascii_lowercase(),
            wildcard,
            port: authority.port_u16(),
        })
    }
}

impl fmt::Display for HttpHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            f.write_str("*.")?;
        }
        f.write_str(&self.host)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

impl HttpHost {
    /// Whether a request to `host` on `port` is within this grant.
    fn allows(&self, host: &str, port: u16) -> bool {
        let host = host.to_ascii_lowercase();
        let host_ok = if self.wildcard {
            host.strip_suffix(&self.host)
                .is_some_and(|prefix| prefix.len() > 1 && prefix.ends_with('.'))
        } else {
            host == self.host
        };
        host_ok && self.port.is_none_or(|p| p == port)
    }
}

/// The `wasi:http` hooks of one task: the tenant's grants decide, then the
/// request goes out as wasmtime sends it, its body and its response's body
/// metered against the task's byte budget.
#[derive(Debug, Clone)]
pub(crate) struct HttpPolicy {
    hosts: Arc<[HttpHost]>,
    /// Requests the task may still send (`limits.max_http_requests`).
    requests_left: u32,
    /// Body bytes the task may still move (`limits.max_http_bytes`).
    bytes: Arc<ByteBudget>,
}

impl HttpPolicy {
    pub(crate) fn new(hosts: Arc<[HttpHost]>, max_requests: u32, max_bytes: u64) -> Self {
        HttpPolicy {
            hosts,
            requests_left: max_requests,
            bytes: Arc::new(ByteBudget {
                limit: max_bytes,
                left: AtomicU64::new(max_bytes),
            }),
        }
    }

    fn allows(&self, uri: &hyper::http::Uri) -> bool {
        let Some(host) = uri.host() else {
            return false;
        };
        let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        });
        self.hosts.iter().any(|grant| grant.allows(host, port))
    }
}

type Sent = Box<
    dyn Future<
            Output = wasmtime_wasi_http::Result<(
                hyper::http::Response<wasmtime_wasi_http::WasiBody>,
                Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
            )>,
        > + Send,
>;

impl WasiHttpHooks for HttpPolicy {
    fn send_request(
        &mut self,
        request: hyper::http::Request<wasmtime_wasi_http::WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
    ) -> Sent {
        if !self.allows(request.uri()) {
            tracing::debug!(uri = %request.uri(), "outbound HTTP denied: not in the tenant's http_hosts");
            return Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) });
        }
        let Some(left) = self.requests_left.checked_sub(1) else {
            tracing::debug!(uri = %request.uri(), "outbound HTTP denied: the task sent its limit of requests (limits.max_http_requests)");
            return Box::new(async { Err(wasmtime_wasi_http::Error::ConnectionLimitReached) });
        };
        self.requests_left = left;
        let budget = self.bytes.clone();
        let request = request.map(|body| Metered::wrap(body, budget.clone(), Direction::Request));
        let sent = wasmtime_wasi_http::default_hooks().send_request(request, options, fut);
        Box::new(async move {
            let (response, worker) = Box::into_pin(sent).await?;
            let response = response.map(|body| Metered::wrap(body, budget, Direction::Response));
            Ok((response, worker))
        })
    }
}

/// What is left of one task's HTTP body bytes, shared by all its requests
/// and responses.
#[derive(Debug)]
struct ByteBudget {
    limit: u64,
    left: AtomicU64,
}

impl ByteBudget {
    /// Takes `n` bytes; false (taking nothing) when fewer are left.
    fn take(&self, n: u64) -> bool {
        self.left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(n)
            })
            .is_ok()
    }
}

#[derive(Debug, Clone, Copy)]
enum Direction {
    Request,
    Response,
}

/// A body whose data frames are charged to the task's byte budget as they
/// pass; the frame that would overdraw it ends the body with the size error
/// of its direction, which the guest sees as `HTTP-request-body-size` or
/// `HTTP-response-body-size` with the limit.
struct Metered {
    inner: WasiBody,
    budget: Arc<ByteBudget>,
    direction: Direction,
    failed: bool,
}

impl Metered {
    fn wrap(inner: WasiBody, budget: Arc<ByteBudget>, direction: Direction) -> WasiBody {
        Metered {
            inner,
            budget,
            direction,
            failed: false,
        }
        .boxed_unsync()
    }
}

impl Body for Metered {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        let size = frame.data_ref().map_or(0, |data| data.len() as u64);
        if self.budget.take(size) {
            return Poll::Ready(Some(Ok(frame)));
        }
        self.failed = true;
        let limit = Some(self.budget.limit);
        tracing::debug!(limit, direction = ?self.direction, "outbound HTTP body cut off: the task moved its limit of bytes (limits.max_http_bytes)");
        Poll::Ready(Some(Err(match self.direction {
            Direction::Request => wasmtime_wasi_http::Error::HttpRequestBodySize(limit),
            Direction::Response => wasmtime_wasi_http::Error::HttpResponseBodySize(limit),
        })))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(grants: &[&str]) -> HttpPolicy {
        HttpPolicy::new(grants.iter().map(|g| g.parse().unwrap()).collect(), 1, 0)
    }

    /// A body of `chunks`, metered against `budget`; what it yields: the
    /// sizes of the data frames it passed, then the error that ended it.
    async fn drain(
        chunks: &[usize],
        budget: &Arc<ByteBudget>,
        direction: Direction,
    ) -> (Vec<usize>, Option<wasmtime_wasi_http::Error>) {
        let frames: Vec<Result<Frame<Bytes>, wasmtime_wasi_http::Error>> = chunks
            .iter()
            .map(|&n| Ok(Frame::data(Bytes::from(vec![0u8; n]))))
            .collect();
        let inner = http_body_util::StreamBody::new(futures::stream::iter(frames)).boxed_unsync();
        let mut body = Metered::wrap(inner, budget.clone(), direction);
        let mut passed = Vec::new();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => passed.push(frame.into_data().map_or(0, |d| d.len())),
                Err(e) => return (passed, Some(e)),
            }
        }
        (passed, None)
    }

    #[tokio::test]
    async fn bodies_of_one_task_share_its_byte_budget_in_both_directions() {
        let policy = HttpPolicy::new(Arc::from([]), 10, 100);
        let (passed, end) = drain(&[40, 30], &policy.bytes, Direction::Request).await;
        assert_eq!((passed, end.is_none()), (vec![40, 30], true));
        // 30 left: the response's second frame would overdraw it.
        let (passed, end) = drain(&[20, 20, 5], &policy.bytes, Direction::Response).await;
        assert_eq!(passed, vec![20]);
        assert!(
            matches!(
                end,
                Some(wasmtime_wasi_http::Error::HttpResponseBodySize(Some(100)))
            ),
            "{end:?}"
        );
        // What was refused was not taken: 10 bytes are still there.
        let (passed, end) = drain(&[10, 1], &policy.bytes, Direction::Request).await;
        assert_eq!(passed, vec![10]);
        assert!(
            matches!(
                end,
                Some(wasmtime_wasi_http::Error::HttpRequestBodySize(Some(100)))
            ),
            "{end:?}"
        );
    }

    #[test]
    fn grants_match_host_port_and_subdomains() {
        let p = policy(&[
            "api.example.com",
            "127.0.0.1:8080",
            "*.svc.example",
            "[::1]:9",
        ]);
        let allows = |uri: &str| p.allows(&uri.parse().unwrap());
        assert!(allows("https://api.example.com/x"));
        assert!(allows("http://API.example.com:81/x"));
        assert!(!allows("https://api.example.com.evil.io/"));
        assert!(allows("http://127.0.0.1:8080/"));
        assert!(!allows("http://127.0.0.1:8081/"));
        assert!(!allows("http://127.0.0.1/"), "port 80 is not 8080");
        assert!(allows("https://a.svc.example/"));
        assert!(allows("https://a.b.svc.example/"));
        assert!(
            !allows("https://svc.example/"),
            "a wildcard is not the apex"
        );
        assert!(!allows("https://xsvc.example/"));
        assert!(allows("http://[::1]:9/"));
        assert!(!policy(&[]).allows(&"https://api.example.com/".parse().unwrap()));
    }

    #[test]
    fn bad_grants_are_named() {
        for bad in ["", "http://x", "user@host", "*.[::1]", "a b"] {
            let err = bad.parse::<HttpHost>().unwrap_err();
            assert!(err.contains(&format!("`{bad}`")), "{err}");
        }
        assert_eq!(
            "*.Example.com:8443"
                .parse::<HttpHost>()
                .unwrap()
                .to_string(),
            "*.example.com:8443"
        );
    }
}
