//! The admin API's messages, as a client (any client) sends them: decoded,
//! then through every check the host makes of what they carry. Nothing may
//! panic; every refusal is an error value.
#![no_main]

use std::collections::BTreeMap;

use corral::control::proto;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fn sorted(map: std::collections::HashMap<String, String>) -> BTreeMap<String, String> {
    map.into_iter().collect()
}

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = proto::UploadRequest::decode(data)
        && let Some(proto::upload_request::Part::Header(header)) = request.part
    {
        let _ = corral::control::metadata::check(
            &sorted(header.labels),
            &sorted(header.aliases),
            &sorted(header.config),
        );
        let _ = header.oci_reference.parse::<corral::oci::OciRef>();
    }
    if let Ok(run) = proto::RunRequest::decode(data) {
        for arg in &run.args_json {
            let _ = serde_json::from_str::<serde_json::Value>(arg);
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = corral::token::TokenHash::of_bearer(text);
        let _ = text.parse::<corral::oci::RepositoryPrefix>();
        let _ = text.parse::<corral::oci::OciRef>();
    }
});
