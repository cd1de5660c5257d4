//! Attacks on signature verification from a registry a tenant controls:
//! the component is real and its manifest fine, but what the registry says
//! about its signatures is hostile — a signature manifest without end,
//! ten thousand signatures, a payload a gigabyte long, ten thousand
//! referrers, a manifest of terminal escapes, a byte a second. Each is
//! refused as unsigned within its bound, fetching no more than the bound,
//! and the host serves on.

mod common;

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use common::activities::text;
use common::admin::Host;
use common::example;
use common::http::{self, Head, loopback_server, recording_server, respond_huge};
use common::processes::Corral;

/// How late a deadline may be met on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(8);
const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const PAYLOAD_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";

fn respond(stream: &TcpStream, status: &str, content_type: &str, body: &[u8]) {
    http::respond(
        stream,
        status,
        &[("content-type", content_type.to_owned())],
        body,
    );
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A descriptor of `size` bytes at `digest`, with `extra` fields.
fn descriptor(media_type: &str, digest: &str, size: u64, extra: &str) -> String {
    format!(r#"{{"mediaType":"{media_type}","digest":"{digest}","size":{size}{extra}}}"#)
}

fn image_manifest(layers: &[String]) -> String {
    format!(
        r#"{{"schemaVersion":2,"mediaType":"{MANIFEST_TYPE}","config":{},"layers":[{}]}}"#,
        descriptor(
            "application/vnd.oci.image.config.v1+json",
            &sha256(b"{}"),
            2,
            ""
        ),
        layers.join(",")
    )
}

/// The registry: `acme/<case>:1` is the greeter, served whole; what it
/// says of the greeter's signatures depends on `<case>`. Every request's
/// target is recorded.
fn hostile_registry(
    seen: Arc<Mutex<Vec<String>>>,
    sign: impl Fn(&[u8]) -> String,
) -> (u16, String) {
    let component = std::fs::read(example("greeter")).expect("the greeter");
    // The same length, one byte apart: what a registry serves in place of
    // the layer its signed manifest names.
    let mut swapped = component.clone();
    if let Some(last) = swapped.last_mut() {
        *last ^= 1;
    }
    let manifest = image_manifest(&[descriptor(
        "application/wasm",
        &sha256(&component),
        component.len() as u64,
        "",
    )]);
    let digest = sha256(manifest.as_bytes());
    let payload = format!(
        r#"{{"critical":{{"identity":{{"docker-reference":"x"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"cosign container image signature"}},"optional":null}}"#
    );
    let signed = descriptor(
        PAYLOAD_TYPE,
        &sha256(payload.as_bytes()),
        payload.len() as u64,
        r#","annotations":{"dev.cosignproject.cosign/signature":"MEUCIQDforged"}"#,
    );
    // The same payload, signed by the tenant's own key.
    let truly_signed = descriptor(
        PAYLOAD_TYPE,
        &sha256(payload.as_bytes()),
        payload.len() as u64,
        &format!(
            r#","annotations":{{"dev.cosignproject.cosign/signature":"{}"}}"#,
            sign(payload.as_bytes())
        ),
    );
    let tag = format!("/manifests/{}.sig", digest.replace(':', "-"));
    let by_digest = format!("/manifests/{digest}");
    let component_layer = format!("/blobs/{}", sha256(&component));
    let payload_blob = format!("/blobs/{}", sha256(payload.as_bytes()));
    // Ten thousand signature manifests, each its own (an annotation apart),
    // named by a referrers index.
    let referred: HashMap<String, String> = (0..10_000)
        .map(|i| {
            let body = image_manifest(std::slice::from_ref(&signed)).replacen(
                '{',
                &format!(r#"{{"annotations":{{"n":"{i}"}},"#),
                1,
            );
            (sha256(body.as_bytes()), body)
        })
        .collect();
    let entries: Vec<String> = referred
        .keys()
        .map(|digest| {
            descriptor(
                MANIFEST_TYPE,
                digest,
                500,
                r#","artifactType":"application/vnd.dev.cosign.artifact.sig.v1+json""#,
            )
        })
        .collect();
    let index_of = |entries: &[String]| {
        format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{}]}}"#,
            entries.join(",")
        )
    };
    let index = index_of(&entries);
    // A thousand referrers named by no digest (terminal escapes, a
    // kilobyte each, or another artifact's type), then four real ones.
    let junk_digest = format!("sha256:\\u001b[2J\\u001b[31mFAKE{}", "x".repeat(1 << 10));
    let first = referred.keys().next().cloned().unwrap_or_default();
    let junk: Vec<String> = (0..1_000)
        .map(|i| match i % 2 {
            0 => descriptor(
                MANIFEST_TYPE,
                &junk_digest,
                500,
                r#","artifactType":"application/vnd.dev.cosign.artifact.sig.v1+json""#,
            ),
            _ => descriptor(MANIFEST_TYPE, &first, 500, r#","artifactType":"other""#),
        })
        .chain(entries.iter().take(4).cloned())
        .collect();
    let junk_index = index_of(&junk);
    let port = loopback_server(move |head: &Head, _: &mut BufReader<&TcpStream>, stream| {
        let target = head.target().to_owned();
        seen.lock().unwrap().push(target.clone());
        let case = target
            .strip_prefix("/v2/acme/")
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_default()
            .to_owned();
        if target == "/v2/" {
            respond(stream, "200 OK", "application/json", b"{}");
        } else if target.ends_with("/manifests/1") || target.ends_with(&by_digest) {
            respond(stream, "200 OK", MANIFEST_TYPE, manifest.as_bytes());
        } else if target.ends_with(&component_layer) && case == "swapped" {
            respond(stream, "200 OK", "application/octet-stream", &swapped);
        } else if target.ends_with(&component_layer) {
            respond(stream, "200 OK", "application/octet-stream", &component);
        } else if target.ends_with(&tag) && case == "swapped" {
            let manifest = image_manifest(std::slice::from_ref(&truly_signed));
            respond(stream, "200 OK", MANIFEST_TYPE, manifest.as_bytes());
        } else if target.ends_with(&payload_blob) {
            respond(stream, "200 OK", PAYLOAD_TYPE, payload.as_bytes());
        } else if target.ends_with(&tag) {
            signature_manifest(&case, stream, &signed);
        } else if target.starts_with("/v2/acme/referrers/referrers/") {
            respond(
                stream,
                "200 OK",
                "application/vnd.oci.image.index.v1+json",
                index.as_bytes(),
            );
        } else if target.starts_with("/v2/acme/junk-referrers/referrers/") {
            respond(
                stream,
                "200 OK",
                "application/vnd.oci.image.index.v1+json",
                junk_index.as_bytes(),
            );
        } else if let Some(body) = target
            .split("/manifests/")
            .nth(1)
            .and_then(|digest| referred.get(digest))
        {
            respond(stream, "200 OK", MANIFEST_TYPE, body.as_bytes());
        } else {
            let unknown = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}"#;
            respond(stream, "404 Not Found", "application/json", unknown);
        }
    });
    (port, digest)
}

