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
use std::str::FromStr;
use std::sync::Arc;

use hyper::http::uri::Authority;
use wasmtime_wasi_http::{RequestOptions, WasiHttpHooks};

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
/// request goes out as wasmtime sends it.
#[derive(Debug, Clone, Default)]
pub(crate) struct HttpPolicy {
    pub(crate) hosts: Arc<[HttpHost]>,
    /// Requests the task may still send (`limits.max_http_requests`).
    pub(crate) requests_left: u32,
}

impl HttpPolicy {
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
        wasmtime_wasi_http::default_hooks().send_request(request, options, fut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(grants: &[&str]) -> HttpPolicy {
        HttpPolicy {
            hosts: grants.iter().map(|g| g.parse().unwrap()).collect(),
            requests_left: 1,
        }
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
