//! Outbound HTTP (`wasi:http`), granted per tenant: a guest's request goes
//! out only when a grant allows its destination, method and path, its
//! secrets' placeholders go only to their own hosts, and the address it
//! connects to is public or named by the grant (see [`super::destination`]). The host
//! makes the connection; the guest's own sockets stay closed.
//!
//! A refusal is the standard `wasi:http` error (`HTTP-request-denied`,
//! `destination-IP-prohibited`) in the guest, a warning naming the rule in
//! the host's log, and a note on the task's failure if the task fails.

mod meter;
mod placeholders;
mod quiet;
mod send;

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tracing::Instrument;
use wasmtime_wasi_http::{RequestOptions, WasiBody, WasiHttpHooks};

use meter::{ByteBudget, Direction, Metered};

use super::destination::{HttpGrant, special_range};
use super::secrets::Secrets;
use super::shadow::Tape;
use super::shadow::tape::GuestRequest;
use super::task_id::TaskLabels;
use crate::sync::lock;

/// Refusals a task keeps to explain its failure.
const KEPT_REFUSALS: usize = 4;

/// Why corral did not send a request, naming the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No grant names the destination.
    Destination { request: String },
    /// A grant names the destination, but not this method or path.
    Rule { request: String, grants: String },
    /// The name resolved only to addresses no matching grant names.
    Address {
        request: String,
        address: std::net::IpAddr,
        range: &'static str,
    },
    /// A secret's placeholder bound where the secret may not go.
    Secret {
        request: String,
        secret: String,
        in_uri: bool,
    },
    /// The task sent its limit of requests.
    Requests { limit: u32 },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Destination { request } => write!(
                f,
                "{request}: no grant in the tenant's http_hosts names this host and port"
            ),
            Refusal::Rule { request, grants } => write!(
                f,
                "{request}: outside the method and path rules of grant {grants}"
            ),
            Refusal::Address {
                request,
                address,
                range,
            } => write!(
                f,
                "{request}: resolves to {address}, a {range} address, which its grant does not name (add it to the grant's addresses to allow it)"
            ),
            Refusal::Secret {
                request,
                secret,
                in_uri: false,
            } => write!(
                f,
                "{request}: carries the placeholder of secret `{secret}`, which may not be sent to this host"
            ),
            Refusal::Secret {
                request,
                secret,
                in_uri: true,
            } => write!(
                f,
                "{request}: carries the placeholder of secret `{secret}` in its URI, where the secret may not go (only in headers, unless its in_query is set)"
            ),
            Refusal::Requests { limit } => write!(
                f,
                "the task sent its limit of {limit} requests (limits.max_http_requests)"
            ),
        }
    }
}

impl Refusal {
    fn error(&self) -> wasmtime_wasi_http::Error {
        match self {
            Refusal::Address { .. } => wasmtime_wasi_http::Error::DestinationIpProhibited,
            Refusal::Requests { .. } => wasmtime_wasi_http::Error::ConnectionLimitReached,
            _ => wasmtime_wasi_http::Error::HttpRequestDenied,
        }
    }
}

/// The `wasi:http` hooks of one task: the tenant's grants decide, secrets
/// are put in place, the request goes to a checked address, and its body
/// and its response's body are metered against the task's byte budget.
#[derive(Debug)]
pub(crate) struct HttpPolicy {
    grants: Arc<[HttpGrant]>,
    secrets: Arc<Secrets>,
    /// Requests the task may still send (`limits.max_http_requests`).
    requests_left: u32,
    max_requests: u32,
    /// `limits.max_http_bytes`: the budget of `traffic`.
    max_bytes: u64,
    labels: Arc<TaskLabels>,
    /// Made at the task's first request: a task that sends none (most do
    /// not) allocates nothing for outbound HTTP.
    traffic: Option<Traffic>,
    /// Shadow replay's: the task's HTTP recorded, or answered from a
    /// recording instead of the network.
    tape: Option<Arc<Tape>>,
}

/// What a task's requests share, in flight or refused.
#[derive(Debug, Clone)]
struct Traffic {
    /// Body bytes the task may still move (`limits.max_http_bytes`).
    bytes: Arc<ByteBudget>,
    refusals: Arc<Mutex<Vec<String>>>,
    labels: Arc<TaskLabels>,
}

impl HttpPolicy {
    pub(crate) fn new(
        grants: Arc<[HttpGrant]>,
        secrets: Arc<Secrets>,
        max_requests: u32,
        max_bytes: u64,
        labels: Arc<TaskLabels>,
        tape: Option<Arc<Tape>>,
    ) -> Self {
        HttpPolicy {
            grants,
            secrets,
            requests_left: max_requests,
            max_requests,
            max_bytes,
            labels,
            traffic: None,
            tape,
        }
    }

    /// What corral refused this task, for its failure: the first few.
    pub(crate) fn refusals(&self) -> Vec<String> {
        self.traffic
            .as_ref()
            .map(|traffic| lock(&traffic.refusals).clone())
            .unwrap_or_default()
    }

