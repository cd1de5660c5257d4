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

/// Decodes one payload to JSON, or says why it cannot be.
pub fn to_json(payload: &Payload) -> Result<Value, String> {
    let encoding = payload
        .metadata
        .get(ENCODING)
        .map(|e| String::from_utf8_lossy(e).into_owned())
        .unwrap_or_default();
    match encoding.as_str() {
        "json/plain" => serde_json::from_slice(&payload.data)
            .map_err(|e| format!("a json/plain payload is not JSON: {e}")),
        "binary/null" => Ok(Value::Null),
        "binary/plain" => Ok(Value::String(BASE64.encode(&payload.data))),
        "" => Err("a payload has no `encoding` metadata".to_owned()),
        other => Err(format!(
            "payload encoding `{other}` is not supported (use json/plain, binary/null or binary/plain)"
        )),
    }
}

/// Decodes every argument, naming the first that cannot be decoded.
pub fn args_to_json(payloads: &[Payload]) -> Result<Vec<Value>, String> {
    payloads
        .iter()
        .enumerate()
        .map(|(i, p)| to_json(p).map_err(|e| format!("argument {}: {e}", i + 1)))
        .collect()
}

/// Encodes a JSON value as a `json/plain` payload.
pub fn from_json(value: &Value) -> Payload {
    Payload {
        metadata: HashMap::from([(ENCODING.to_owned(), b"json/plain".to_vec())]),
        data: value.to_string().into_bytes(),
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
        assert_eq!(
            to_json(&payload("json/plain", br#"{"a":1}"#)),
            Ok(json!({"a": 1}))
        );
        assert_eq!(to_json(&payload("binary/null", b"")), Ok(Value::Null));
        assert_eq!(
            to_json(&payload("binary/plain", &[0, 1, 255])),
            Ok(json!("AAH/"))
        );
        let err = to_json(&payload("json/protobuf", b"")).unwrap_err();
        assert!(err.contains("`json/protobuf` is not supported"), "{err}");
        let err =
            args_to_json(&[payload("json/plain", b"1"), payload("json/plain", b"{")]).unwrap_err();
        assert!(
            err.starts_with("argument 2: a json/plain payload is not JSON"),
            "{err}"
        );
        assert_eq!(to_json(&from_json(&json!([1, "x"]))), Ok(json!([1, "x"])));
    }
}
