//! What the egress tests send and grant.

use serde_json::{Value, json};

use corral_core::sandbox::{HttpGrant, SecretSource, SecretSpec};

pub fn grant(host: &str) -> HttpGrant {
    host.parse().unwrap()
}

pub fn request(method: &str, url: &str, headers: &[(&str, &str)], follow: bool) -> Value {
    json!({
        "method": method,
        "url": url,
        "headers": headers.iter().map(|(n, v)| json!([n, v])).collect::<Vec<_>>(),
        "body": null,
        "follow-redirects": follow,
    })
}

/// A secret in a file, sent only to `hosts`.
pub fn secret_file(
    dir: &tempfile::TempDir,
    name: &str,
    value: &str,
    hosts: &[String],
) -> SecretSpec {
    let path = dir.path().join(name);
    std::fs::write(&path, value).unwrap();
    SecretSpec {
        name: name.into(),
        source: SecretSource::File(path),
        hosts: hosts.iter().map(|h| h.parse().unwrap()).collect(),
        in_query: false,
    }
}
