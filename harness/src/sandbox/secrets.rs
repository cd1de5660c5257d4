//! Secrets a guest never holds. An operator defines each from a host
//! environment variable or a file, with the hosts it may be sent to; the
//! guest sees only its placeholder (`corral-secret:NAME`, through
//! `wasi:config` and the environment), and corral puts the value in place
//! of the placeholder in an outbound request's headers (and, where the
//! secret allows it, its query) only when the request goes to one of the
//! secret's hosts. A placeholder bound anywhere else is refused.
//!
//! Whatever the guest hands back (log lines, output, heartbeats, failures)
//! has every value corral ever loaded replaced by `[secret NAME]`, so a
//! server that echoes a key cannot make the guest print it in clear.

use std::borrow::Cow;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use hyper::http::HeaderValue;
use serde_json::Value;

use super::http::HttpHost;
use crate::sync::{read, write};

/// What every placeholder starts with.
pub const PLACEHOLDER_PREFIX: &str = "corral-secret:";
/// Shorter values could not be told apart from ordinary text when
/// redacting.
pub const MIN_SECRET_LEN: usize = 8;
/// Old values still redacted after a reload (tasks started before it may
/// still hold them).
const KEPT_OLD_VALUES: usize = 4;

/// Where a secret's value comes from: never the configuration's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// A variable of corral's own environment (read once per reload).
    Env(String),
    /// A file, one value, a final newline ignored.
    File(PathBuf),
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::Env(name) => write!(f, "environment variable `{name}`"),
            SecretSource::File(path) => write!(f, "file `{}`", path.display()),
        }
    }
}

/// A secret as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretSpec {
    /// A name fit for an environment variable and a `wasi:config` key.
    pub name: String,
    pub source: SecretSource,
    /// Where its value may go.
    pub hosts: Vec<HttpHost>,
    /// Whether the value may be put in a URI's query (headers only when
    /// false).
    pub in_query: bool,
}

/// A secret that cannot be loaded. Never carries the value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret `{0}`: a name is letters, digits and `_`, not starting with a digit")]
    Name(String),
    #[error("secret `{0}` names no host it may be sent to")]
    NoHosts(String),
    #[error("secret `{name}`: {from} is not set")]
    Unset { name: String, from: SecretSource },
    #[error("secret `{name}`: {from} cannot be read: {source}")]
    Unreadable {
        name: String,
        from: SecretSource,
        source: std::io::Error,
    },
    #[error(
        "secret `{name}` from {from} is {len} bytes; corral needs at least {MIN_SECRET_LEN} to redact it reliably"
    )]
    TooShort {
        name: String,
        from: SecretSource,
        len: usize,
    },
    #[error(
        "secret `{name}` from {from} holds a character that cannot go in a header (a control character or a non-visible byte)"
    )]
    NotHeaderSafe { name: String, from: SecretSource },
}

struct Entry {
    spec: SecretSpec,
    placeholder: String,
    value: RwLock<Arc<str>>,
    old: RwLock<Vec<Arc<str>>>,
}

/// One tenant's secrets, loaded. Shared by every task of the tenant;
/// [`Secrets::reload`] replaces the values in place.
#[derive(Default)]
pub struct Secrets {
    /// Longest name first, so a placeholder that starts another's is never
    /// matched as the shorter one.
    entries: Vec<Entry>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| &e.spec.name))
            .finish()
    }
}

impl PartialEq for Secrets {
    fn eq(&self, other: &Self) -> bool {
        self.specs().eq(other.specs())
    }
}

impl Eq for Secrets {}

/// Why a request carrying a placeholder was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Misplaced {
    pub(crate) name: String,
    pub(crate) destination: String,
    pub(crate) in_uri: bool,
}

impl Secrets {
    /// Reads every secret's value, refusing the set on the first that
    /// cannot be read or used.
    pub fn load(specs: Vec<SecretSpec>) -> Result<Secrets, SecretError> {
        let mut entries = Vec::with_capacity(specs.len());
        for spec in specs {
            if !valid_name(&spec.name) {
                return Err(SecretError::Name(spec.name));
            }
            if spec.hosts.is_empty() {
                return Err(SecretError::NoHosts(spec.name));
            }
            let value = read_value(&spec)?;
            entries.push(Entry {
                placeholder: format!("{PLACEHOLDER_PREFIX}{}", spec.name),
                spec,
                value: RwLock::new(value),
                old: RwLock::new(Vec::new()),
            });
        }
        entries.sort_by_key(|e| std::cmp::Reverse(e.spec.name.len()));
        Ok(Secrets { entries })
    }