/// What the registry answers for the greeter's signature tag in `case`.
fn signature_manifest(case: &str, stream: &TcpStream, signed: &str) {
    match case {
        "huge" => {
            // 64 MiB of manifest, announced and sent.
            respond_huge(stream, MANIFEST_TYPE, 64);
        }
        "many" => {
            let many = image_manifest(&vec![signed.to_owned(); 10_000]);
            respond(stream, "200 OK", MANIFEST_TYPE, many.as_bytes());
        }
        "gigabyte" => {
            let layer = descriptor(
                PAYLOAD_TYPE,
                &sha256(b"never sent"),
                1 << 30,
                r#","annotations":{"dev.cosignproject.cosign/signature":"MEUCIQDforged"}"#,
            );
            respond(
                stream,
                "200 OK",
                MANIFEST_TYPE,
                image_manifest(&[layer]).as_bytes(),
            );
        }
        "escapes" => {
            let page = "\u{1b}[2J\u{1b}[31mFAKE corral: signed by a trusted key\n".repeat(2_000);
            respond(stream, "200 OK", MANIFEST_TYPE, page.as_bytes());
        }
        "slow" => {
            let mut stream = stream;
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n");
            while stream.write_all(b" ").is_ok() {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        _ => {
            let unknown = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}"#;
            respond(stream, "404 Not Found", "application/json", unknown);
        }
    }
}

#[test]
fn a_registry_cannot_flood_or_stall_a_host_through_signatures() {
    let keys = tempfile::tempdir().unwrap();
    let base = keys.path().join("release").display().to_string();
    let greeter = keys.path().join("greeter.wasm");
    std::fs::copy(example("greeter"), &greeter).unwrap();
    for args in [
        vec!["key", "new", &base],
        vec![
            "sign",
            greeter.to_str().unwrap_or_default(),
            "--key",
            &format!("{base}.key"),
        ],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(&args)
            .env("CORRAL_KEY_PASSWORD", "pw")
            .output()
            .expect("corral runs");
        assert!(out.status.success(), "{}", text(&out));
    }
    let key = corral::trust::sign::SigningKey::read(Path::new(&format!("{base}.key")), b"pw")
        .expect("the key reads");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (port, digest) =
        hostile_registry(seen.clone(), |payload| key.sign(payload).expect("it signs"));
    let registry = format!("127.0.0.1:{port}");
    let host = Host::new(&format!(
        "insecure_registries = [{registry:?}]\nregistry_deadline = \"4s\"\nfollow_interval = \"1s\""
    ));
    // Alpha follows the artifact whose layer is swapped after signing.
    let swapped = format!("oci://{registry}/acme/swapped:1");
    let config = host.config([
        &format!(
            "registries = [{registry:?}]\ntrust = {{ keys = [\"{base}.pub\"] }}\nfollow = [{swapped:?}]"
        ),
        "",
    ]);
    let corral = Corral::serve(&Host::alpha_greeter(&config, &greeter));
    let deploy = |case: &str, says: &str| -> String {
        let reference = format!("oci://{registry}/acme/{case}:1");
        let started = Instant::now();
        let out = host.cli(&host.tokens[0].token, &["deploy", &reference]);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{case}: {said}");
        assert!(said.contains(says), "{case}: no `{says}` in {said}");
        assert!(said.len() < 2048, "{case}: {} bytes of error", said.len());
        assert!(
            started.elapsed() < Duration::from_secs(4) + SLACK,
            "{case} took {:?}",
            started.elapsed()
        );
        said
    };
    let requests = |case: &str, what: &str| {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|t| t.starts_with(&format!("/v2/acme/{case}/")) && t.contains(what))
            .count()
    };

    // The control: no signature at all.
    deploy("none", &format!("no signature for {digest}"));

    // Signed by the tenant's key, its layer swapped after signing: the
    // layer is checked against the signed manifest as it comes, at a
    // deploy and at each follow, and nothing is stored.
    let layer = sha256(&std::fs::read(example("greeter")).expect("the greeter"));
    deploy("swapped", &format!("Invalid digest. Expected {layer}"));
    corral.await_logged(&format!("following {swapped}"), 1);
    let status = host.alpha(&["status", "--json"]);
    let following = &status["tenants"][0]["following"][0];
    assert!(
        following["last_error"]
            .as_str()
            .is_some_and(|e| e.contains(&format!("Invalid digest. Expected {layer}"))),
        "{status}"
    );

    // 64 MiB of signature manifest: cut off near its bound, the host's
    // memory untouched.
    let before = corral.status_kib("VmRSS");
    deploy("huge", "the registry sent more than the pull allows");
    let grown = corral.status_kib("VmRSS").saturating_sub(before);
    assert!(grown < 32 << 10, "the host grew by {grown} KiB");

    // Ten thousand signatures: 16 read (each a real payload with a
    // forged signature), none trusted.
    deploy("many", "signed, but by no key the tenant trusts");
    let fetched = requests("many", "/blobs/sha256:");
    assert!(
        (1..=16 + 1).contains(&fetched),
        "{fetched} blobs fetched (16 signatures and the component at most)"
    );

    // A payload declared a gigabyte long is never asked for.
    deploy("gigabyte", "no signature for");
    assert_eq!(requests("gigabyte", &sha256(b"never sent")), 0);

    // Ten thousand referrers: four followed.
    deploy("referrers", "signed, but by no key the tenant trusts");
    let followed = requests("referrers", "/manifests/sha256:");
    assert!(followed <= 4, "{followed} referrers followed");

    // Referrers named by no digest, or not signatures: skipped, never
    // asked for nor quoted; the four real ones behind them are read.
    let said = deploy("junk-referrers", "signed, but by no key the tenant trusts");
    assert!(!said.contains("FAKE"), "{said}");
    assert_eq!(requests("junk-referrers", "FAKE"), 0);
    let followed = requests("junk-referrers", "/manifests/sha256:");
    assert!(
        (1..=4 + 1).contains(&followed),
        "{followed} manifests asked for by digest (4 referrers, the artifact)"
    );

    // Escapes where a manifest should be: escaped and cut in the answer.
    let said = deploy("escapes", "is not a cosign signature manifest");
    assert!(!said.contains('\u{1b}'), "{said}");
    assert!(!said.contains("\nFAKE"), "{said}");

    // A byte a second: the pull's deadline ends it.
    deploy("slow", "did not finish within 4s");

    // Nothing of it stored, nothing of it in the log unescaped, and the
    // host serves on.
    let listed = host.alpha(&["ls", "--json"]);
    assert_eq!(
        listed.as_array().map(Vec::len),
        Some(1),
        "only the configured greeter: {listed}"
    );
    let log = corral.stderr();
    assert!(!log.contains('\u{1b}'), "escapes in the host's log");
    assert!(
        log.lines().map(str::len).max().unwrap_or(0) < 4096,
        "a long log line"
    );
    let scrape = host.scrape();
    assert!(
        common::processes::sample(
            &scrape,
            "corral_signatures_refused_total{tenant=\"alpha\",reason=\"unreadable\"}"
        )
        .is_some_and(|n| n >= 3.0),
        "{scrape}"
    );
}

