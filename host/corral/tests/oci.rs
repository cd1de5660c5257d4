//! Components in a real OCI registry (Debian's `docker-registry`,
//! distribution 2.8): `corral push` writes the Wasm OCI artifact layout
//! other tools read, `corral inspect|run oci://…` pull by tag and by digest,
//! and every bad reference or registry is refused with an error naming it.

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::activities::text;
use common::example;
use common::processes::Corral;
use common::registry::Registry;
use common::registry::block_on;
use oci_client::Reference;
use oci_client::secrets::RegistryAuth;

fn corral(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(args)
        .env_remove("CORRAL_INSECURE_REGISTRIES")
        .output()
        .expect("corral runs")
}

/// Pushes the greeter to `repository:tag`; the manifest digest.
fn push_greeter(registry: &Registry, repository_tag: &str) -> String {
    let reference = format!("oci://{}/{repository_tag}", registry.host());
    registry.push(&example("greeter"), &reference)
}

#[test]
fn a_pushed_component_is_a_wasm_oci_artifact_run_by_tag_and_by_digest() {
    let registry = Registry::start();
    let digest = push_greeter(&registry, "acme/greeter:1.0");
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{digest}"
    );

    // What other tools read: the CNCF layout, and corral's annotation.
    let reference: Reference = format!("{}/acme/greeter:1.0", registry.host())
        .parse()
        .unwrap();
    let (manifest, pulled_digest) = block_on(
        registry
            .client()
            .pull_image_manifest(&reference, &RegistryAuth::Anonymous),
    )
    .unwrap();
    assert_eq!(pulled_digest, digest);
    assert_eq!(
        manifest.config.media_type,
        "application/vnd.wasm.config.v0+json"
    );
    let layers: Vec<&str> = manifest
        .layers
        .iter()
        .map(|l| l.media_type.as_str())
        .collect();
    assert_eq!(layers, ["application/wasm"]);
    let annotations = manifest.annotations.unwrap_or_default();
    let types = &annotations["dev.corral.activity-types"];
    assert!(types.contains("demo:greeter/api.greet"), "{types}");

    let host = registry.host();
    let by_tag = format!("oci://{host}/acme/greeter:1.0");
    let out = corral(&["inspect", &by_tag, "--insecure-registry", &host]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("demo:greeter/api.greet-all"),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains(&format!("pulled {by_tag} ({digest})")),
        "{}",
        text(&out)
    );

    let by_digest = format!("oci://{host}/acme/greeter@{digest}");
    let out = corral(&[
        "run",
        &by_digest,
        "demo:greeter/api.greet",
        r#"{"name":"Ada","language":"english"}"#,
        r#""casual""#,
        "--insecure-registry",
        &host,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Hi, Ada!"),
        "{}",
        text(&out)
    );

    // The greeter's own test cases, against the pushed artifact.
    let cases = example("greeter")
        .ancestors()
        .nth(2)
        .unwrap()
        .join("greeter/greeter.test.toml");
    let out = corral(&[
        "test",
        cases.to_str().unwrap(),
        "--component",
        &by_digest,
        "--insecure-registry",
        &host,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(" passed, 0 failed"), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("pulled {by_digest}")),
        "{}",
        text(&out)
    );
}