    /// Re-reads every value. One that cannot be read keeps its last good
    /// value and is returned as an error; the others take effect for the
    /// next request. Returns how many values changed.
    pub fn reload(&self) -> (usize, Vec<SecretError>) {
        let mut changed = 0;
        let mut errors = Vec::new();
        for entry in &self.entries {
            match read_value(&entry.spec) {
                Ok(fresh) => {
                    let mut value = write(&entry.value);
                    if *value != fresh {
                        let previous = std::mem::replace(&mut *value, fresh);
                        let mut old = write(&entry.old);
                        old.insert(0, previous);
                        old.truncate(KEPT_OLD_VALUES);
                        changed += 1;
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        (changed, errors)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn specs(&self) -> impl Iterator<Item = &SecretSpec> {
        self.entries.iter().map(|e| &e.spec)
    }

    /// Each secret's name and the placeholder the guest sees for it.
    pub fn placeholders(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries
            .iter()
            .map(|e| (e.spec.name.as_str(), e.placeholder.as_str()))
    }

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
        if self.entries.is_empty() {
            return Ok(());
        }
        let destination = format!("{host}:{port}");
        let allowed = |entry: &Entry, in_uri: bool| {
            let ok = entry.spec.hosts.iter().any(|h| h.allows(host, port))
                && (!in_uri || entry.spec.in_query);
            if ok {
                Ok(())
            } else {
                Err(Misplaced {
                    name: entry.spec.name.clone(),
                    destination: destination.clone(),
                    in_uri,
                })
            }
        };
        // Checked in full before anything is changed.
        let uri = request.uri().to_string();
        let mut uri_secrets = Vec::new();
        for entry in self.present(&uri) {
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
                text = text.replace(&entry.placeholder, &read(&entry.value));
            }
            // The value was checked header-safe when it was read.
            if let Ok(mut substituted) = HeaderValue::from_str(&text) {
                substituted.set_sensitive(true);
                *value = substituted;
            }
        }
        if !uri_secrets.is_empty() {
            let mut text = uri;
            for entry in uri_secrets {
                text = text.replace(&entry.placeholder, &read(&entry.value));
            }
            if let Ok(uri) = text.parse() {
                *request.uri_mut() = uri;
            }
        }
        Ok(())
    }

    /// The secrets whose placeholder `text` holds.
    fn present<'a>(&'a self, text: &str) -> Vec<&'a Entry> {
        if !text.contains(PLACEHOLDER_PREFIX) {
            return Vec::new();
        }
        let mut rest = text.to_owned();
        let mut found = Vec::new();
        for entry in &self.entries {
            if rest.contains(&entry.placeholder) {
                // Removed so a shorter name that starts this one is not
                // found inside it.
                rest = rest.replace(&entry.placeholder, "");
                found.push(entry);
            }
        }
        found
    }

    /// `text` with every value this tenant's secrets have had replaced by
    /// `[secret NAME]`.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut text = Cow::Borrowed(text);
        for entry in &self.entries {
            let current = read(&entry.value).clone();
            let old = read(&entry.old).clone();
            for value in std::iter::once(&current).chain(old.iter()) {
                if text.contains(&**value) {
                    text = Cow::Owned(
                        text.replace(&**value, &format!("[secret {}]", entry.spec.name)),
                    );
                }
            }
        }
        text
    }

