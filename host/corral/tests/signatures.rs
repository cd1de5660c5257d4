//! Signed code only, end to end: keys made and components signed with the
//! real CLI (`corral key new`, `corral sign`, `corral push --sign`), a real
//! registry, and a host whose tenant requires its key's signature. What
//! no trusted key signed never serves, however it comes (a followed tag,
//! a deploy from a registry, a local file, a restart with the key gone),
//! and the last good version serves on meanwhile.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use common::activities::text;
use common::admin::Host;
use common::example;
use common::processes::{Corral, sample};
use common::registry::{Registry, block_on};
use common::signing::{Key, corral, new_key, ok, refused, sign};

const HOLD: &str = "demo:versioned/api.hold";

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

/// A canary is a version that serves: a restart whose trust no longer
/// admits its candidate's signer ends it (held, with why), and every task
/// goes to the active version; it is never promoted.
#[test]
fn a_canary_whose_key_is_removed_never_serves_again() {
    let keys = tempfile::tempdir().unwrap();
    let release = new_key(keys.path(), "release", "release-pw");
    let ci = new_key(keys.path(), "ci", "ci-pw");
    let copy = |from: &Path, name: &str, key: &Key| {
        let file = keys.path().join(name);
        std::fs::copy(from, &file).unwrap();
        let file = file.display().to_string();
        sign(&file, key, &[]);
        file
    };
    let greeter = copy(&example("greeter"), "greeter.wasm", &release);
    let v1 = copy(&example("versioned"), "v1.wasm", &release);
    let v2 = copy(&example("v2/versioned"), "v2.wasm", &ci);
    let host = Host::new("");
    let trusting = |keys: &[&Key]| {
        let paths: Vec<String> = keys
            .iter()
            .map(|k| k.public.display().to_string())
            .collect();
        let alpha = format!("trust = {{ keys = {paths:?} }}");
        Host::alpha_greeter(&host.config([&alpha, ""]), Path::new(&greeter))
    };
    let mut serving = Corral::serve(&trusting(&[&release, &ci]));
    let token = &host.tokens[0].token;
    let deployed = host.cli(token, &["deploy", &v1, "--name", "versioned"]);
    assert!(deployed.status.success(), "{}", text(&deployed));
    // v2, signed by the CI key, takes half of the tasks for an hour.
    let canary = host.cli(
        token,
        &["deploy", &v2, "--name", "versioned", "--canary", "50/1h"],
    );
    assert!(canary.status.success(), "{}", text(&canary));
    let answers = |n: usize| -> Vec<String> {
        (0..n)
            .map(|_| {
                host.run(0, HOLD, &["0"])["result"]
                    .as_str()
                    .unwrap_or("?")
                    .to_owned()
            })
            .collect()
    };
    let served = answers(4);
    assert!(served.iter().any(|a| a == "v2"), "{served:?}");

    // Restarted trusting the release key only: the canary is over.
    serving.terminate(std::time::Duration::from_secs(10));
    drop(serving);
    let serving = Corral::serve(&trusting(&[&release]));
    let status = host.alpha(&["status", "--json"]);
    assert_eq!(
        status["tenants"][0]["canaries"],
        serde_json::json!([]),
        "{status}"
    );
    let candidate = version(&host, "versioned")
        .into_iter()
        .find(|v| v["signer"] == ci.fingerprint.as_str())
        .unwrap_or_else(|| panic!("no v2: {:?}", version(&host, "versioned")));
    assert!(
        candidate["held"][0]
            .as_str()
            .is_some_and(|h| h.contains("not signed by a key the tenant trusts now")),
        "{candidate}"
    );
    assert_eq!(candidate["canary_percent"], 0, "{candidate}");
    assert_eq!(answers(4), ["v1"; 4]);
    assert!(
        !host.scrape().contains("corral_canary_percent{"),
        "a canary in /metrics"
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
