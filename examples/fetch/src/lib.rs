//! `demo:fetch`: activities that call out over HTTP with `wasi:http`, which
//! corral grants per tenant, per destination, method and path; and a keyed
//! API called with settings from `wasi:config` and a secret the guest never
//! holds.

use corral_guest::Failure;
use wasi::http::outgoing_handler;
use wasi::http::types::{ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, Scheme};

corral_guest::generate!("demo:fetch/fetch");

use exports::demo::fetch::api::{Answer, Fetched, Guest, Outgoing};
use exports::demo::fetch::payments::Guest as Payments;

struct Fetch;

impl Guest for Fetch {
    fn get(url: String) -> Result<Fetched, Failure> {
        let answer = send(&Outgoing {
            method: "GET".into(),
            url,
            headers: Vec::new(),
            body: None,
            follow_redirects: false,
        })?;
        Ok(Fetched {
            status: answer.status,
            body: answer.body,
        })
    }

    fn send(request: Outgoing) -> Result<Answer, Failure> {
        let mut request = request;
        for _ in 0..5 {
            let answer = send(&request)?;
            match answer.location.clone() {
                Some(location) if request.follow_redirects => {
                    request.url = resolve(&request.url, &location);
                }
                _ => return Ok(answer),
            }
        }
        Err(Failure::new("Http", "more than 5 redirects").non_retryable())
    }
}

impl Payments for Fetch {
    fn charge(amount: u32) -> Result<Answer, Failure> {
        let setting = |key: &str| {
            corral_guest::config::get(key)
                .map_err(|e| Failure::new("Config", format!("reading `{key}`: {e:?}")))?
                .ok_or_else(|| {
                    Failure::new("Config", format!("`{key}` is not configured")).non_retryable()
                })
        };
        let base = setting("api_base")?;
        let currency = setting("currency")?;
        // The placeholder, not the key: corral puts the key in its place on
        // the way to the secret's own host, and refuses it anywhere else.
        let key = setting("PAY_KEY")?;
        corral_guest::log::info(&format!("charging {amount} {currency} with {key}"));
        send(&Outgoing {
            method: "POST".into(),
            url: format!("{}/v1/charges", base.trim_end_matches('/')),
            headers: vec![
                ("authorization".into(), format!("Bearer {key}")),
                ("content-type".into(), "application/json".into()),
            ],
            body: Some(format!(r#"{{"amount":{amount},"currency":"{currency}"}}"#)),
            follow_redirects: false,
        })
    }
}

/// A redirect's target: absolute, or a path on the same origin.
fn resolve(from: &str, location: &str) -> String {
    if !location.starts_with('/') {
        return location.to_owned();
    }
    let origin_end = from
        .find("://")
        .and_then(|i| from[i + 3..].find('/').map(|j| i + 3 + j))
        .unwrap_or(from.len());
    format!("{}{location}", &from[..origin_end])
}

/// One request, without following redirects.
fn send(outgoing: &Outgoing) -> Result<Answer, Failure> {
    let url = &outgoing.url;
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
    let invalid =
        |what: &str| Failure::new("BadUrl", format!("`{url}`: invalid {what}")).non_retryable();
    let headers = Fields::new();
    if let Some(body) = &outgoing.body {
        headers
            .append("content-length", &body.len().to_string().into_bytes())
            .map_err(|e| invalid(&format!("content-length ({e:?})")))?;
    }
    for (name, value) in &outgoing.headers {
        headers
            .append(name, value.as_bytes())
            .map_err(|e| invalid(&format!("header `{name}` ({e:?})")))?;
    }
    let request = OutgoingRequest::new(headers);
    let method = match outgoing.method.as_str() {
        "GET" => Method::Get,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "PATCH" => Method::Patch,
        "HEAD" => Method::Head,
        other => Method::Other(other.to_owned()),
    };
    let path = if path.is_empty() { "/" } else { path };
    request
        .set_method(&method)
        .map_err(|()| invalid("method"))?;
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| invalid("scheme"))?;
    request
        .set_authority(Some(authority))
        .map_err(|()| invalid("authority"))?;
    request
        .set_path_with_query(Some(path))
        .map_err(|()| invalid("path"))?;
    let body = request
        .body()
        .map_err(|()| Failure::new("Http", "the request body was already taken"))?;
    let response = outgoing_handler::handle(request, None).map_err(http_failure)?;
    // A request the host refuses closes its body: the response says why.
    let mut written = Ok(());
    if let Some(text) = &outgoing.body {
        let stream = body
            .write()
            .map_err(|()| Failure::new("Http", "the request body stream was already taken"))?;
        for chunk in text.as_bytes().chunks(4096) {
            if let Err(e) = stream.blocking_write_and_flush(chunk) {
                written = Err(Failure::new("Http", format!("writing the body: {e:?}")));
                break;
            }
        }
    }
    if written.is_ok() {
        OutgoingBody::finish(body, None).map_err(http_failure)?;
    }
    response.subscribe().block();
    let response = response
        .get()
        .ok_or_else(|| Failure::new("Http", "no response after waiting for one"))?
        .map_err(|()| Failure::new("Http", "the response was already taken"))?
        .map_err(http_failure)?;
    written?;
    let status = response.status();
    let location = response
        .headers()
        .get("location")
        .first()
        .map(|v| String::from_utf8_lossy(v).into_owned());
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
                    None => {
                        Failure::new("Http", format!("reading the body: {}", e.to_debug_string()))
                    }
                });
            }
        }
    }
    Ok(Answer {
        status,
        body: String::from_utf8_lossy(&bytes).into_owned(),
        location: location.filter(|_| (300..400).contains(&status)),
    })
}

/// The host refusing the destination is not worth retrying. Anything else
/// (connection refused, timeouts) may pass.
fn http_failure(error: ErrorCode) -> Failure {
    match error {
        ErrorCode::HttpRequestDenied => {
            Failure::new("Denied", "the host does not allow this request").non_retryable()
        }
        ErrorCode::DestinationIpProhibited => Failure::new(
            "Prohibited",
            "the host does not allow this destination's address",
        )
        .non_retryable(),
        other => Failure::new("Http", format!("{other:?}")),
    }
}

export!(Fetch);
