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
//! server that echoes a key cannot make the guest print it in clear. Each
//! value is found however an encoder spelled each of its characters: as
//! itself, percent-encoded (either hex case; a space also as `+`) or
//! JSON-escaped (`\u0026`, `\/`, `\"`), in any mix, which covers what
//! `encodeURIComponent`, Python's `quote`, Go's `PathEscape` and JSON
//! encoders write. Base64, a double encoding, or an encoding of a text
//! around it are not found. Output cut into pieces (long lines, the stderr
//! tail a failure quotes, a recorded response that ended early) is
//! redacted before it is cut, so a value spanning a cut is caught too, and
//! what a value cut in two left at a piece's end is dropped
//! ([`Secrets::redact_cut`]).
//!
//! A secret's host written without a scheme is reached over HTTPS only: the
//! value never leaves in clear text unless the rule says `http://`. A value
//! goes in a URI only in its query (with `in_query`), percent-encoded, so it
//! can never change where the request goes.

pub(crate) mod spelling;

use std::borrow::Cow;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use serde_json::Value;

use super::destination::{GrantError, HttpHost};
use crate::sync::{read, write};
use spelling::{LONGEST_SPELLING, replace_spelled};

/// What every placeholder starts with.
pub const PLACEHOLDER_PREFIX: &str = "corral-secret:";
/// Shorter values could not be told apart from ordinary text when
/// redacting.
pub const MIN_SECRET_LEN: usize = 8;
/// Which ends of a piece of text were cut from a longer one (see
/// [`Secrets::redact_cut`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cut {
    pub(crate) start: bool,
    pub(crate) end: bool,
}

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

/// Where a secret's value may go: a host (as an `http_hosts` grant names
/// one) over HTTPS, or also over plain HTTP when written `http://host`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretHost {
    host: HttpHost,
    plain_http: bool,
}

impl FromStr for SecretHost {
    type Err = GrantError;

    fn from_str(text: &str) -> Result<Self, GrantError> {
        let (plain_http, rest) = match (text.strip_prefix("http://"), text.strip_prefix("https://"))
        {
            (Some(rest), _) => (true, rest),
            (_, Some(rest)) => (false, rest),
            _ => (false, text),
        };
        let host = rest.parse().map_err(|e| match e {
            GrantError::NotAHost(_) => GrantError::NotAHost(text.to_owned()),
            other => other,
        })?;
        Ok(SecretHost { host, plain_http })
    }
}

impl fmt::Display for SecretHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.plain_http {
            f.write_str("http://")?;
        }
        write!(f, "{}", self.host)
    }
}

impl SecretHost {
    /// Whether the value may go to `host`:`port` over `https` (or not).
    pub(crate) fn allows(&self, host: &str, port: u16, https: bool) -> bool {
        (https || self.plain_http) && self.host.allows(host, port)
    }
}

/// A secret as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretSpec {
    /// A name fit for an environment variable and a `wasi:config` key.
    pub name: String,
    pub source: SecretSource,
    /// Where its value may go.
    pub hosts: Vec<SecretHost>,
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

pub(crate) struct Entry {
    spec: SecretSpec,
    placeholder: String,
    values: RwLock<Arc<Values>>,
}

/// A secret's value, and the values it had before a reload.
struct Values {
    current: Arc<str>,
    old: Vec<Arc<str>>,
}

impl Values {
    fn new(current: Arc<str>, old: Vec<Arc<str>>) -> Values {
        Values { current, old }
    }

    fn all(&self) -> impl Iterator<Item = &Arc<str>> {
        std::iter::once(&self.current).chain(&self.old)
    }
}

