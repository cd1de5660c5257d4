//! Following a tag (a fleet's roll-out without a coordinator), against a
//! real registry: a host serves what `…:stable` names, moves to each new
//! push of the tag, keeps serving the last good version when the tag names
//! something that does not load (saying so in `status` and `/metrics`), and
//! rolls back when the tag moves back.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::activities::text;
use common::admin::Host;
use common::example;
use common::processes::Corral;
use common::registry::Registry;
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

const HOLD: &str = "demo:versioned/api.hold";

fn push(registry: &Registry, file: &std::path::Path, reference: &str) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["push", file.to_str().unwrap(), reference])
        .args(["--insecure-registry", &registry.host()])
        .output()
        .expect("corral runs");
    assert!(out.status.success(), "push: {}", text(&out));
    out
}

/// Waits until the host has logged `line` `times` times: the follower's own
/// account of each check, not a guess at how long one takes.
fn await_log(host: &Corral, line: &str, times: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while host.stderr().matches(line).count() < times {
        assert!(
            Instant::now() < deadline,
            "`{line}` not logged {times} times:\n{}",
            host.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_host_follows_a_tag_forward_past_a_bad_push_and_back() {
    let registry = Registry::start();
    let stable = format!("oci://{}/acme/versioned:stable", registry.host());
    push(&registry, &example("versioned"), &stable);

    let host = Host::new(&format!(
        "insecure_registries = [{:?}]\nfollow_interval = \"1s\"",
        registry.host()
    ));
    let serving = host.serve([&format!("follow = [{stable:?}]"), ""]);
    // Checked before the host said it was ready.
    assert_eq!(host.run(0, HOLD, &["0"])["result"], "v1");
    let activated = format!("following {stable}: activated");
    await_log(&serving, &activated, 1);

    push(&registry, &example("v2/versioned"), &stable);
    await_log(&serving, &activated, 2);
    assert_eq!(host.run(0, HOLD, &["0"])["result"], "v2");

    // The tag now names something that is not a component: not activated,
    // v2 keeps serving, and the failure is visible.
    let reference: Reference = format!("{}/acme/versioned:stable", registry.host())
        .parse()
        .unwrap();
    let client = Client::new(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(vec![registry.host()]),
        ..ClientConfig::default()
    });
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(client.push(
            &reference,
            &[ImageLayer::new(
                b"not wasm".to_vec(),
                "text/plain".into(),
                None,
            )],
            Config::new(
                b"{}".to_vec(),
                "application/vnd.oci.image.config.v1+json".into(),
                None,
            ),
            &RegistryAuth::Anonymous,
            None,
        ))
        .unwrap();
    await_log(&serving, "not activated", 1);
    assert_eq!(host.run(0, HOLD, &["0"])["result"], "v2");
    let status = host.alpha(&["status", "--json"]);
    let following = &status["tenants"][0]["following"][0];
    assert_eq!(following["reference"], stable.as_str(), "{status}");
    assert!(
        following["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("not a Wasm component artifact")),
        "{status}"
    );
    let scrape = host.scrape();
    assert!(
        scrape.contains(&format!(
            "corral_follow_failing{{tenant=\"alpha\",deployment=\"versioned\",reference=\"{stable}\"}} 1"
        )),
        "{scrape}"
    );

    // Rolling back is moving the tag back.
    push(&registry, &example("versioned"), &stable);
    await_log(&serving, &activated, 3);
    assert_eq!(host.run(0, HOLD, &["0"])["result"], "v1");
    let status = host.alpha(&["status", "--json"]);
    let following = &status["tenants"][0]["following"][0];
    assert_eq!(following["last_error"], "", "{status}");
    // Status names each deployment's active version: what a fleet's
    // operator asks every host.
    assert_eq!(
        status["tenants"][0]["active"]["versioned"], following["active"],
        "{status}"
    );
}