#[test]
fn bad_references_and_registries_are_refused_naming_the_problem() {
    let registry = Registry::start();
    push_greeter(&registry, "acme/greeter:1.0");
    let host = registry.host();
    let refused = |args: &[&str], says: &str| {
        let out = corral(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains(says),
            "{args:?} does not say `{says}`: {}",
            text(&out)
        );
    };
    let insecure = ["--insecure-registry", host.as_str()];
    let inspect = |reference: &str, says: &str| {
        let mut args = vec!["inspect", reference];
        args.extend(insecure);
        refused(&args, says);
    };

    inspect(&format!("oci://{host}/acme/greeter:2.0"), "was not found");
    inspect(&format!("oci://{host}/acme/nothing:1.0"), "was not found");
    let unknown = format!("oci://{host}/acme/greeter@sha256:{}", "0".repeat(64));
    inspect(&unknown, "was not found");
    inspect(
        &format!("oci://{host}/acme/greeter"),
        "names no tag or digest",
    );

    // Plain HTTP only where allowed.
    refused(
        &["inspect", &format!("oci://{host}/acme/greeter:1.0")],
        "a plain-HTTP registry must be listed as insecure",
    );
    // A registry nobody listens on.
    let closed = common::processes::free_port();
    refused(
        &[
            "inspect",
            &format!("oci://127.0.0.1:{closed}/acme/greeter:1.0"),
            "--insecure-registry",
            &format!("127.0.0.1:{closed}"),
        ],
        &format!("cannot reach the registry 127.0.0.1:{closed}"),
    );

    // An artifact that is not a component, pushed by another tool.
    registry.push_not_a_component("acme/notes:1.0");
    inspect(
        &format!("oci://{host}/acme/notes:1.0"),
        "is not a Wasm component artifact: it has layers [text/plain]",
    );

    // Pushing what would not load is refused before anything is sent.
    let module = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(module.path(), wat::parse_str("(module)").unwrap()).unwrap();
    let mut args = vec!["push", module.path().to_str().unwrap()];
    let target = format!("oci://{host}/acme/module:1.0");
    args.push(&target);
    args.extend(insecure);
    refused(&args, "core WebAssembly module");
    inspect(&target, "was not found");
}

