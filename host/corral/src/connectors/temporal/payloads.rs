//! Temporal payloads ⇄ JSON: one payload per WIT parameter. `json/plain` is
//! JSON; `binary/null` is `null` (an absent option); `binary/plain` is bytes,
//! handed on as base64 (the JSON form of `list<u8>`). Results are
//! `json/plain`.

use std::collections::HashMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::Value;
use temporalio_common::protos::temporal::api::common::v1::Payload;

const ENCODING: &str = "encoding";

/// Why a payload is not JSON corral can hand a guest.
#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    #[error("a json/plain payload is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("a payload has no `encoding` metadata")]
    NoEncoding,
    #[error(
        "payload encoding `{0}` is not supported (use json/plain, binary/null or binary/plain)"
    )]
    Unsupported(String),
    /// Which argument (counted from 1) could not be decoded.
    #[error("argument {index}: {source}")]
    Argument {
        index: usize,
        #[source]
        source: Box<PayloadError>,
    },
}

/// Decodes one payload to JSON, or says why it cannot be.
pub fn to_json(payload: &Payload) -> Result<Value, PayloadError> {
    let encoding = payload
        .metadata
        .get(ENCODING)
        .map(|e| String::from_utf8_lossy(e).into_owned())
        .unwrap_or_default();
    match encoding.as_str() {
        "json/plain" => serde_json::from_slice(&payload.data).map_err(PayloadError::NotJson),
        "binary/null" => Ok(Value::Null),
        "binary/plain" => Ok(Value::String(BASE64.encode(&payload.data))),
        "" => Err(PayloadError::NoEncoding),
        other => Err(PayloadError::Unsupported(other.to_owned())),
    }
}

/// Decodes every argument, naming the first that cannot be decoded.
pub fn args_to_json(payloads: &[Payload]) -> Result<Vec<Value>, PayloadError> {
    payloads
        .iter()
        .enumerate()
        .map(|(i, p)| {
            to_json(p).map_err(|e| PayloadError::Argument {
                index: i + 1,
                source: Box::new(e),
            })
        })
        .collect()
}

/// Encodes a JSON value as a `json/plain` payload.
pub fn from_json(value: &Value) -> Payload {
    from_json_text(&value.to_string())
}

/// A `json/plain` payload of JSON text.
pub fn from_json_text(json: &str) -> Payload {
    Payload {
        metadata: HashMap::from([(ENCODING.to_owned(), b"json/plain".to_vec())]),
        data: json.as_bytes().to_vec(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn payload(encoding: &str, data: &[u8]) -> Payload {
        Payload {
            metadata: HashMap::from([(ENCODING.to_owned(), encoding.as_bytes().to_vec())]),
            data: data.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn the_three_encodings_decode_and_others_are_named() {
        let decoded = |encoding: &str, data: &[u8]| to_json(&payload(encoding, data)).ok();
        assert_eq!(decoded("json/plain", br#"{"a":1}"#), Some(json!({"a": 1})));
        assert_eq!(decoded("binary/null", b""), Some(Value::Null));
        assert_eq!(decoded("binary/plain", &[0, 1, 255]), Some(json!("AAH/")));
        let err = to_json(&payload("json/protobuf", b"")).unwrap_err();
        assert!(
            matches!(&err, PayloadError::Unsupported(e) if e == "json/protobuf"),
            "{err}"
        );
        assert!(
            err.to_string().contains("`json/protobuf` is not supported"),
            "{err}"
        );
        let err =
            args_to_json(&[payload("json/plain", b"1"), payload("json/plain", b"{")]).unwrap_err();
        assert!(
            matches!(&err, PayloadError::Argument { index: 2, source } if matches!(**source, PayloadError::NotJson(_))),
            "{err}"
        );
        assert!(
            err.to_string()
                .starts_with("argument 2: a json/plain payload is not JSON"),
            "{err}"
        );
        assert_eq!(
            to_json(&from_json(&json!([1, "x"]))).ok(),
            Some(json!([1, "x"]))
        );
    }
}
