//! Placeholders become values on the way out: a request's headers (and,
//! where a secret allows it, its query) get each secret's value in place of
//! its placeholder, only when the request goes to one of the secret's hosts.
//! A placeholder bound anywhere else, or anywhere in the URI but the query,
//! refuses the request before it leaves. The values and their redaction
//! live in [`super::super::secrets`]; this is the request side.

use hyper::http::HeaderValue;

use crate::sandbox::secrets::spelling::contains;
use crate::sandbox::secrets::{Entry, PLACEHOLDER_PREFIX, Secrets};

/// Why a request carrying a placeholder was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Misplaced {
    pub(crate) name: String,
    pub(crate) destination: String,
    pub(crate) in_uri: bool,
}

impl Secrets {
    /// Puts values in place of placeholders in `request`'s headers (and
    /// query, where allowed), for a request to `host`:`port`. A
    /// placeholder whose secret may not go there is refused, and the
    /// request is left as it was.
    pub(crate) fn substitute<B>(
        &self,
        request: &mut hyper::http::Request<B>,
        host: &str,
        port: u16,
    ) -> Result<(), Misplaced> {
        if self.is_empty() {
            return Ok(());
        }
        let https = request.uri().scheme_str() == Some("https");
        let destination = if https {
            format!("{host}:{port}")
        } else {
            format!("http://{host}:{port}")
        };
        let allowed = |entry: &Entry, in_uri: bool| {
            let ok = entry
                .spec()
                .hosts
                .iter()
                .any(|h| h.allows(host, port, https))
                && (!in_uri || entry.spec().in_query);
            if ok {
                Ok(())
            } else {
                Err(Misplaced {
                    name: entry.spec().name.clone(),
                    destination: destination.clone(),
                    in_uri,
                })
            }
        };
        // Checked in full before anything is changed. A value goes in the
        // query only: a placeholder anywhere else in the URI (the
        // authority, the path) would let the value decide where the request
        // goes, and is refused whatever the secret allows.
        let uri = request.uri().clone();
        let query = uri.query().unwrap_or_default();
        let before_query = uri.to_string();
        let before_query = before_query
            .strip_suffix(query)
            .map_or(before_query.as_str(), |rest| rest.trim_end_matches('?'));
        if let Some(entry) = self.present(before_query).first() {
            return Err(Misplaced {
                name: entry.spec().name.clone(),
                destination,
                in_uri: true,
            });
        }
        let mut uri_secrets = Vec::new();
        for entry in self.present(query) {
            allowed(entry, true)?;
            uri_secrets.push(entry);
        }
        for value in request.headers().values() {
            let Ok(text) = value.to_str() else {
                if contains(value.as_bytes(), PLACEHOLDER_PREFIX.as_bytes()) {
                    // Not text: cannot be substituted, and must not go out.
                    return Err(Misplaced {
                        name: "?".into(),
                        destination,
                        in_uri: false,
                    });
                }
                continue;
            };
            for entry in self.present(text) {
                allowed(entry, false)?;
            }
        }
        // Each value in place: a header sent more than once keeps them all.
        for value in request.headers_mut().values_mut() {
            let Ok(text) = value.to_str() else { continue };
            let present = self.present(text);
            if present.is_empty() {
                continue;
            }
            let mut text = text.to_owned();
            for entry in present {
                text = text.replace(entry.placeholder(), &entry.current());
            }
            // The value was checked header-safe when it was read.
            if let Ok(mut substituted) = HeaderValue::from_str(&text) {
                substituted.set_sensitive(true);
                *value = substituted;
            }
        }
        if !uri_secrets.is_empty() {
            let mut query = query.to_owned();
            for entry in uri_secrets {
                let value = query_encoded(&entry.current());
                query = query.replace(entry.placeholder(), &value);
            }
            let mut parts = uri.into_parts();
            let path = parts
                .path_and_query
                .as_ref()
                .map_or("/", |p| p.path())
                .to_owned();
            // Encoded, the value is query text: the URI parses, and its
            // scheme and authority are what was checked.
            parts.path_and_query = format!("{path}?{query}").parse().ok();
            if let Ok(uri) = hyper::http::Uri::from_parts(parts) {
                *request.uri_mut() = uri;
            }
        }
        Ok(())
    }
}