    /// Redacts every string (and key) inside a JSON value.
    pub fn redact_json(&self, value: &mut Value) {
        if self.entries.is_empty() {
            return;
        }
        match value {
            Value::String(s) => {
                if let Cow::Owned(clean) = self.redact(s) {
                    *s = clean;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_json(v)),
            Value::Object(map) => {
                let entries = std::mem::take(map);
                for (key, mut v) in entries {
                    self.redact_json(&mut v);
                    map.insert(self.redact(&key).into_owned(), v);
                }
            }
            _ => {}
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn valid_name(name: &str) -> bool {
    name.bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn read_value(spec: &SecretSpec) -> Result<Arc<str>, SecretError> {
    let name = || spec.name.clone();
    let value = match &spec.source {
        SecretSource::Env(var) => std::env::var(var).map_err(|_| SecretError::Unset {
            name: name(),
            from: spec.source.clone(),
        })?,
        SecretSource::File(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| SecretError::Unreadable {
                name: name(),
                from: spec.source.clone(),
                source,
            })?;
            let trimmed = text.strip_suffix('\n').unwrap_or(&text);
            trimmed.strip_suffix('\r').unwrap_or(trimmed).to_owned()
        }
    };
    if value.len() < MIN_SECRET_LEN {
        return Err(SecretError::TooShort {
            name: name(),
            from: spec.source.clone(),
            len: value.len(),
        });
    }
    if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(SecretError::NotHeaderSafe {
            name: name(),
            from: spec.source.clone(),
        });
    }
    Ok(value.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(dir: &tempfile::TempDir, defs: &[(&str, &str, &[&str], bool)]) -> Secrets {
        let specs = defs
            .iter()
            .map(|(name, value, hosts, in_query)| {
                let path = dir.path().join(name);
                std::fs::write(&path, format!("{value}\n")).unwrap();
                SecretSpec {
                    name: (*name).into(),
                    source: SecretSource::File(path),
                    hosts: hosts.iter().map(|h| h.parse().unwrap()).collect(),
                    in_query: *in_query,
                }
            })
            .collect();
        Secrets::load(specs).unwrap()
    }

    fn request(uri: &str, auth: &str) -> hyper::http::Request<()> {
        hyper::http::Request::builder()
            .uri(uri)
            .header("authorization", auth)
            .body(())
            .unwrap()
    }

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
    fn values_are_redacted_including_old_ones_after_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let s = secrets(&dir, &[("KEY", "first-value", &["a.example"], false)]);
        assert_eq!(s.redact("echo: first-value!"), "echo: [secret KEY]!");
        std::fs::write(dir.path().join("KEY"), "second-value").unwrap();
        assert_eq!(s.reload().0, 1);
        let mut r = request("http://a.example/", "corral-secret:KEY");
        s.substitute(&mut r, "a.example", 80).unwrap();
        assert_eq!(r.headers()["authorization"], "second-value");
        assert_eq!(
            s.redact("first-value second-value"),
            "[secret KEY] [secret KEY]"
        );
        let mut json = serde_json::json!({"k": ["second-value"], "second-value": 1});
        s.redact_json(&mut json);
        assert_eq!(
            json,
            serde_json::json!({"k": ["[secret KEY]"], "[secret KEY]": 1})
        );

        // A value that goes bad keeps the last good one.
        std::fs::write(dir.path().join("KEY"), "short").unwrap();
        let (changed, errors) = s.reload();
        assert_eq!(changed, 0);
        assert!(matches!(errors[..], [SecretError::TooShort { len: 5, .. }]));
        assert!(!errors[0].to_string().contains("short\""));
    }

    #[test]
    fn a_secret_comes_from_corral_s_own_environment() {
        // Cargo sets this for every test process; corral reads, not sets.
        let value = std::env::var("CARGO_PKG_NAME").unwrap();
        let s = Secrets::load(vec![SecretSpec {
            name: "PKG".into(),
            source: SecretSource::Env("CARGO_PKG_NAME".into()),
            hosts: vec!["a.example".parse().unwrap()],
            in_query: false,
        }])
        .unwrap();
        let mut r = request("http://a.example/", "corral-secret:PKG");
        s.substitute(&mut r, "a.example", 80).unwrap();
        assert_eq!(r.headers()["authorization"], value.as_str());
    }

    #[test]
    fn bad_secrets_are_named_without_their_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v");
        let spec = |name: &str, value: &str, hosts: &[&str]| {
            std::fs::write(&path, value).unwrap();
            SecretSpec {
                name: name.into(),
                source: SecretSource::File(path.clone()),
                hosts: hosts.iter().map(|h| h.parse().unwrap()).collect(),
                in_query: false,
            }
        };
        let err = |s| Secrets::load(vec![s]).unwrap_err().to_string();
        assert!(err(spec("1x", "longenough", &["a"])).contains("`1x`"));
        assert!(err(spec("K", "longenough", &[])).contains("names no host"));
        assert!(err(spec("K", "tiny", &["a"])).contains("4 bytes"));
        let e = err(spec("K", "line\r\ninjected", &["a"]));
        assert!(
            e.contains("cannot go in a header") && !e.contains("injected"),
            "{e}"
        );
        let unset = Secrets::load(vec![SecretSpec {
            name: "K".into(),
            source: SecretSource::Env("CORRAL_TEST_UNSET_VARIABLE".into()),
            hosts: vec!["a".parse().unwrap()],
            in_query: false,
        }])
        .unwrap_err();
        assert!(
            unset
                .to_string()
                .contains("CORRAL_TEST_UNSET_VARIABLE` is not set")
        );
    }
}
