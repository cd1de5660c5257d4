//! Shadow replay's material: real attempts recorded as they ran (their
//! arguments, how they ended, and the outbound HTTP they made), so that a
//! candidate version can run the same attempts later with every HTTP
//! answer taken from the recording, never the network, and be compared.
//!
//! What is recorded never holds a secret: a request is recorded as the
//! guest made it, with its secrets' placeholders, before corral puts the
//! values in, and only its method, URI and the digest of its body; a
//! response's headers and body have every value of the tenant's secrets
//! redacted; an attempt whose arguments hold one is not recorded at all.
//! The recorder is the tenant's [`Sampler`] (corral's store keeps the
//! sample, bounded and expiring); the [`Tape`] of one task records or
//! plays back its HTTP.

pub(crate) mod tape;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub use tape::Tape;

use super::failure::{FailureClass, Outcome};

/// At most this many bytes of one attempt (its arguments and HTTP) are
/// recorded; a bigger attempt is not.
pub const MAX_ATTEMPT_BYTES: usize = 256 * 1024;

/// One outbound HTTP exchange of a recorded attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exchange {
    pub method: String,
    /// As the guest wrote it: placeholders, not secrets.
    pub uri: String,
    /// The SHA-256 of the request's body as the guest sent it (hex).
    pub request_sha256: String,
    /// The SHA-256 of the request's headers as the guest set them
    /// (placeholders, not secrets; `traceparent` left out).
    #[serde(default)]
    pub request_headers_sha256: String,
    /// `None` when the request failed before a response came.
    pub status: Option<u16>,
    /// The response's headers, secrets redacted.
    pub headers: Vec<(String, String)>,
    /// The response's body as far as the guest read it, secrets redacted.
    #[serde(with = "base64_bytes")]
    pub body: Vec<u8>,
}

impl Exchange {
    /// What it takes to store: its body is stored in base64.
    fn size(&self) -> usize {
        self.method.len()
            + self.uri.len()
            + 2 * 64
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
            + self.body.len().div_ceil(3) * 4
    }
}

/// How an attempt ended, as replay compares it: the class of its failure
/// (`None` for a result) and a digest of its result or failure message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ending {
    pub class: Option<FailureClass>,
    pub digest: String,
}

impl Ending {
    /// The comparable ending of `outcome`: a result's JSON (its objects'
    /// keys in order: a record whose fields moved is the same result), or
    /// an application failure's message (the guest's own error), digested;
    /// a failure of any other class compares by its class only.
    pub fn of(outcome: &Outcome) -> Ending {
        match outcome {
            Ok(value) => Ending {
                class: None,
                digest: sha256_hex(&serde_json::to_vec(&canonical(value)).unwrap_or_default()),
            },
            Err(f) if f.class == FailureClass::Application => Ending {
                class: Some(f.class),
                digest: sha256_hex(format!("{}\n{}", f.kind, f.message).as_bytes()),
            },
            Err(f) => Ending {
                class: Some(f.class),
                digest: String::new(),
            },
        }
    }

    /// `Completed` or the failure's class.
    pub fn name(&self) -> &'static str {
        self.class.map_or("Completed", FailureClass::as_str)
    }
}

/// `value` with every object's keys sorted.
fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), canonical(&map[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// One recorded attempt of an activity type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub activity_type: String,
    /// The digest of the version that ran it.
    pub version: String,
    /// One JSON value per parameter.
    pub args: Vec<Value>,
    pub ending: Ending,
    pub exchanges: Vec<Exchange>,
    /// The fuel the guest used: its cost, the same on every machine.
    pub fuel: u64,
    /// When it ran (milliseconds since the Unix epoch).
    pub at_ms: i64,
}

impl Attempt {
    /// What it takes to store, about: its arguments' JSON and its HTTP.
    pub fn size(&self) -> usize {
        let args: usize = self
            .args
            .iter()
            .map(|a| serde_json::to_vec(a).map_or(0, |v| v.len()))
            .sum();
        args + self.exchanges.iter().map(Exchange::size).sum::<usize>() + 128
    }
}

/// Where a tenant's recorded attempts go: corral's store of samples.
pub trait Sampler: Send + Sync + 'static {
    /// Whether attempts of `activity_type` are recorded.
    fn records(&self, activity_type: &str) -> bool;
    /// A finished attempt, to keep or not.
    fn offer(&self, attempt: Attempt);
}

/// A tenant's sampler, as its prepared policy carries it.
#[derive(Clone)]
pub struct SamplerRef(pub std::sync::Arc<dyn Sampler>);

impl std::fmt::Debug for SamplerRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sampler")
    }
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{Failure, RetryPolicy};

    #[test]
    fn endings_compare_results_and_application_errors_by_digest_other_failures_by_class() {
        let ok = |v: Value| Ending::of(&Ok(v));
        assert_eq!(ok(serde_json::json!("v1")), ok(serde_json::json!("v1")));
        assert_ne!(ok(serde_json::json!("v1")), ok(serde_json::json!("v3")));
        // Fields in another order are the same result; other values not.
        let moved: Value = serde_json::from_str(r#"[{"b": 1, "a": {"d": 2, "c": 3}}]"#).unwrap();
        let same: Value = serde_json::from_str(r#"[{"a": {"c": 3, "d": 2}, "b": 1}]"#).unwrap();
        assert_eq!(ok(moved.clone()), ok(same));
        assert_ne!(
            ok(moved),
            ok(serde_json::json!([{"a": {"c": 3, "d": 2}, "b": 2}]))
        );
        let failed = |class, message: &str| {
            Ending::of(&Err(Failure::new(class, &RetryPolicy::default(), message)))
        };
        assert_ne!(
            failed(FailureClass::Application, "a"),
            failed(FailureClass::Application, "b")
        );
        // A trap's message names addresses and frames that change with
        // every build: the class is what compares.
        assert_eq!(
            failed(FailureClass::Trap, "at 0x1"),
            failed(FailureClass::Trap, "at 0x2")
        );
        assert_eq!(failed(FailureClass::Trap, "x").name(), "Trap");
        assert_eq!(ok(serde_json::json!(1)).name(), "Completed");
    }
}