/// `value` percent-encoded for a URI's query: every byte outside RFC 3986's
/// unreserved set, so it can end no component and start no other.
fn query_encoded(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 3);
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::secrets::SecretHost;
    use crate::sandbox::secrets::tests::{request, secrets};

    #[test]
    fn a_placeholder_becomes_the_value_only_for_its_hosts() {
        let dir = tempfile::tempdir().unwrap();
        let s = secrets(
            &dir,
            &[
                ("KEY", "sk_live_short", &["api.stripe.com"], false),
                ("KEY2", "sk_live_other", &["*.example.com"], true),
            ],
        );
        let mut ok = request("https://api.stripe.com/v1", "Bearer corral-secret:KEY");
        s.substitute(&mut ok, "api.stripe.com", 443).unwrap();
        assert_eq!(ok.headers()["authorization"], "Bearer sk_live_short");
        assert!(ok.headers()["authorization"].is_sensitive());

        // The longer name is not read as the shorter one.
        let mut two = request(
            "https://a.example.com/?k=corral-secret:KEY2",
            "corral-secret:KEY2",
        );
        s.substitute(&mut two, "a.example.com", 443).unwrap();
        assert_eq!(two.headers()["authorization"], "sk_live_other");
        assert_eq!(two.uri().query(), Some("k=sk_live_other"));

        let mut elsewhere = request("https://evil.io/", "Bearer corral-secret:KEY");
        let refused = s.substitute(&mut elsewhere, "evil.io", 443).unwrap_err();
        assert_eq!(refused.name, "KEY");
        assert_eq!(refused.destination, "evil.io:443");
        assert_eq!(
            elsewhere.headers()["authorization"],
            "Bearer corral-secret:KEY"
        );

        // A header sent twice keeps both values, each substituted.
        let mut twice = request("https://api.stripe.com/", "corral-secret:KEY");
        twice
            .headers_mut()
            .append("authorization", HeaderValue::from_static("plain"));
        s.substitute(&mut twice, "api.stripe.com", 443).unwrap();
        let values: Vec<_> = twice.headers().get_all("authorization").iter().collect();
        assert_eq!(values, ["sk_live_short", "plain"]);

        // KEY may not go in a query, even to its own host.
        let mut in_query = request("https://api.stripe.com/?k=corral-secret:KEY", "x");
        let refused = s
            .substitute(&mut in_query, "api.stripe.com", 443)
            .unwrap_err();
        assert!(refused.in_uri);
    }

    #[test]
    fn a_value_goes_in_a_query_only_encoded_never_where_it_could_move_the_request() {
        let dir = tempfile::tempdir().unwrap();
        let s = secrets(
            &dir,
            &[(
                "Q",
                "127.0.0.3/Zq9SecretTail",
                &["http://127.0.0.1:8081"],
                true,
            )],
        );
        // In the query, encoded: the request still goes where it was checked.
        let mut query = request("http://127.0.0.1:8081/x?k=corral-secret:Q", "");
        s.substitute(&mut query, "127.0.0.1", 8081).unwrap();
        assert_eq!(query.uri().authority().unwrap().as_str(), "127.0.0.1:8081");
        assert_eq!(query.uri().query(), Some("k=127.0.0.3%2FZq9SecretTail"));
        // In the authority or the path: refused, whatever in_query says.
        for uri in [
            "http://corral-secret:Q@127.0.0.1:8081/x",
            "http://127.0.0.1:8081/corral-secret:Q",
        ] {
            let mut r = request(uri, "");
            let refused = s.substitute(&mut r, "127.0.0.1", 8081).unwrap_err();
            assert!(refused.in_uri, "{uri}");
            assert_eq!(r.uri().to_string(), uri);
        }
    }

    #[test]
    fn a_host_without_a_scheme_gets_the_value_over_https_only() {
        let dir = tempfile::tempdir().unwrap();
        let s = secrets(
            &dir,
            &[
                ("TLS", "value-over-tls", &["api.example"], false),
                (
                    "PLAIN",
                    "value-in-clear",
                    &["http://inside.local:8080"],
                    false,
                ),
            ],
        );
        let mut https = request("https://api.example/", "corral-secret:TLS");
        s.substitute(&mut https, "api.example", 443).unwrap();
        assert_eq!(https.headers()["authorization"], "value-over-tls");
        // The same host and port, in clear: refused, the request untouched.
        let mut plain = request("http://api.example:443/", "corral-secret:TLS");
        let refused = s.substitute(&mut plain, "api.example", 443).unwrap_err();
        assert_eq!(refused.destination, "http://api.example:443");
        assert_eq!(plain.headers()["authorization"], "corral-secret:TLS");
        // A rule that says http:// allows it.
        let mut inside = request("http://inside.local:8080/", "corral-secret:PLAIN");
        s.substitute(&mut inside, "inside.local", 8080).unwrap();
        assert_eq!(inside.headers()["authorization"], "value-in-clear");
        assert_eq!(
            "http://inside.local:8080"
                .parse::<SecretHost>()
                .unwrap()
                .to_string(),
            "http://inside.local:8080"
        );
        assert_eq!(
            "https://api.example"
                .parse::<SecretHost>()
                .unwrap()
                .to_string(),
            "api.example"
        );
        assert!("ftp://x".parse::<SecretHost>().is_err());
    }
}
