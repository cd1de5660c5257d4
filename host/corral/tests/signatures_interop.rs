//! corral's signatures are cosign's: made and checked by tools that are
//! not corral (OpenSSL, another OCI client), both ways.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::activities::text;
use common::example;
use common::registry::{Registry, block_on};
use common::signing::{new_key, ok, sign};

/// `openssl <args>`, expecting success.
fn openssl(args: &[&str]) -> std::process::Output {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl runs");
    assert!(out.status.success(), "openssl {args:?}: {}", text(&out));
    out
}

/// `file` signed by OpenSSL with `key` (ECDSA over SHA-256, DER written
/// to `der`): the signature in base64, as cosign writes it.
fn openssl_sign(key: &str, file: &str, der: &str) -> String {
    use base64::Engine as _;
    openssl(&["dgst", "-sha256", "-sign", key, "-out", der, file]);
    base64::engine::general_purpose::STANDARD.encode(std::fs::read(der).expect("the signature"))
}

/// An EC key pair on `curve` made by OpenSSL: `dir/name.key` (PKCS#8,
/// unencrypted) and `dir/name.pub`.
fn openssl_key(dir: &std::path::Path, name: &str, curve: &str) {
    let at = |file: String| dir.join(file).display().to_string();
    let curve = format!("ec_paramgen_curve:{curve}");
    let key = at(format!("{name}.key"));
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        &curve,
        "-out",
        &key,
    ]);
    openssl(&[
        "pkey",
        "-in",
        &key,
        "-pubout",
        "-out",
        &at(format!("{name}.pub")),
    ]);
}

/// The signatures are the standard ones cosign makes: ECDSA P-256 over
/// SHA-256, ASN.1 DER, base64. OpenSSL verifies what `corral sign` made,
/// and a host trusts what OpenSSL signed with a key OpenSSL made (an
/// unencrypted PKCS#8 key `corral sign` takes too).
#[test]
fn openssl_and_corral_verify_each_others_signatures() {
    use base64::Engine as _;
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name).display().to_string();
    let file = at("greeter.wasm");
    std::fs::copy(example("greeter"), &file).unwrap();

    // corral signs; OpenSSL verifies with the public key corral made.
    let release = new_key(dir.path(), "release", "pw");
    sign(&file, &release, &[]);
    let signature = std::fs::read_to_string(format!("{file}.sig")).unwrap();
    let der = base64::engine::general_purpose::STANDARD
        .decode(signature.trim())
        .expect("base64");
    std::fs::write(at("sig.der"), der).unwrap();
    let public = release.public.display().to_string();
    let out = openssl(&[
        "dgst",
        "-sha256",
        "-verify",
        &public,
        "-signature",
        &at("sig.der"),
        &file,
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("Verified OK"));

    // OpenSSL makes a key and signs; corral's trust verifies it, and
    // names the same fingerprint `corral sign` prints for that key.
    openssl_key(dir.path(), "ossl", "P-256");
    let signature = openssl_sign(&at("ossl.key"), &file, &at("ossl.der"));
    let policy = corral::trust::TrustPolicy::new(&[PathBuf::from(at("ossl.pub"))], true)
        .expect("OpenSSL's P-256 public key");
    let bytes = std::fs::read(&file).unwrap();
    let signer = policy
        .verify_blob(&bytes, signature.as_bytes())
        .expect("OpenSSL's signature verifies");
    let said = ok(
        &[
            "sign",
            &file,
            "--key",
            &at("ossl.key"),
            "--output-signature",
            &at("c.sig"),
        ],
        "",
    );
    assert!(said.contains(&signer), "{said} (expected {signer})");
    let corrals = std::fs::read(at("c.sig")).unwrap();
    assert_eq!(policy.verify_blob(&bytes, &corrals).ok(), Some(signer));
    // A key of another curve is refused, by name.
    openssl_key(dir.path(), "p384", "P-384");
    let refused = corral::trust::TrustPolicy::new(&[PathBuf::from(at("p384.pub"))], true)
        .expect_err("a P-384 key");
    assert!(
        refused.to_string().contains("not an ECDSA P-256 key"),
        "{refused}"
    );
}

