//! One task's tape: its outbound HTTP recorded as it goes out and comes
//! back, or played back from a recording without touching the network.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use sha2::{Digest, Sha256};
use wasmtime_wasi_http::WasiBody;

use super::{Exchange, MAX_ATTEMPT_BYTES};
use crate::sandbox::secrets::{Cut, Secrets};
use crate::sync::lock;

/// A task's outbound HTTP, recorded or played back, and the fuel it used.
#[derive(Debug)]
pub struct Tape {
    mode: Mode,
    fuel: AtomicU64,
}

#[derive(Debug)]
enum Mode {
    Record(Recorder),
    Replay(Player),
}

#[derive(Debug, Default)]
struct Recorder {
    exchanges: Mutex<Vec<Slot>>,
    /// Shared with each exchange's [`Slot`].
    bound: Arc<Bound>,
}

/// What one attempt has recorded, against [`MAX_ATTEMPT_BYTES`].
#[derive(Debug, Default)]
struct Bound {
    bytes: AtomicUsize,
    /// Set when the attempt went past it, or got what cannot be kept:
    /// then nothing of it is.
    over: AtomicBool,
}

impl Bound {
    fn charge(&self, n: usize) {
        if self.bytes.fetch_add(n, Ordering::Relaxed) + n > MAX_ATTEMPT_BYTES {
            self.refuse();
        }
    }

    fn refuse(&self) {
        self.over.store(true, Ordering::Relaxed);
    }

    fn over(&self) -> bool {
        self.over.load(Ordering::Relaxed)
    }
}

#[derive(Debug)]
struct Player {
    exchanges: Vec<Exchange>,
    used: Mutex<Vec<bool>>,
    /// What the replayed task did that the recording did not.
    deviations: Mutex<Vec<String>>,
}

/// Deviations a replayed task keeps, at most.
const KEPT_DEVIATIONS: usize = 4;

impl Tape {
    /// A tape that records what the task's requests send and receive, for
    /// an attempt whose arguments take `recorded` bytes already.
    pub fn record(recorded: usize) -> Arc<Tape> {
        let recorder = Recorder::default();
        recorder.bound.charge(recorded);
        Arc::new(Tape {
            mode: Mode::Record(recorder),
            fuel: AtomicU64::new(0),
        })
    }

    /// A tape that answers the task's requests from `exchanges`.
    pub fn replay(exchanges: Vec<Exchange>) -> Arc<Tape> {
        let used = Mutex::new(vec![false; exchanges.len()]);
        Arc::new(Tape {
            mode: Mode::Replay(Player {
                exchanges,
                used,
                deviations: Mutex::default(),
            }),
            fuel: AtomicU64::new(0),
        })
    }

    /// The fuel the task's guest used.
    pub fn fuel(&self) -> u64 {
        self.fuel.load(Ordering::Relaxed)
    }

    pub(crate) fn set_fuel(&self, fuel: u64) {
        self.fuel.store(fuel, Ordering::Relaxed);
    }

    /// What was recorded, every value of the tenant's secrets redacted
    /// wherever it is (a guest that learned one may write it into a URI),
    /// and a body whose end never came (the connection closed, the task
    /// ended, the guest stopped reading) cut short of what may be the start
    /// of a value; `None` for a replay, or when the attempt went over what
    /// one may record or got a body corral cannot redact (a content or
    /// transfer coding).
    pub fn recorded(&self, secrets: &Secrets) -> Option<Vec<Exchange>> {
        let Mode::Record(recorder) = &self.mode else {
            return None;
        };
        if recorder.bound.over() {
            return None;
        }
        let exchanges = lock(&recorder.exchanges);
        Some(
            exchanges
                .iter()
                .map(|slot| {
                    let mut e = lock(&slot.exchange).clone();
                    let cut = Cut {
                        start: false,
                        end: !slot.body_ended.load(Ordering::Relaxed),
                    };
                    secrets.redact_cut(&mut e.body, cut);
                    e.method = secrets.redact(&e.method).into_owned();
                    e.uri = secrets.redact(&e.uri).into_owned();
                    for (name, value) in &mut e.headers {
                        *name = secrets.redact(name).into_owned();
                        *value = secrets.redact(value).into_owned();
                    }
                    e
                })
                .collect(),
        )
    }