    /// The task's shared traffic state, made at its first request.
    fn traffic(&mut self) -> Traffic {
        let (max_bytes, labels) = (self.max_bytes, &self.labels);
        self.traffic
            .get_or_insert_with(|| Traffic {
                bytes: ByteBudget::new(max_bytes),
                refusals: Arc::default(),
                labels: labels.clone(),
            })
            .clone()
    }

    /// The grants that allow this request's destination, method and path.
    fn check(
        &self,
        request: &hyper::http::Request<WasiBody>,
        shown: &str,
    ) -> Result<(String, u16, Vec<HttpGrant>), Refusal> {
        let uri = request.uri();
        let destination = || Refusal::Destination {
            request: shown.to_owned(),
        };
        let host = uri.host().ok_or_else(destination)?;
        let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        });
        let by_host: Vec<&HttpGrant> = self
            .grants
            .iter()
            .filter(|g| g.host().allows(host, port))
            .collect();
        if by_host.is_empty() {
            return Err(destination());
        }
        let matching: Vec<HttpGrant> = by_host
            .iter()
            .filter(|g| g.allows_request(request.method(), uri.path()))
            .map(|g| (*g).clone())
            .collect();
        if matching.is_empty() {
            let grants: Vec<String> = by_host.iter().map(|g| format!("`{g}`")).collect();
            return Err(Refusal::Rule {
                request: shown.to_owned(),
                grants: grants.join(", "),
            });
        }
        Ok((host.to_owned(), port, matching))
    }
}

impl Traffic {
    /// Logs and keeps why, and fails the request with the standard error.
    fn refuse(&self, refusal: Refusal) -> Sent {
        let TaskLabels {
            tenant,
            activity_type,
            activity_id,
        } = &*self.labels;
        let message = refusal.to_string();
        // A guest may ask again and again: the host's log gets each of the
        // first few distinct refusals once, the rest only at debug.
        let mut kept = lock(&self.refusals);
        if kept.len() < KEPT_REFUSALS && !kept.contains(&message) {
            tracing::warn!(%tenant, %activity_type, %activity_id, "outbound HTTP refused: {message}");
            kept.push(message);
        } else {
            tracing::debug!(%tenant, %activity_type, %activity_id, "outbound HTTP refused: {message}");
        }
        let error = refusal.error();
        Box::new(async move { Err(error) })
    }
}

/// The longest a request is shown in the host's log, a refusal or a span.
const MAX_SHOWN: usize = 300;

/// How a request is shown in a refusal, the host's log and the `http`
/// span: method, scheme, authority, path, never the query (where a
/// secret's placeholder may go); every value of the tenant's secrets
/// redacted (a guest that learned one may put it in a path or a host
/// name), control characters escaped, at most [`MAX_SHOWN`] bytes.
fn shown(request: &hyper::http::Request<WasiBody>, secrets: &Secrets) -> String {
    let uri = request.uri();
    let text = format!(
        "{} {}://{}{}",
        request.method(),
        uri.scheme_str().unwrap_or("http"),
        uri.authority().map_or("", |a| a.as_str()),
        uri.path()
    );
    crate::shown::shown(&secrets.redact(&text), MAX_SHOWN)
}

type Sent = Box<
    dyn Future<Output = wasmtime_wasi_http::Result<(hyper::http::Response<WasiBody>, send::Worker)>>
        + Send,
>;