/// `corral push --sign` signs what it read back and checked, not what a
/// registry says it stored: a registry that takes the push and then names
/// another component at the tag gets nothing signed.
#[test]
fn push_sign_signs_nothing_a_registry_swapped_after_the_push() {
    let other = image_manifest(&[descriptor(
        "application/wasm",
        &sha256(b"another component"),
        17,
        "",
    )]);
    let (port, arrived) = recording_server(move |head: &Head| {
        let header = |name: &str, value: String| (name.to_owned(), value);
        let upload = header("location", "/v2/acme/x/blobs/uploads/u".to_owned());
        let stored = header(
            "docker-content-digest",
            format!("sha256:{}", "c".repeat(64)),
        );
        let manifest = header("content-type", MANIFEST_TYPE.to_owned());
        match head.method() {
            "POST" | "PATCH" => (202, vec![upload], String::new()),
            "PUT" => (201, vec![upload, stored], String::new()),
            "HEAD" if head.target().contains("/manifests/") => {
                (200, vec![manifest, stored], String::new())
            }
            "GET" if head.target().contains("/manifests/1") => (200, vec![manifest], other.clone()),
            "GET" if head.target() == "/v2/" => (200, Vec::new(), String::new()),
            _ => (404, Vec::new(), String::new()),
        }
    });
    let registry = format!("127.0.0.1:{port}");
    let keys = tempfile::tempdir().unwrap();
    let base = keys.path().join("release").display().to_string();
    let corral = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(args)
            .env("CORRAL_KEY_PASSWORD", "pw")
            .output()
            .expect("corral runs")
    };
    let out = corral(&["key", "new", &base]);
    assert!(out.status.success(), "{}", text(&out));
    let greeter = example("greeter").display().to_string();
    let reference = format!("oci://{registry}/acme/x:1");
    let key = format!("{base}.key");
    let out = corral(&[
        "push",
        &greeter,
        &reference,
        "--insecure-registry",
        &registry,
        "--sign",
        &key,
    ]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("not signing: ")
            && said.contains("no longer names the component just pushed"),
        "{said}"
    );
    let requests: Vec<String> = arrived
        .try_iter()
        .map(|(head, _)| format!("{} {}", head.method(), head.target()))
        .collect();
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("PUT /v2/acme/x/manifests/1")),
        "the push never happened: {requests:?}"
    );
    assert!(
        !requests.iter().any(|r| r.contains(".sig")),
        "a signature was pushed: {requests:?}"
    );
}