    /// What a replayed task did that its recording did not: requests it
    /// was never answered, bodies that differed, answers it never asked
    /// for.
    pub fn deviations(&self) -> Vec<String> {
        let Mode::Replay(player) = &self.mode else {
            return Vec::new();
        };
        let mut deviations = lock(&player.deviations).clone();
        let unasked = lock(&player.used).iter().filter(|used| !**used).count();
        if unasked > 0 {
            deviations.push(format!("{unasked} recorded request(s) never sent"));
        }
        deviations
    }

    pub(crate) fn replaying(&self) -> bool {
        matches!(self.mode, Mode::Replay(_))
    }

    /// Starts recording a request: its body is digested as it goes out.
    /// The request's method and URI are the guest's (before secrets are
    /// put in place).
    pub(crate) fn send(&self, guest: &GuestRequest, body: WasiBody) -> (WasiBody, Option<Slot>) {
        let Mode::Record(recorder) = &self.mode else {
            return (body, None);
        };
        let GuestRequest {
            method,
            uri,
            headers,
        } = guest;
        let exchange = Arc::new(Mutex::new(Exchange {
            method: method.clone(),
            uri: uri.clone(),
            request_sha256: String::new(),
            request_headers_sha256: headers.clone(),
            status: None,
            headers: Vec::new(),
            body: Vec::new(),
        }));
        recorder.bound.charge(method.len() + uri.len() + 64);
        let slot = Slot {
            exchange,
            bound: recorder.bound.clone(),
            body_ended: Arc::default(),
        };
        lock(&recorder.exchanges).push(slot.clone());
        let taped = Taped {
            inner: body,
            slot: slot.clone(),
            hasher: Some(Sha256::new()),
            response: false,
        }
        .boxed_unsync();
        (taped, Some(slot))
    }

    /// The recorded answer to a request, or why there is none. The
    /// request's body is read as it would be sent (metered by the caller)
    /// and digested, not kept.
    pub(crate) async fn answer(
        &self,
        guest: &GuestRequest,
        mut body: WasiBody,
    ) -> Result<hyper::http::Response<WasiBody>, String> {
        let Mode::Replay(player) = &self.mode else {
            return Err("not a replay".to_owned());
        };
        let GuestRequest {
            method,
            uri,
            headers,
        } = guest;
        let mut hasher = Some(Sha256::new());
        while let Some(frame) = body.frame().await {
            match (frame, hasher.as_mut()) {
                (Ok(frame), Some(hasher)) => {
                    if let Some(data) = frame.data_ref() {
                        hasher.update(data);
                    }
                }
                _ => hasher = None,
            }
        }
        let sent = hasher.map(|h| hex::encode(h.finalize()));
        let found = {
            let mut used = lock(&player.used);
            let found = player
                .exchanges
                .iter()
                .enumerate()
                .find(|(i, e)| !used[*i] && e.method == *method && e.uri == *uri);
            if let Some((i, _)) = found {
                used[i] = true;
            }
            found.map(|(_, e)| e.clone())
        };
        // Never the query, where a secret's placeholder may go.
        let path = uri.split(['?', '#']).next().unwrap_or_default();
        let shown = crate::shown::shown(&format!("{method} {path}"), 200);
        let Some(exchange) = found else {
            let deviation = format!("{shown}: not in the recording");
            player.deviate(deviation.clone());
            return Err(deviation);
        };
        if sent.as_deref() != Some(exchange.request_sha256.as_str()) {
            player.deviate(format!("{shown}: another request body"));
        }
        if *headers != exchange.request_headers_sha256 {
            player.deviate(format!("{shown}: other request headers"));
        }
        let Some(status) = exchange.status else {
            return Err(format!("{shown}: it failed when recorded"));
        };
        let mut response = hyper::http::Response::builder().status(status);
        for (name, value) in &exchange.headers {
            response = response.header(name, value);
        }
        let body = http_body_util::Full::new(Bytes::from(exchange.body))
            .map_err(|never| match never {})
            .boxed_unsync();
        response.body(body).map_err(|e| format!("{shown}: {e}"))
    }
}

impl Player {
    fn deviate(&self, deviation: String) {
        let mut kept = lock(&self.deviations);
        if kept.len() < KEPT_DEVIATIONS {
            kept.push(deviation);
        }
    }
}