impl WasiHttpHooks for HttpPolicy {
    fn send_request(
        &mut self,
        mut request: hyper::http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
    ) -> Sent {
        let traffic = self.traffic();
        let shown = shown(&request, &self.secrets);
        // As the guest wrote it, placeholders and all: what a recording
        // keeps and a replay matches.
        let guest_request = self.tape.as_ref().map(|_| GuestRequest::of(&request));
        let (host, port, grants) = match self.check(&request, &shown) {
            Ok(checked) => checked,
            Err(refusal) => return traffic.refuse(refusal),
        };
        if let Err(misplaced) = self.secrets.substitute(&mut request, &host, port) {
            return traffic.refuse(Refusal::Secret {
                request: shown,
                secret: misplaced.name,
                in_uri: misplaced.in_uri,
            });
        }
        let Some(left) = self.requests_left.checked_sub(1) else {
            return traffic.refuse(Refusal::Requests {
                limit: self.max_requests,
            });
        };
        self.requests_left = left;
        let mut recording = None;
        // Under the guest's span; the next hop's parent is this span.
        // The method is the guest's text too.
        let method = crate::shown::shown(&self.secrets.redact(request.method().as_str()), 32);
        let span = tracing::info_span!(
            "http",
            method = %method,
            url = %shown,
            status = tracing::field::Empty,
        );
        if !request.headers().contains_key("traceparent")
            && let Some(parent) = crate::trace::traceparent(&span)
            && let Ok(value) = hyper::http::HeaderValue::from_str(&parent)
        {
            request.headers_mut().insert("traceparent", value);
        }
        if let (Some(tape), Some(guest)) = (&self.tape, guest_request) {
            if tape.replaying() {
                // Answered from the recording: nothing goes out.
                let tape = tape.clone();
                // The task's body is read against its byte budget, as if
                // it went out.
                let sent = Metered::wrap(
                    request.into_body(),
                    traffic.bytes.clone(),
                    Direction::Request,
                );
                return Box::new(
                    async move {
                        let response = tape
                            .answer(&guest, sent)
                            .await
                            .map_err(|_| wasmtime_wasi_http::Error::HttpRequestDenied)?;
                        tracing::Span::current().record("status", response.status().as_u16());
                        let response = response
                            .map(|body| Metered::wrap(body, traffic.bytes, Direction::Response));
                        let worker: send::Worker = Box::new(async { Ok(()) });
                        Ok((response, worker))
                    }
                    .instrument(span),
                );
            }
            let (parts, body) = request.into_parts();
            let (body, slot) = tape.send(&guest, body);
            request = hyper::http::Request::from_parts(parts, body);
            recording = slot;
        }
        let bare = send::bare_host(request.uri()).unwrap_or(&host).to_owned();
        Box::new(
            async move {
                let resolved = send::resolve(&bare, port, options).await?;
                let (reachable, unreachable): (Vec<SocketAddr>, Vec<SocketAddr>) = resolved
                    .into_iter()
                    .partition(|a| grants.iter().any(|g| g.reaches(a.ip())));
                if reachable.is_empty() {
                    let address = unreachable.first().map(SocketAddr::ip);
                    let refusal = Refusal::Address {
                        request: shown,
                        address: address.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()),
                        range: address.and_then(special_range).unwrap_or("non-public"),
                    };
                    return Box::into_pin(traffic.refuse(refusal)).await;
                }
                let budget = traffic.bytes;
                let request =
                    request.map(|body| Metered::wrap(body, budget.clone(), Direction::Request));
                let (response, worker) = send::send(request, options, reachable).await?;
                tracing::Span::current().record("status", response.status().as_u16());
                let response = match &recording {
                    Some(slot) => slot.response(response),
                    None => response,
                };
                let response =
                    response.map(|body| Metered::wrap(body, budget, Direction::Response));
                Ok((response, worker))
            }
            .instrument(span),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    use crate::sandbox::destination::HttpHost;

    fn policy(grants: &[HttpGrant]) -> HttpPolicy {
        HttpPolicy::new(
            grants.iter().cloned().collect(),
            Arc::default(),
            1,
            0,
            Arc::default(),
            None,
        )
    }

    fn request(method: &str, uri: &str) -> hyper::http::Request<WasiBody> {
        let body = http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed_unsync();
        hyper::http::Request::builder()
            .method(method)
            .uri(uri)
            .body(body)
            .unwrap()
    }

    fn allows(p: &HttpPolicy, method: &str, uri: &str) -> Result<(), Refusal> {
        let r = request(method, uri);
        p.check(&r, &shown(&r, &Secrets::default())).map(drop)
    }

    #[test]
    fn grants_match_host_port_and_subdomains() {
        let grants: Vec<HttpGrant> = [
            "api.example.com",
            "127.0.0.1:8080",
            "*.svc.example",
            "[::1]:9",
        ]
        .iter()
        .map(|g| g.parse().unwrap())
        .collect();
        let p = policy(&grants);
        let ok = |uri: &str| allows(&p, "GET", uri).is_ok();
        assert!(ok("https://api.example.com/x"));
        assert!(ok("http://API.example.com:81/x"));
        assert!(!ok("https://api.example.com.evil.io/"));
        assert!(ok("http://127.0.0.1:8080/"));
        assert!(!ok("http://127.0.0.1:8081/"));
        assert!(!ok("http://127.0.0.1/"), "port 80 is not 8080");
        assert!(ok("https://a.svc.example/"));
        assert!(ok("https://a.b.svc.example/"));
        assert!(!ok("https://svc.example/"), "a wildcard is not the apex");
        assert!(!ok("https://xsvc.example/"));
        assert!(ok("http://[::1]:9/"));
        assert!(allows(&policy(&[]), "GET", "https://api.example.com/").is_err());
    }

    #[test]
    fn a_refusal_names_the_rule_that_refused() {
        let stripe: HttpGrant = "api.stripe.com".parse().unwrap();
        let stripe = stripe
            .with_methods(["POST"])
            .unwrap()
            .with_paths(["/v1/charges"])
            .unwrap();
        let p = policy(&[stripe]);
        let refused = allows(
            &p,
            "GET",
            "https://api.stripe.com/v1/charges?key=corral-secret:K",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            refused,
            "GET https://api.stripe.com/v1/charges: outside the method and path rules of grant `api.stripe.com methods POST paths /v1/charges`"
        );
        let refused = allows(&p, "POST", "https://evil.io/")
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("no grant in the tenant's http_hosts"),
            "{refused}"
        );
        assert!(allows(&p, "POST", "https://api.stripe.com/v1/charges").is_ok());
    }

    #[test]
    fn bad_grants_are_named() {
        for bad in ["", "http://x", "user@host", "*.[::1]", "a b"] {
            let err = bad.parse::<HttpHost>().unwrap_err().to_string();
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
