//! Roll-out gates end to end: the real `corral` binary serving a real
//! Temporal dev server, a tenant whose `rollout` holds breaking versions,
//! deployed to and approved through corral's own CLI.

mod common;

use std::time::Duration;

use serde_json::json;

use common::activities::{json_of, text};
use common::admin::{Host, path};
use common::example;

#[test]
fn a_breaking_version_is_held_until_the_operator_approves_it_and_the_active_one_serves_meanwhile() {
    let host = Host::new("");
    let mut corral = host.serve([r#"rollout = { hold = ["breaking"] }"#, ""]);
    let hold = "demo:versioned/api.hold";
    let added = "demo:versioned/extra.added";
    let (v1_file, v2_file) = (path(&example("versioned")), path(&example("v2/versioned")));
    let operator = |args: &[&str]| host.cli(&host.operator.token, args);

    // A deployment's first version breaks no caller: it activates.
    let v2 = host.alpha(&["deploy", &v2_file, "--json"]);
    assert_eq!(v2["active"], true, "{v2}");
    assert_eq!(v2["held"], json!([]), "{v2}");
    let v2_digest = v2["digest"].as_str().unwrap().to_owned();
    assert_eq!(host.run(0, added, &[])["result"], "v2");

    // v1 has no `extra.added`: deployed over v2 it breaks that type's
    // callers, so it is stored and held, and v2 goes on serving.
    let v1 = host.alpha(&["deploy", &v1_file, "--json"]);
    assert_eq!(v1["active"], false, "{v1}");
    let reason = "breaks callers: removes demo:versioned/extra.added";
    assert_eq!(v1["held"], json!([reason]), "{v1}");
    assert_eq!(v1["changes"]["removed"], json!([added]), "{v1}");
    let v1_digest = v1["digest"].as_str().unwrap().to_owned();
    let said = host.cli(&host.tokens[0].token, &["deploy", &v1_file]);
    assert!(
        String::from_utf8_lossy(&said.stdout).contains(&format!(
            "alpha {v1_digest} of `versioned`: stored, held for an operator's approval (corral approve) (already stored)\n  held:     {reason}"
        )),
        "{}",
        text(&said)
    );
    assert_eq!(host.run(0, hold, &["0"])["result"], "v2");
    assert_eq!(host.run(0, added, &[])["result"], "v2");

    // The operator sees it held: status (both forms) and /metrics.
    let status = json_of(&operator(&["status", "--json"]));
    assert_eq!(
        status["tenants"][0]["held"],
        json!([{"deployment": "versioned", "digest": v1_digest, "reasons": [reason]}]),
        "{status}"
    );
    assert_eq!(status["tenants"][1]["held"], json!([]), "{status}");
    let shown = operator(&["status"]);
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains(&format!(
            "  versioned: held {v1_digest} for approval: {reason}"
        )),
        "{}",
        text(&shown)
    );
    assert!(
        host.scrape()
            .contains("corral_versions_held{tenant=\"alpha\"} 1"),
        "{}",
        host.scrape()
    );

    // The tenant's own token can neither activate it nor approve it.
    let activated = host.cli(&host.tokens[0].token, &["activate", &v1_digest]);
    assert!(!activated.status.success(), "{}", text(&activated));
    assert!(
        String::from_utf8_lossy(&activated.stderr).contains(&format!(
            "FailedPrecondition: {v1_digest} of `versioned` is held for an operator's approval by the tenant's rollout ({reason}): an operator activates it with `corral approve`"
        )),
        "{}",
        text(&activated)
    );
    let approved = host.cli(&host.tokens[0].token, &["approve", &v1_digest]);
    assert!(!approved.status.success(), "{}", text(&approved));
    assert!(
        String::from_utf8_lossy(&approved.stderr)
            .contains("PermissionDenied: only the operator's token approves a version"),
        "{}",
        text(&approved)
    );
    assert_eq!(host.run(0, hold, &["0"])["result"], "v2");

    // The hold is kept across a restart.
    assert_eq!(corral.terminate(Duration::from_secs(20)), Some(0));
    let _corral = host.serve([r#"rollout = { hold = ["breaking"] }"#, ""]);
    let status = json_of(&operator(&["status", "--json", "--tenant", "alpha"]));
    assert_eq!(
        status["tenants"][0]["held"][0]["digest"],
        v1_digest.as_str(),
        "{status}"
    );
    assert_eq!(
        status["tenants"][0]["active"]["versioned"],
        v2_digest.as_str()
    );

    // The operator approves it: v1 serves, and nothing is held any more.
    let out = operator(&["approve", "--tenant", "alpha", &v1_digest[7..19], "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let approved = json_of(&out);
    assert_eq!(approved["digest"], v1_digest.as_str(), "{approved}");
    assert_eq!(approved["held"], json!([]), "{approved}");
    assert_eq!(approved["previous_digest"], v2_digest.as_str());
    assert_eq!(host.run(0, hold, &["0"])["result"], "v1");
    assert!(
        host.scrape()
            .contains("corral_versions_held{tenant=\"alpha\"} 0"),
        "{}",
        host.scrape()
    );

    // A version that served before passes the gate: rolling forward to v2
    // and back to v1 needs no approval.
    let forward = host.alpha(&["activate", &v2_digest, "--json"]);
    assert_eq!(forward["previous_digest"], v1_digest.as_str(), "{forward}");
    assert_eq!(host.run(0, added, &[])["result"], "v2");
    let back = host.alpha(&["deploy", &v1_file, "--json"]);
    assert_eq!(back["active"], true, "{back}");
    assert_eq!(back["already_stored"], true, "{back}");

    // Removing the active version gives a breaking one no way past the
    // gate: with nothing to compare, the next new version is held; once a
    // version serves the deployment again, the gate compares as before.
    let removed = host.alpha(&["rm", "--force", &v1_digest, "--json"]);
    assert_eq!(removed["digest"], v1_digest.as_str(), "{removed}");
    let v3 = host.alpha(&["deploy", &path(&example("v3/versioned")), "--json"]);
    assert_eq!(v3["active"], false, "{v3}");
    assert_eq!(
        v3["held"],
        json!([
            "may break callers: its deployment's active version was removed (rm --force), so nothing shows what its callers expect"
        ]),
        "{v3}"
    );
    let status = json_of(&operator(&["status", "--json", "--tenant", "alpha"]));
    assert_eq!(
        status["tenants"][0]["active"].get("versioned"),
        None,
        "{status}"
    );
    // Nor is a new deployment name: the old code deployed under another
    // name serves what the removed version's callers call, and is held
    // as well (before, it activated with no hold).
    let renamed = host.alpha(&["deploy", &v1_file, "--name", "renamed", "--json"]);
    assert_eq!(renamed["active"], false, "{renamed}");
    assert_eq!(
        renamed["held"],
        json!([format!(
            "may break callers: `{hold}` was served by a version removed while active (rm --force), so nothing shows what its callers expect"
        )]),
        "{renamed}"
    );
    let again = host.alpha(&["activate", &v2_digest, "--json"]);
    assert_eq!(again["digest"], v2_digest.as_str(), "{again}");
    assert_eq!(host.run(0, added, &[])["result"], "v2");

    // A tenant without a rollout is never held.
    let beta = |file: &str| {
        let out = host.cli(
            &host.tokens[1].token,
            &["deploy", file, "--name", "versioned", "--json"],
        );
        assert!(out.status.success(), "{}", text(&out));
        json_of(&out)
    };
    assert_eq!(beta(&v2_file)["active"], true);
    let beta_v1 = beta(&v1_file);
    assert_eq!(beta_v1["active"], true, "{beta_v1}");
    assert_eq!(beta_v1["changes"]["breaks_callers"], true, "{beta_v1}");
    assert_eq!(beta_v1["changes"].get("beyond_grants"), None, "{beta_v1}");

    // A version's own alias is part of what its callers call: a version
    // without it removes it for them.
    let beta_cli = |args: &[&str]| {
        let out = host.cli(&host.tokens[1].token, args);
        assert!(out.status.success(), "{}", text(&out));
        json_of(&out)
    };
    let v3_file = path(&example("v3/versioned"));
    let aliased = beta_cli(&[
        "deploy",
        &v3_file,
        "--name",
        "versioned",
        "--alias",
        "hold_it=demo:versioned/api.hold",
        "--json",
    ]);
    assert_eq!(aliased["active"], true, "{aliased}");
    assert_eq!(host.run(1, "hold_it", &["5"])["result"], "v3");
    let unaliased = beta(&v2_file);
    assert_eq!(
        unaliased["changes"]["removed"],
        json!(["hold_it (an alias of demo:versioned/api.hold)"]),
        "{unaliased}"
    );
    assert_eq!(unaliased["changes"]["breaks_callers"], true, "{unaliased}");

    // The report names what a version would use that its tenant is not
    // granted: `fetch` calls out over HTTP, and beta grants no host.
    let fetch = beta(&path(&example("fetch")));
    let beyond = fetch["changes"]["beyond_grants"].to_string();
    assert!(
        beyond.contains("outbound HTTP, and no host is granted (wasi:http/outgoing-handler@"),
        "{fetch}"
    );
}