/// Where one recorded exchange's parts are filled in.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    exchange: Arc<Mutex<Exchange>>,
    bound: Arc<Bound>,
    /// Whether the response's body was read to its end: one that was not
    /// may end inside a value.
    body_ended: Arc<AtomicBool>,
}

impl Slot {
    /// The response's head came: its status and headers are recorded, and
    /// its body as the guest reads it.
    pub(crate) fn response(
        &self,
        response: hyper::http::Response<WasiBody>,
    ) -> hyper::http::Response<WasiBody> {
        // A body in a coding the recorder cannot read as the guest will
        // (compressed, by either header) would carry a secret past
        // redaction: the attempt is not recorded.
        if !plain_body(response.headers()) {
            self.bound.refuse();
        }
        // Cookies are credentials no secret names: not kept.
        let headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .filter(|(k, _)| *k != hyper::http::header::SET_COOKIE)
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        self.bound
            .charge(headers.iter().map(|(k, v)| k.len() + v.len()).sum());
        {
            let mut exchange = lock(&self.exchange);
            exchange.status = Some(response.status().as_u16());
            exchange.headers = headers;
        }
        let slot = self.clone();
        response.map(|inner| {
            Taped {
                inner,
                slot,
                hasher: None,
                response: true,
            }
            .boxed_unsync()
        })
    }
}

/// Whether a response's body arrives as its bytes are (what the recorder
/// keeps and redacts is what a replay hands the guest): no content coding
/// but `identity`, no transfer coding but `chunked` (which the HTTP client
/// takes off) and `identity`. `gzip, chunked` as a transfer coding leaves
/// the body compressed after the client took the chunks off.
fn plain_body(headers: &hyper::http::HeaderMap) -> bool {
    let only = |name: hyper::http::header::HeaderName, allowed: &[&str]| {
        headers.get_all(name).iter().all(|value| {
            value.to_str().is_ok_and(|codings| {
                codings
                    .split(',')
                    .map(str::trim)
                    .all(|c| allowed.iter().any(|a| c.eq_ignore_ascii_case(a)))
            })
        })
    };
    only(hyper::http::header::CONTENT_ENCODING, &["identity"])
        && only(
            hyper::http::header::TRANSFER_ENCODING,
            &["chunked", "identity"],
        )
}

/// What a recording keeps and a replay matches of a request, as the guest
/// made it: its method, its URI (placeholders, not secrets) and a digest of
/// its headers.
#[derive(Debug, Clone)]
pub(crate) struct GuestRequest {
    pub(crate) method: String,
    pub(crate) uri: String,
    pub(crate) headers: String,
}

impl GuestRequest {
    pub(crate) fn of<B>(request: &hyper::http::Request<B>) -> GuestRequest {
        let mut headers: Vec<(&str, &[u8])> = request
            .headers()
            .iter()
            .filter(|(name, _)| name.as_str() != "traceparent")
            .map(|(name, value)| (name.as_str(), value.as_bytes()))
            .collect();
        headers.sort_unstable();
        let mut hasher = Sha256::new();
        for (name, value) in headers {
            hasher.update(name.as_bytes());
            hasher.update(b":");
            hasher.update(value);
            hasher.update(b"\n");
        }
        GuestRequest {
            method: request.method().to_string(),
            uri: request.uri().to_string(),
            headers: hex::encode(hasher.finalize()),
        }
    }
}

/// A body on its way through a recording: a request's digested as it goes
/// out, a response's copied as the guest reads it.
struct Taped {
    inner: WasiBody,
    slot: Slot,
    /// A request's digest so far; `None` for a response (or once done).
    hasher: Option<Sha256>,
    response: bool,
}

impl Taped {
    /// The request's digest, once: at its end, or where it was dropped
    /// without its end being polled (an empty body, most often).
    fn digested(&mut self) {
        if let Some(hasher) = self.hasher.take() {
            let mut exchange = lock(&self.slot.exchange);
            if exchange.request_sha256.is_empty() {
                exchange.request_sha256 = hex::encode(hasher.finalize());
            }
        }
    }
}

