//! `demo:fetch`: an activity that calls out over HTTP with `wasi:http`,
//! which corral grants per tenant and per host.

use corral_guest::Failure;
use wasi::http::outgoing_handler;
use wasi::http::types::{ErrorCode, Fields, OutgoingRequest, Scheme};

corral_guest::generate!("demo:fetch/fetch");

use exports::demo::fetch::api::{Fetched, Guest};

struct Fetch;

impl Guest for Fetch {
    fn get(url: String) -> Result<Fetched, Failure> {
        let (scheme, rest) = if let Some(rest) = url.strip_prefix("http://") {
            (Scheme::Http, rest)
        } else if let Some(rest) = url.strip_prefix("https://") {
            (Scheme::Https, rest)
        } else {
            return Err(
                Failure::new("BadUrl", format!("`{url}` is not an http(s) URL")).non_retryable(),
            );
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let request = OutgoingRequest::new(Fields::new());
        let path = if path.is_empty() { "/" } else { path };
        let invalid =
            |what: &str| Failure::new("BadUrl", format!("`{url}`: invalid {what}")).non_retryable();
        request
            .set_scheme(Some(&scheme))
            .map_err(|()| invalid("scheme"))?;
        request
            .set_authority(Some(authority))
            .map_err(|()| invalid("authority"))?;
        request
            .set_path_with_query(Some(path))
            .map_err(|()| invalid("path"))?;
        let response = outgoing_handler::handle(request, None).map_err(http_failure)?;
        response.subscribe().block();
        let response = response
            .get()
            .ok_or_else(|| Failure::new("Http", "no response after waiting for one"))?
            .map_err(|()| Failure::new("Http", "the response was already taken"))?
            .map_err(http_failure)?;
        let status = response.status();
        let body = response
            .consume()
            .map_err(|()| Failure::new("Http", "the body was already taken"))?;
        let stream = body
            .stream()
            .map_err(|()| Failure::new("Http", "the body stream was already taken"))?;
        let mut bytes = Vec::new();
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(wasi::io::streams::StreamError::Closed) => break,
                Err(wasi::io::streams::StreamError::LastOperationFailed(e)) => {
                    // The host says why the body broke off (its size limit,
                    // a reset connection) as an HTTP error code.
                    return Err(match wasi::http::types::http_error_code(&e) {
                        Some(code) => http_failure(code),
                        None => Failure::new(
                            "Http",
                            format!("reading the body: {}", e.to_debug_string()),
                        ),
                    });
                }
            }
        }
        Ok(Fetched {
            status,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }
}

/// `HTTP-request-denied` is the host refusing the destination: not worth
/// retrying. Anything else (connection refused, timeouts) may pass.
fn http_failure(error: ErrorCode) -> Failure {
    match error {
        ErrorCode::HttpRequestDenied => {
            Failure::new("Denied", "the host does not allow this destination").non_retryable()
        }
        other => Failure::new("Http", format!("{other:?}")),
    }
}

export!(Fetch);