/// Cosign's registry format, made independently of corral: a payload
/// written as cosign writes it (with a signer's annotations), signed by
/// OpenSSL, attached by another OCI client at cosign's tag with cosign's
/// media type and annotation, is found and verified; and what `corral
/// sign` attaches reads, with that client and OpenSSL, as cosign's.
#[test]
fn cosign_format_signatures_interoperate_both_ways() {
    use base64::Engine as _;
    use oci_client::client::{Config, ImageLayer};
    use oci_client::secrets::RegistryAuth;
    use std::collections::BTreeMap;
    const PAYLOAD_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
    const SIGNATURE: &str = "dev.cosignproject.cosign/signature";

    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name).display().to_string();
    openssl_key(dir.path(), "ossl", "P-256");

    let registry = Registry::start();
    let repository = format!("{}/acme/greeter", registry.host());
    let reference = format!("oci://{repository}:1");
    let digest = registry.push(&example("greeter"), &reference);
    let tag: oci_client::Reference = format!("{repository}:{}.sig", digest.replace(':', "-"))
        .parse()
        .expect("a reference");

    // cosign's payload and attachment, by hand and OpenSSL.
    let payload = format!(
        r#"{{"critical":{{"identity":{{"docker-reference":"{repository}"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"cosign container image signature"}},"optional":{{"pipeline":"release"}}}}"#
    );
    std::fs::write(at("payload.json"), &payload).unwrap();
    let signature = openssl_sign(&at("ossl.key"), &at("payload.json"), &at("payload.der"));
    let layer = ImageLayer::new(
        payload.into_bytes(),
        PAYLOAD_TYPE.to_owned(),
        Some(BTreeMap::from([(SIGNATURE.to_owned(), signature)])),
    );
    block_on(registry.client().push(
        &tag,
        &[layer],
        Config::oci_v1(b"{}".to_vec(), None),
        &RegistryAuth::Anonymous,
        None,
    ))
    .expect("the registry takes the signature");

    // Found by corral's lookup, verified by its trust.
    let policy = corral::trust::TrustPolicy::new(&[PathBuf::from(at("ossl.pub"))], true)
        .expect("OpenSSL's P-256 key");
    let registries = corral::oci::Registries::from_env(vec![registry.host()], 1 << 20);
    let parsed: corral::oci::OciRef = reference.parse().expect("a reference");
    let found = block_on(corral::oci::signatures::signatures(
        &parsed,
        &digest,
        &registries,
    ))
    .expect("the signatures are read");
    let signer = policy
        .verify_payloads(&digest, &found)
        .expect("cosign's format, signed by OpenSSL, verifies");

    // corral signs (OpenSSL's unencrypted key): its layer is added beside
    // the first, and reads as cosign's with another client and OpenSSL.
    let said = ok(
        &[
            "sign",
            &reference,
            "--key",
            &at("ossl.key"),
            "--insecure-registry",
            &registry.host(),
        ],
        "",
    );
    assert!(said.contains(&signer), "{said}");
    let client = registry.client();
    let (manifest, _) = block_on(client.pull_image_manifest(&tag, &RegistryAuth::Anonymous))
        .expect("the signature manifest");
    assert_eq!(manifest.layers.len(), 2, "{manifest:?}");
    let corrals = &manifest.layers[1];
    assert_eq!(corrals.media_type, PAYLOAD_TYPE);
    let mut bytes = Vec::new();
    block_on(client.pull_blob(&tag, corrals, &mut bytes)).expect("the payload");
    let json: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(
        json["critical"]["type"], "cosign container image signature",
        "{json}"
    );
    assert_eq!(
        json["critical"]["image"]["docker-manifest-digest"],
        digest.as_str(),
        "{json}"
    );
    assert_eq!(
        json["critical"]["identity"]["docker-reference"],
        repository.as_str(),
        "{json}"
    );
    let signature = corrals
        .annotations
        .as_ref()
        .and_then(|a| a.get(SIGNATURE))
        .expect("the signature annotation");
    let der = base64::engine::general_purpose::STANDARD
        .decode(signature)
        .expect("base64");
    std::fs::write(at("corral.json"), &bytes).unwrap();
    std::fs::write(at("corral.der"), der).unwrap();
    openssl(&[
        "dgst",
        "-sha256",
        "-verify",
        &at("ossl.pub"),
        "-signature",
        &at("corral.der"),
        &at("corral.json"),
    ]);
}