impl Body for Taped {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                let Some(data) = frame.data_ref() else {
                    return polled;
                };
                if let Some(hasher) = self.hasher.as_mut() {
                    hasher.update(data);
                } else {
                    self.slot.bound.charge(data.len());
                    if !self.slot.bound.over() {
                        lock(&self.slot.exchange).body.extend_from_slice(data);
                    }
                    if self.inner.is_end_stream() {
                        self.slot.body_ended.store(true, Ordering::Relaxed);
                    }
                }
            }
            Poll::Ready(None) if self.response => {
                self.slot.body_ended.store(true, Ordering::Relaxed);
            }
            Poll::Ready(None) => self.digested(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Taped {
    fn drop(&mut self) {
        self.digested();
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;

    use super::*;

    fn body(bytes: &'static [u8]) -> WasiBody {
        http_body_util::Full::new(Bytes::from_static(bytes))
            .map_err(|never| match never {})
            .boxed_unsync()
    }

    fn guest(method: &str, uri: &str, headers: &[(&str, &str)]) -> GuestRequest {
        let mut request = hyper::http::Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        GuestRequest::of(&request.body(()).unwrap())
    }

    fn exchange(guest: &GuestRequest, sent: &[u8], answer: &[u8]) -> Exchange {
        Exchange {
            method: guest.method.clone(),
            uri: guest.uri.clone(),
            request_sha256: super::super::sha256_hex(sent),
            request_headers_sha256: guest.headers.clone(),
            status: Some(200),
            headers: vec![("x-n".into(), "1".into())],
            body: answer.to_vec(),
        }
    }

    async fn read(r: hyper::http::Response<WasiBody>) -> Bytes {
        r.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn a_replay_answers_each_recorded_request_once_in_order_and_names_what_differs() {
        let get = guest("GET", "http://a/x?key=corral-secret:K", &[]);
        let post = guest(
            "POST",
            "http://a/y",
            &[("authorization", "corral-secret:K")],
        );
        let tape = Tape::replay(vec![
            exchange(&get, b"", b"first"),
            exchange(&get, b"", b"second"),
            exchange(&post, b"in", b"posted"),
        ]);
        let first = tape.answer(&get, body(b"")).await.unwrap();
        assert_eq!(first.headers()["x-n"], "1");
        assert_eq!(read(first).await, "first");
        assert_eq!(
            read(tape.answer(&get, body(b"")).await.unwrap()).await,
            "second"
        );
        let unknown = tape.answer(&get, body(b"")).await.unwrap_err();
        assert_eq!(
            unknown, "GET http://a/x: not in the recording",
            "never the query"
        );
        assert_eq!(
            tape.deviations(),
            vec![unknown, "1 recorded request(s) never sent".to_owned()]
        );
        // The same request with another body and without its header.
        let bare = guest("POST", "http://a/y", &[]);
        assert_eq!(
            read(tape.answer(&bare, body(b"other")).await.unwrap()).await,
            "posted"
        );
        assert_eq!(
            tape.deviations()[1..],
            [
                "POST http://a/y: another request body".to_owned(),
                "POST http://a/y: other request headers".to_owned()
            ]
        );
        // A guest's trace context is not part of the request compared.
        assert_eq!(
            guest("GET", "http://a/", &[("traceparent", "00-1-2-01")]).headers,
            guest("GET", "http://a/", &[]).headers
        );
    }

    #[tokio::test]
    async fn a_recording_keeps_what_the_guest_sent_and_read_and_stops_past_its_bound() {
        let tape = Tape::record(10);
        let put = guest("PUT", "http://a/?k=corral-secret:K", &[]);
        let (sent, slot) = tape.send(&put, body(b"hello"));
        assert_eq!(sent.collect().await.unwrap().to_bytes(), "hello");
        let response = hyper::http::Response::builder()
            .status(201)
            .header("set-cookie", "session=1")
            .body(body(b"made"))
            .unwrap();
        let response = slot.unwrap().response(response);
        assert_eq!(read(response).await, "made");
        let recorded = tape.recorded(&Secrets::default()).unwrap();
        assert_eq!(
            recorded,
            vec![Exchange {
                method: "PUT".into(),
                uri: "http://a/?k=corral-secret:K".into(),
                request_sha256: super::super::sha256_hex(b"hello"),
                request_headers_sha256: put.headers.clone(),
                status: Some(201),
                headers: Vec::new(),
                body: b"made".to_vec(),
            }]
        );
        // A compressed body cannot be redacted: nothing is kept.
        let zipped = Tape::record(0);
        let (_, slot) = zipped.send(&put, body(b""));
        let response = hyper::http::Response::builder()
            .header("content-encoding", "gzip")
            .body(body(b"\x1f\x8b"))
            .unwrap();
        drop(read(slot.unwrap().response(response)).await);
        assert_eq!(zipped.recorded(&Secrets::default()), None);
        // Nor one compressed as it is transferred, whatever the case or
        // the spaces: the client takes the chunks off, not the gzip.
        for coding in ["gzip, chunked", "GZIP,chunked", "deflate"] {
            let zipped = Tape::record(0);
            let (_, slot) = zipped.send(&put, body(b""));
            let response = hyper::http::Response::builder()
                .header("transfer-encoding", coding)
                .body(body(b"\x1f\x8b"))
                .unwrap();
            drop(read(slot.unwrap().response(response)).await);
            assert_eq!(zipped.recorded(&Secrets::default()), None, "{coding}");
        }
        // Chunks alone are bytes as they are.
        let chunked = Tape::record(0);
        let (_, slot) = chunked.send(&put, body(b""));
        let response = hyper::http::Response::builder()
            .header("transfer-encoding", "chunked")
            .body(body(b"plain"))
            .unwrap();
        drop(read(slot.unwrap().response(response)).await);
        assert_eq!(
            chunked.recorded(&Secrets::default()).unwrap()[0].body,
            b"plain"
        );
        // Past the bound, arguments included: nothing is kept.
        let big: &'static [u8] = Box::leak(vec![0u8; MAX_ATTEMPT_BYTES].into_boxed_slice());
        let (_, slot) = tape.send(&put, body(b""));
        drop(
            read(
                slot.unwrap()
                    .response(hyper::http::Response::new(body(big))),
            )
            .await,
        );
        assert_eq!(tape.recorded(&Secrets::default()), None);
        assert_eq!(
            Tape::record(MAX_ATTEMPT_BYTES + 1).recorded(&Secrets::default()),
            None
        );
    }

    #[tokio::test]
    async fn a_response_that_ends_inside_a_value_leaves_no_piece_of_it_in_the_recording() {
        const VALUE: &str = "sk_live_0123456789abcdef";
        let dir = tempfile::tempdir().unwrap();
        let secrets =
            crate::sandbox::secrets::tests::secrets(&dir, &[("K", VALUE, &["a.example"], false)]);
        let get = guest("GET", "https://a.example/", &[]);
        // Whole values redacted; a body cut anywhere inside the last one
        // (the connection closed, the deadline passed, the guest stopped
        // reading) keeps no piece of it.
        for cut in 0..=VALUE.len() {
            let text = format!("echo {VALUE} {} {}", "z".repeat(300), &VALUE[..cut]);
            let tape = Tape::record(0);
            let (_, slot) = tape.send(&get, body(b""));
            let first: Result<Frame<Bytes>, wasmtime_wasi_http::Error> =
                Ok(Frame::data(Bytes::from(text)));
            // One frame, then nothing more: the end never comes.
            let never_ends = http_body_util::StreamBody::new(
                futures::stream::iter([first]).chain(futures::stream::pending()),
            )
            .boxed_unsync();
            let response = slot
                .unwrap()
                .response(hyper::http::Response::new(never_ends));
            let mut read = response.into_body();
            read.frame().await.unwrap().unwrap();
            drop(read);
            let recorded = tape.recorded(&secrets).unwrap();
            let kept = String::from_utf8(recorded[0].body.clone()).unwrap();
            for piece in VALUE.as_bytes().windows(4) {
                let piece = std::str::from_utf8(piece).unwrap();
                assert!(!kept.contains(piece), "cut at {cut}: {kept}");
            }
            assert!(kept.starts_with("echo [secret K]"), "cut at {cut}: {kept}");
        }
        // A body read to its end is kept whole.
        let tape = Tape::record(0);
        let (_, slot) = tape.send(&get, body(b""));
        let whole = format!("echo {VALUE} and more").into_bytes();
        let response = hyper::http::Response::new(body(Box::leak(whole.into_boxed_slice())));
        drop(read(slot.unwrap().response(response)).await);
        assert_eq!(
            tape.recorded(&secrets).unwrap()[0].body,
            b"echo [secret K] and more"
        );
    }
}
