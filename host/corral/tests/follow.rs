//! Following a tag (a fleet's roll-out without a coordinator), against a
//! real registry: a host serves what `…:stable` names, moves to each new
//! push of the tag, keeps serving the last good version when the tag names
//! something that does not load (saying so in `status` and `/metrics`), and
//! rolls back when the tag moves back.

mod common;

use common::admin::Host;
use common::example;
use common::registry::Registry;

const HOLD: &str = "demo:versioned/api.hold";

#[test]
fn a_host_follows_a_tag_forward_past_a_bad_push_and_back() {
    let registry = Registry::start();
    let stable = format!("oci://{}/acme/versioned:stable", registry.host());
    registry.push(&example("versioned"), &stable);

    let host = Host::new(&format!(
        "insecure_registries = [{:?}]\nfollow_interval = \"1s\"",
        registry.host()
    ));
    let serving = host.serve([&format!("follow = [{stable:?}]"), ""]);
    // Checked before the host says it is ready, for up to 10 s: a slower
    // first pull and compile is waited for by its own line.
    let activated = format!("following {stable}: activated");
    serving.await_logged(&activated, 1);
    assert_eq!(host.run(0, HOLD, &["0"])["result"], "v1");

    registry.push(&example("v2/versioned"), &stable);
    serving.await_logged(&activated, 2);
    assert_eq!(host.run(0, HOLD, &["0"])["result"], "v2");

    // The tag now names something that is not a component: not activated,
    // v2 keeps serving, and the failure is visible.
    registry.push_not_a_component("acme/versioned:stable");
    serving.await_logged("not activated", 1);
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
    registry.push(&example("versioned"), &stable);
    serving.await_logged(&activated, 3);
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

/// The tenant's roll-out gate holds a followed tag's breaking version as it
/// holds a deploy: the host keeps serving the version before it, shows the
/// hold, and serves it once the operator approves.
#[test]
fn a_followed_tag_s_breaking_version_waits_for_the_operator() {
    let registry = Registry::start();
    let stable = format!("oci://{}/acme/versioned:stable", registry.host());
    registry.push(&example("v2/versioned"), &stable);
    let host = Host::new(&format!(
        "insecure_registries = [{:?}]\nfollow_interval = \"1s\"",
        registry.host()
    ));
    let serving = host.serve([
        &format!("follow = [{stable:?}]\nrollout = {{ hold = [\"breaking\"] }}"),
        "",
    ]);
    assert_eq!(host.run(0, HOLD, &["0"])["result"], "v2");

    // v1 drops an activity type v2 has: held, and v2 goes on serving.
    registry.push(&example("versioned"), &stable);
    serving.await_logged("for an operator's approval", 1);
    assert_eq!(host.run(0, HOLD, &["0"])["result"], "v2");
    let status = host.alpha(&["status", "--json"]);
    let tenant = &status["tenants"][0];
    let held = tenant["held"][0]["digest"].as_str().unwrap_or_default();
    assert!(held.starts_with("sha256:"), "{status}");
    assert_eq!(tenant["following"][0]["held"], held, "{status}");
    assert_eq!(tenant["following"][0]["last_error"], "", "{status}");
    assert!(
        host.scrape()
            .contains("corral_versions_held{tenant=\"alpha\"} 1")
    );

    // The operator approves it on this host.
    let out = host.cli(
        &host.operator.token,
        &["approve", "--tenant", "alpha", held],
    );
    assert!(out.status.success(), "{}", common::activities::text(&out));
    assert_eq!(host.run(0, HOLD, &["0"])["result"], "v1");
    let status = host.alpha(&["status", "--json"]);
    let following = &status["tenants"][0]["following"][0];
    assert_eq!(following["held"], "", "{status}");
    assert_eq!(following["active"], held, "{status}");
}