/// One tenant's secrets, loaded. Shared by every task of the tenant;
/// [`Secrets::reload`] replaces the values in place.
#[derive(Default)]
pub struct Secrets {
    /// Longest name first, so a placeholder that starts another's is never
    /// matched as the shorter one.
    entries: Vec<Entry>,
    /// One less than the longest spelling of any value: what a cut must
    /// hold back so that a value spanning it is still found.
    hold: AtomicUsize,
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
                values: RwLock::new(Arc::new(Values::new(value, Vec::new()))),
            });
        }
        entries.sort_by_key(|e| std::cmp::Reverse(e.spec.name.len()));
        let secrets = Secrets {
            entries,
            hold: AtomicUsize::new(0),
        };
        secrets.measure();
        Ok(secrets)
    }

    /// Records the longest spelling of any value (after a load or reload).
    fn measure(&self) {
        let longest = self
            .entries
            .iter()
            .flat_map(|e| {
                let values = read(&e.values).clone();
                values.all().map(|v| v.len()).max()
            })
            .max()
            .unwrap_or(0)
            .saturating_mul(LONGEST_SPELLING);
        self.hold
            .store(longest.saturating_sub(1), Ordering::Relaxed);
    }

    /// How many bytes at the end of a piece of output may be the start of a
    /// value: a cut there must keep them for the next piece.
    pub(crate) fn hold(&self) -> usize {
        self.hold.load(Ordering::Relaxed)
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
                    let mut values = write(&entry.values);
                    if values.current != fresh {
                        let mut old = values.old.clone();
                        old.insert(0, values.current.clone());
                        old.truncate(KEPT_OLD_VALUES);
                        *values = Arc::new(Values::new(fresh, old));
                        changed += 1;
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        self.measure();
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

    /// The secrets whose placeholder `text` holds.
    pub(crate) fn present<'a>(&'a self, text: &str) -> Vec<&'a Entry> {
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

    /// `text` with every value this tenant's secrets have had, in every
    /// spelling redaction knows, replaced by `[secret NAME]`.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut text = Cow::Borrowed(text);
        for entry in &self.entries {
            let values = read(&entry.values).clone();
            for value in values.all() {
                if let Some(redacted) =
                    replace_spelled(text.as_bytes(), value.as_bytes(), &entry.marker())
                {
                    // Whole characters were replaced by ASCII: still UTF-8.
                    text = Cow::Owned(String::from_utf8_lossy(&redacted).into_owned());
                }
            }
        }
        text
    }

    /// [`Secrets::redact`] on bytes that may not be text (yet): a piece of
    /// a guest's output stream.
    pub(crate) fn redact_bytes(&self, bytes: &mut Vec<u8>) {
        for entry in &self.entries {
            let values = read(&entry.values).clone();
            for value in values.all() {
                if let Some(redacted) = replace_spelled(bytes, value.as_bytes(), &entry.marker()) {
                    *bytes = redacted;
                }
            }
        }
    }

    /// [`Secrets::redact_bytes`] on a piece cut out of a longer text: its
    /// whole values are redacted first, then [`Secrets::hold`] bytes are
    /// dropped at each end where the text went on (`Cut`), where a value
    /// that spanned the cut left a piece no redaction can recognise. In
    /// this order, and never the other: dropping first would leave the
    /// rest of a value that began inside the dropped bytes.
    pub(crate) fn redact_cut(&self, bytes: &mut Vec<u8>, cut: Cut) {
        self.redact_bytes(bytes);
        let hold = self.hold();
        if cut.end {
            bytes.truncate(bytes.len().saturating_sub(hold));
        }
        if cut.start {
            bytes.drain(..hold.min(bytes.len()));
        }
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

impl Entry {
    fn marker(&self) -> String {
        format!("[secret {}]", self.spec.name)
    }

    pub(crate) fn spec(&self) -> &SecretSpec {
        &self.spec
    }

    /// The text the guest holds in place of the value.
    pub(crate) fn placeholder(&self) -> &str {
        &self.placeholder
    }

    /// The value now (a reload may change it for the next request).
    pub(crate) fn current(&self) -> Arc<str> {
        read(&self.values).current.clone()
    }
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
pub(crate) mod tests {
    use super::*;

    /// Secrets read from files written for the test: (name, value, hosts, in_query).
    pub(crate) fn secrets(
        dir: &tempfile::TempDir,
        defs: &[(&str, &str, &[&str], bool)],
    ) -> Secrets {
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

    /// A request to `uri` with an `authorization` header.
    pub(crate) fn request(uri: &str, auth: &str) -> hyper::http::Request<()> {
        hyper::http::Request::builder()
            .uri(uri)
            .header("authorization", auth)
            .body(())
            .unwrap()
    }

    #[test]
    fn values_are_redacted_including_old_ones_after_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let s = secrets(&dir, &[("KEY", "first-value", &["a.example"], false)]);
        assert_eq!(s.redact("echo: first-value!"), "echo: [secret KEY]!");
        std::fs::write(dir.path().join("KEY"), "second-value").unwrap();
        assert_eq!(s.reload().0, 1);
        let mut r = request("https://a.example/", "corral-secret:KEY");
        s.substitute(&mut r, "a.example", 443).unwrap();
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
        let mut r = request("https://a.example/", "corral-secret:PKG");
        s.substitute(&mut r, "a.example", 443).unwrap();
        assert_eq!(r.headers()["authorization"], value.as_str());
    }

    #[test]
    fn a_value_is_redacted_percent_encoded_and_json_escaped_too() {
        let dir = tempfile::tempdir().unwrap();
        let s = secrets(&dir, &[("K", "sk/live key\\x", &["a.example"], false)]);
        for spelled in [
            "sk/live key\\x",
            "sk%2Flive%20key%5Cx",
            "sk%2flive%20key%5cx",
            "sk%2Flive+key%5Cx",
            "sk/live key\\\\x",
            "sk\\/live key\\\\x",
        ] {
            let text = format!("before {spelled} after");
            assert_eq!(s.redact(&text), "before [secret K] after", "{spelled}");
        }
        // Bytes too, also where the text is not (yet) UTF-8.
        let mut bytes = b"\xff sk%2Flive%20key%5Cx \xfe".to_vec();
        bytes[0] = 0xff;
        s.redact_bytes(&mut bytes);
        assert!(!String::from_utf8_lossy(&bytes).contains("sk%2F"));
        assert!(String::from_utf8_lossy(&bytes).contains("[secret K]"));
        // What a cut must hold back: the longest spelling, less one byte.
        assert_eq!(s.hold(), 6 * "sk/live key\\x".len() - 1);
    }

    #[test]
    fn a_value_is_redacted_however_an_encoder_spelled_each_character() {
        let dir = tempfile::tempdir().unwrap();
        let s = secrets(&dir, &[("K", "sk!live&key/1 2", &["a.example"], false)]);
        for spelled in [
            // encodeURIComponent leaves `!` as it is.
            "sk!live%26key%2F1%202",
            // Go's encoding/json escapes `&`; `\/` as some encoders write.
            "sk!live\\u0026key\\/1 2",
            // Python's quote leaves `/`; lower-case hex; `+` for a space.
            "sk%21live%26key/1+2",
            "sk%21live%26key%2f1%202",
        ] {
            let text = format!("<{spelled}>");
            assert_eq!(s.redact(&text), "<[secret K]>", "{spelled}");
        }
        // A text that only resembles it is left alone.
        assert_eq!(s.redact("sk!live&key/1 3"), "sk!live&key/1 3");
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