#[test]
fn a_host_serves_a_configured_oci_component_and_restarts_without_pulling_it_again() {
    let registry = Registry::start();
    let digest = push_greeter(&registry, "acme/greeter:1.0");
    let reference = format!("oci://{}/acme/greeter@{digest}", registry.host());
    let host = common::admin::Host::new(&format!("insecure_registries = [{:?}]", registry.host()));
    // Tenant alpha's component comes from the registry, pinned by digest.
    let greeter = format!("{:?}", example("greeter").display().to_string());
    let config = host
        .config(["", ""])
        .replacen(&greeter, &format!("{reference:?}"), 1);
    assert!(config.contains(&reference), "{config}");
    let inputs = [r#"{"name":"Ada","language":"english"}"#, r#""casual""#];

    let mut serving = Corral::serve(&config);
    assert!(
        serving.stderr().contains(&format!("pulled {reference}")),
        "{}",
        serving.stderr()
    );
    assert_eq!(
        host.run(0, "demo:greeter/api.greet", &inputs)["result"]["message"],
        "Hi, Ada!"
    );
    assert_eq!(
        serving.terminate(Duration::from_secs(20)),
        Some(0),
        "{}",
        serving.stderr()
    );

    // The data directory keeps what was pulled: by tag, a restart asks
    // only what the tag names and pulls nothing.
    let by_tag = config.replace(
        &reference,
        &format!("oci://{}/acme/greeter:1.0", registry.host()),
    );
    let mut serving = Corral::serve(&by_tag);
    assert!(
        serving.stderr().contains("not pulled"),
        "{}",
        serving.stderr()
    );
    assert_eq!(
        serving.terminate(Duration::from_secs(20)),
        Some(0),
        "{}",
        serving.stderr()
    );
    // By digest, it asks the registry nothing: it serves with the registry gone.
    drop(registry);
    let serving = Corral::serve(&config);
    assert!(
        serving.stderr().contains("not pulled"),
        "{}",
        serving.stderr()
    );
    assert_eq!(
        host.run(0, "demo:greeter/api.greet", &inputs)["result"]["message"],
        "Hi, Ada!"
    );
}

#[test]
fn a_configured_reference_that_cannot_be_pulled_stops_the_start_naming_it() {
    let closed = common::processes::free_port();
    let reference = format!("oci://127.0.0.1:{closed}/acme/greeter:1.0");
    let host = common::admin::Host::new(&format!("insecure_registries = [\"127.0.0.1:{closed}\"]"));
    let greeter = format!("{:?}", example("greeter").display().to_string());
    let config = host
        .config(["", ""])
        .replacen(&greeter, &format!("{reference:?}"), 1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("corral.toml");
    std::fs::write(&path, config).unwrap();
    let out = corral(&["serve", "--config", path.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains(&format!("tenant `alpha`: cannot load `{reference}`")),
        "{said}"
    );
    assert!(
        said.contains(&format!("cannot reach the registry 127.0.0.1:{closed}")),
        "{said}"
    );
}

#[test]
fn a_tenant_deploys_from_the_registries_it_is_allowed_and_nowhere_else() {
    let registry = Registry::start();
    let host_port = registry.host();
    let progress = example("progress");
    for repository in ["acme/progress:1.0", "other/progress:1.0"] {
        registry.push(&progress, &format!("oci://{host_port}/{repository}"));
    }
    let host = common::admin::Host::new(&format!("insecure_registries = [{host_port:?}]"));
    let _serving = host.serve([&format!("registries = [\"{host_port}/acme\"]"), ""]);

    // Alpha may use …/acme: the host pulls, stores, activates.
    let allowed = format!("oci://{host_port}/acme/progress:1.0");
    let deployed = host.alpha(&["deploy", &allowed, "--json"]);
    assert_eq!(deployed["name"], "progress", "{deployed}");
    assert_eq!(
        deployed["labels"]["oci.reference"],
        allowed.as_str(),
        "{deployed}"
    );
    assert!(
        deployed["labels"]["oci.manifest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:"))
    );
    assert_eq!(
        host.run(0, "demo:progress/api.count-to", &["3", "1"])["result"],
        3
    );
    // By digest too: the same bytes, the same version.
    let manifest = deployed["labels"]["oci.manifest"]
        .as_str()
        .unwrap()
        .to_owned();
    let by_digest = format!("oci://{host_port}/acme/progress@{manifest}");
    let again = host.alpha(&["deploy", &by_digest, "--json"]);
    assert_eq!(again["digest"], deployed["digest"], "{again}");
    assert_eq!(again["already_stored"], true, "{again}");

    // Another repository, and another tenant with no registries: refused,
    // naming the rule, with nothing stored.
    let refused = |token: &str, reference: &str, says: &str| {
        let out = host.cli(token, &["deploy", reference]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains(says), "no `{says}` in {}", text(&out));
    };
    refused(
        &host.tokens[0].token,
        &format!("oci://{host_port}/other/progress:1.0"),
        &format!("may deploy only from {host_port}/acme (tenant.registries)"),
    );
    refused(
        &host.tokens[1].token,
        &allowed,
        "may deploy from no registry (tenant.registries is empty)",
    );
    refused(
        &host.tokens[0].token,
        &format!("oci://{host_port}/acme/progress:2.0"),
        "was not found",
    );
    let beta = host.cli(&host.tokens[1].token, &["ls", "--json"]);
    assert!(!text(&beta).contains("progress"), "{}", text(&beta));
}

/// A hostile registry on loopback: it answers the manifest with a layer of
/// `declared` bytes, then streams that layer without end.
fn hostile_registry(declared: u64) -> u16 {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.wasm.config.v0+json","digest":"sha256:{}","size":2}},"layers":[{{"mediaType":"application/wasm","digest":"sha256:{}","size":{declared}}}]}}"#,
        "a".repeat(64),
        "b".repeat(64)
    );
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let manifest = manifest.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(&stream);
                let mut request = String::new();
                if reader.read_line(&mut request).is_err() {
                    return;
                }
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let mut stream = &stream;
                if request.contains("/manifests/") {
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\ncontent-type: application/vnd.oci.image.manifest.v1+json\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n{manifest}",
                        manifest.len()
                    );
                } else if request.contains("/blobs/") {
                    let _ = write!(stream, "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n");
                    let chunk = [0u8; 64 << 10];
                    while stream.write_all(&chunk).is_ok() {}
                } else {
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    );
                }
            });
        }
    });
    port
}

#[test]
fn a_registry_that_lies_about_or_overruns_a_layer_is_cut_off() {
    // Declared over the limit: refused before the layer is fetched.
    let port = hostile_registry(1 << 40);
    let out = corral(&[
        "inspect",
        &format!("oci://127.0.0.1:{port}/acme/huge:1"),
        "--insecure-registry",
        &format!("127.0.0.1:{port}"),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("is 1099511627776 bytes, over the limit of 268435456 bytes"),
        "{}",
        text(&out)
    );
    // Declared small, sent without end: cut off at the declared size.
    let port = hostile_registry(10);
    let out = corral(&[
        "inspect",
        &format!("oci://127.0.0.1:{port}/acme/endless:1"),
        "--insecure-registry",
        &format!("127.0.0.1:{port}"),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("the registry sent more than the 10 bytes its manifest declares"),
        "{}",
        text(&out)
    );
}
