//! Signed code only, end to end: keys made and components signed with the
//! real CLI (`corral key new`, `corral sign`, `corral push --sign`), a real
//! registry, and a host whose tenant requires its key's signature. What
//! no trusted key signed never serves, however it comes (a followed tag,
//! a deploy from a registry, a local file, a restart with the key gone),
//! and the last good version serves on meanwhile.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::activities::text;
use common::admin::Host;
use common::example;
use common::processes::{Corral, sample};
use common::registry::{Registry, block_on};

const HOLD: &str = "demo:versioned/api.hold";

/// `corral <args>` with the private keys' password in the environment.
fn corral(args: &[&str], password: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_corral"));
    command
        .args(args)
        .env_remove("CORRAL_KEY_PASSWORD")
        .env_remove("COSIGN_PASSWORD");
    if let Some(password) = password {
        command.env("CORRAL_KEY_PASSWORD", password);
    }
    command.output().expect("corral runs")
}

/// `corral <args>`, expecting success: its stdout.
fn ok(args: &[&str], password: &str) -> String {
    let out = corral(args, Some(password));
    assert!(out.status.success(), "corral {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `corral <args>`, expecting a refusal (exit 2) that says `says`.
fn refused(out: &Output, says: &str) {
    let said = text(out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains(says), "no `{says}` in: {said}");
}

/// A key pair made by `corral key new`: the private key's path, the
/// public key's, and its fingerprint as printed.
struct Key {
    private: String,
    public: PathBuf,
    fingerprint: String,
    password: &'static str,
}

fn new_key(dir: &Path, name: &str, password: &'static str) -> Key {
    let base = dir.join(name);
    let said = ok(&["key", "new", &base.display().to_string()], password);
    let fingerprint = said
        .split_once("(sha256:")
        .and_then(|(_, rest)| rest.split(')').next())
        .map(|hex| format!("sha256:{hex}"))
        .unwrap_or_else(|| panic!("no fingerprint in: {said}"));
    Key {
        private: format!("{}.key", base.display()),
        public: base.with_extension("pub"),
        fingerprint,
        password,
    }
}

fn sign(target: &str, key: &Key, extra: &[&str]) -> String {
    let mut args = vec!["sign", target, "--key", &key.private];
    args.extend_from_slice(extra);
    ok(&args, key.password)
}

/// The JSON of tenant alpha's stored version of deployment `name` at
/// `digest` (the active one without).
fn version(host: &Host, name: &str) -> Vec<serde_json::Value> {
    let listed = host.alpha(&["ls", "--json"]);
    listed
        .as_array()
        .map(|all| all.iter().filter(|v| v["name"] == name).cloned().collect())
        .unwrap_or_default()
}

#[test]
fn keys_are_made_owner_only_and_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("release").display().to_string();
    // No password given: nothing is made (an empty one is said so).
    refused(
        &corral(&["key", "new", &base], None),
        "set CORRAL_KEY_PASSWORD or COSIGN_PASSWORD",
    );
    assert!(!dir.path().join("release.key").exists());
    let key = new_key(dir.path(), "release", "pw");
    let mode = std::fs::metadata(&key.private)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the private key is {mode:o}");
    let private = std::fs::read_to_string(&key.private).unwrap();
    assert!(
        private.contains("ENCRYPTED SIGSTORE PRIVATE KEY"),
        "{private}"
    );
    refused(
        &corral(&["key", "new", &base], Some("pw")),
        "exists: not overwriting it",
    );
    assert_eq!(std::fs::read_to_string(&key.private).unwrap(), private);

    // A wrong password signs nothing, and says where the password comes from.
    let file = dir.path().join("greeter.wasm");
    std::fs::copy(example("greeter"), &file).unwrap();
    let file = file.display().to_string();
    refused(
        &corral(&["sign", &file, "--key", &key.private], Some("wrong")),
        "CORRAL_KEY_PASSWORD or COSIGN_PASSWORD",
    );
    assert!(!Path::new(&format!("{file}.sig")).exists());
}

#[test]
fn a_tenant_that_requires_signatures_serves_only_what_its_keys_signed() {
    let keys = tempfile::tempdir().unwrap();
    let release = new_key(keys.path(), "release", "release-pw");
    let stranger = new_key(keys.path(), "stranger", "stranger-pw");
    assert_ne!(release.fingerprint, stranger.fingerprint);

    // The tenant's configured component, signed beside it (FILE.sig).
    let greeter = keys.path().join("greeter.wasm");
    std::fs::copy(example("greeter"), &greeter).unwrap();
    let greeter = greeter.display().to_string();
    sign(&greeter, &release, &[]);

    let registry = Registry::start();
    let insecure = ["--insecure-registry", &registry.host()];
    let stable = format!("oci://{}/acme/versioned:stable", registry.host());
    let pushed = ok(
        &[
            &["push", &example("versioned").display().to_string(), &stable],
            &insecure[..],
            &["--sign", &release.private],
        ]
        .concat(),
        release.password,
    );
    assert!(pushed.contains(&release.fingerprint), "{pushed}");

    let host = Host::new(&format!(
        "insecure_registries = [{:?}]\nfollow_interval = \"1s\"",
        registry.host()
    ));
    let alpha = |trusted: &Key| {
        format!(
            "follow = [{stable:?}]\nregistries = [{:?}]\ntrust = {{ keys = [{:?}] }}",
            registry.host(),
            trusted.public.display().to_string()
        )
    };
    // Alpha's configured greeter is the signed copy.
    let config = |trusted: &Key| {
        Host::alpha_greeter(&host.config([&alpha(trusted), ""]), Path::new(&greeter))
    };
    let mut serving = Corral::serve(&config(&release));
    let activated = format!("following {stable}: activated");
    serving.await_logged(&activated, 1);
    assert_eq!(host.run(0, HOLD, &["0"])["result"], "v1");
    for name in ["versioned", "greeter"] {
        let stored = version(&host, name);
        assert_eq!(
            stored[0]["signer"],
            release.fingerprint.as_str(),
            "{stored:?}"
        );
    }
    // Who signed what serves, wherever versions are listed.
    let status = host.alpha(&["status", "--json"]);
    assert_eq!(
        status["tenants"][0]["active_signers"]["versioned"],
        release.fingerprint.as_str(),
        "{status}"
    );
    let token = &host.tokens[0].token;
    let short = &release.fingerprint[..15];
    for args in [&["ls"][..], &["status"]] {
        let out = host.cli(token, args);
        assert!(text(&out).contains(short), "{args:?}: {}", text(&out));
    }
    let beta = host.cli(&host.tokens[1].token, &["status"]);
    assert!(text(&beta).contains("(unsigned)"), "{}", text(&beta));

    // An unsigned push to the tag: not pulled, not served; v1 serves on.
    registry.push(&example("v2/versioned"), &stable);
    serving.await_logged("no signature for sha256:", 1);
    assert_eq!(host.run(0, HOLD, &["0"])["result"], "v1");
    let status = host.alpha(&["status", "--json"]);
    let following = &status["tenants"][0]["following"][0];
    assert!(
        following["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("no signature for")),
        "{status}"
    );

    // Signed, but by a key the tenant does not trust.
    sign(&stable, &stranger, &insecure);
    serving.await_logged("signed, but by no key the tenant trusts", 1);
    assert_eq!(host.run(0, HOLD, &["0"])["result"], "v1");

    // The trusted key's signature of v1, replayed for v2.
    let v1 = pushed
        .lines()
        .find_map(|l| l.strip_prefix(&format!("pushed {stable} (")))
        .and_then(|d| d.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no digest in: {pushed}"))
        .to_owned();
    let v2 = current_digest(&registry, &stable);
    replay_signature(&registry, &stable, &release, &v1, &v2);
    serving.await_logged(&format!("its signature is for {v1}, not {v2}"), 1);
    assert_eq!(host.run(0, HOLD, &["0"])["result"], "v1");

    // Signed by the release key after the push (as a pipeline does): the
    // follow asks again, and rolls out.
    sign(&stable, &release, &insecure);
    serving.await_logged(&activated, 2);
    assert_eq!(host.run(0, HOLD, &["0"])["result"], "v2");
    // Each signature was added to the tag's, none replaced another.
    let tag = format!("{}.sig", v2.replace(':', "-"));
    let signatures = signature_layers(&registry, &stable.replace(":stable", &format!(":{tag}")));
    assert_eq!(
        signatures, 3,
        "the stranger's, the replayed and the release key's"
    );
    let scrape = host.scrape();
    for reason in ["unsigned", "untrusted_key", "other_digest"] {
        let series =
            format!("corral_signatures_refused_total{{tenant=\"alpha\",reason=\"{reason}\"}}");
        assert!(
            sample(&scrape, &series).is_some_and(|n| n >= 1.0),
            "no {series} in:\n{scrape}"
        );
    }

    // A deploy from the registry: what is unsigned there is refused, with
    // the reason, and nothing is stored.
    let unsigned = format!("oci://{}/acme/greeter:unsigned", registry.host());
    registry.push(&example("greeter"), &unsigned);
    let before = version(&host, "greeter").len();
    let out = host.cli(&host.tokens[0].token, &["deploy", &unsigned]);
    refused(
        &out,
        "tenant `alpha` runs only versions signed by a key it trusts: oci://",
    );
    refused(&out, ": no signature for sha256:");
    assert_eq!(version(&host, "greeter").len(), before);

    // A local file: without its signature, with a stranger's, then its own.
    let file = keys.path().join("echo.wasm");
    std::fs::copy(example("echo"), &file).unwrap();
    let file = file.display().to_string();
    refused(&host.cli(token, &["deploy", &file]), "no signature file");
    let strangers = format!("{file}.stranger.sig");
    sign(&file, &stranger, &["--output-signature", &strangers]);
    refused(
        &host.cli(token, &["deploy", &file, "--signature", &strangers]),
        "signed, but by no key the tenant trusts",
    );
    assert!(version(&host, "echo").is_empty());
    sign(&file, &release, &[]);
    let out = host.cli(token, &["deploy", &file]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("signed:   by key {}", release.fingerprint)),
        "{}",
        text(&out)
    );

    // Restarted trusting a new key only (the greeter re-signed with it):
    // what the release key signed is kept but not served, held with why,
    // and not even the operator activates it.
    serving.terminate(std::time::Duration::from_secs(10));
    drop(serving);
    let rotated = new_key(keys.path(), "rotated", "rotated-pw");
    sign(&greeter, &rotated, &[]);
    let serving = Corral::serve(&config(&rotated));
    let v2_component = version(&host, "versioned")
        .into_iter()
        .find(|v| !v["held"].as_array().is_none_or(Vec::is_empty))
        .unwrap_or_else(|| panic!("no held version: {:?}", version(&host, "versioned")));
    assert!(
        v2_component["held"][0]
            .as_str()
            .is_some_and(|h| h.contains("not signed by a key the tenant trusts now")),
        "{v2_component}"
    );
    assert!(
        version(&host, "versioned")
            .iter()
            .all(|v| v["active"] == false)
    );
    let digest = v2_component["digest"].as_str().unwrap_or_default();
    refused(
        &host.cli(
            &host.operator.token,
            &["approve", "--tenant", "alpha", digest],
        ),
        "runs only versions signed by a key it trusts",
    );
    refused_to_run(
        &host,
        "tenant `alpha` serves no activity type `demo:versioned/api.hold`",
    );
    drop(serving);
}

/// Alpha's `invoke` of [`HOLD`] fails as an unknown type, saying `says`.
fn refused_to_run(host: &Host, says: &str) {
    let out = host.cli(&host.tokens[0].token, &["invoke", HOLD, "0"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains(says), "{}", text(&out));
}

/// The manifest digest `reference` names now, as the registry's own
/// client reads it.
fn current_digest(registry: &Registry, reference: &str) -> String {
    let reference: oci_client::Reference = reference
        .trim_start_matches("oci://")
        .parse()
        .expect("a reference");
    block_on(
        registry
            .client()
            .fetch_manifest_digest(&reference, &oci_client::secrets::RegistryAuth::Anonymous),
    )
    .expect("the registry answers")
}

/// How many layers the manifest at `reference` has.
fn signature_layers(registry: &Registry, reference: &str) -> usize {
    let reference: oci_client::Reference = reference
        .trim_start_matches("oci://")
        .parse()
        .expect("a reference");
    let (manifest, _) = block_on(
        registry
            .client()
            .pull_image_manifest(&reference, &oci_client::secrets::RegistryAuth::Anonymous),
    )
    .expect("the signature manifest");
    manifest.layers.len()
}

/// Pushes to `v2`'s signature tag the release key's signature of `v1`'s
/// payload: a real signature, for another artifact.
fn replay_signature(registry: &Registry, stable: &str, key: &Key, v1: &str, v2: &str) {
    let reference: corral::oci::OciRef = stable.parse().expect("a reference");
    let signing =
        corral::trust::sign::SigningKey::read(Path::new(&key.private), key.password.as_bytes())
            .expect("the key reads");
    let payload = corral::trust::sign::payload(&reference.repository(), v1).expect("a payload");
    let signature = signing.sign(&payload).expect("it signs");
    let registries = corral::oci::Registries::from_env(vec![registry.host()], 1 << 20);
    block_on(corral::oci::signatures::push_signature(
        &reference,
        v2,
        payload,
        signature,
        &registries,
    ))
    .expect("the registry takes it");
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
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {}", text(&out));
        out
    };
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
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        &at("ossl.key"),
    ]);
    openssl(&[
        "pkey",
        "-in",
        &at("ossl.key"),
        "-pubout",
        "-out",
        &at("ossl.pub"),
    ]);
    openssl(&[
        "dgst",
        "-sha256",
        "-sign",
        &at("ossl.key"),
        "-out",
        &at("ossl.der"),
        &file,
    ]);
    let signature =
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(at("ossl.der")).unwrap());
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
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-384",
        "-out",
        &at("p384.key"),
    ]);
    openssl(&[
        "pkey",
        "-in",
        &at("p384.key"),
        "-pubout",
        "-out",
        &at("p384.pub"),
    ]);
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
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {}", text(&out));
    };
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        &at("ossl.key"),
    ]);
    openssl(&[
        "pkey",
        "-in",
        &at("ossl.key"),
        "-pubout",
        "-out",
        &at("ossl.pub"),
    ]);

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
    openssl(&[
        "dgst",
        "-sha256",
        "-sign",
        &at("ossl.key"),
        "-out",
        &at("payload.der"),
        &at("payload.json"),
    ]);
    let signature =
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(at("payload.der")).unwrap());
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
