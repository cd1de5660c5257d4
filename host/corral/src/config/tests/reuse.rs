//! `reuse` and `rollout` (gates, canaries, shadow replay; per tenant) and
//! `max_warm_instances` (per host).

use std::path::Path;
use std::time::Duration;

use super::GOOD;
use crate::config::Config;

#[test]
fn reuse_is_off_unless_a_tenant_sets_it_and_its_bounds_are_named() {
    let parse = |extra: &str| {
        Config::parse(
            &GOOD.replace("name = \"acme\"", &format!("name = \"acme\"\n{extra}")),
            Path::new("."),
        )
    };
    let config = parse("").unwrap();
    assert_eq!(config.tenants[0].tenant.reuse, None);
    assert_eq!(config.host.max_warm_instances, 64);
    let set = parse("reuse = { max_tasks = 50, idle = \"30s\" }").unwrap();
    let reuse = set.tenants[0].tenant.reuse.unwrap();
    assert_eq!(
        (reuse.max_tasks(), reuse.idle()),
        (50, Duration::from_secs(30))
    );
    for (setting, problem) in [
        (
            "reuse = { max_tasks = 1, idle = \"30s\" }",
            "`acme`).reuse: max_tasks: must be a whole number from 2 to 1000000, got 1",
        ),
        (
            "reuse = { max_tasks = 5, idle = \"2h\" }",
            "`acme`).reuse: idle: must be more than 0 and at most 1h, got 7200s",
        ),
        (
            "reuse = { max_tasks = 5, idle = \"soon\" }",
            "`acme`).reuse.idle:",
        ),
        ("reuse = { max_tasks = 5 }", "missing field `idle`"),
    ] {
        let said = parse(setting).unwrap_err().to_string();
        assert!(said.contains(problem), "{setting}: {said}");
    }
    let host = |n: &str| {
        Config::parse(
            &GOOD.replace("max_concurrent = 8", &format!("max_warm_instances = {n}")),
            Path::new("."),
        )
    };
    assert_eq!(host("0").unwrap().host.max_warm_instances, 0);
    let said = host("-1").unwrap_err().to_string();
    assert!(
        said.contains("host.max_warm_instances: must be a whole number from 0 to 10000, got -1"),
        "{said}"
    );
}

#[test]
fn rollout_holds_nothing_unless_a_tenant_sets_it_and_a_bad_word_is_named() {
    use crate::control::rollout::HoldOn;
    let parse = |extra: &str| {
        Config::parse(
            &GOOD.replace("name = \"acme\"", &format!("name = \"acme\"\n{extra}")),
            Path::new("."),
        )
    };
    assert_eq!(parse("").unwrap().tenants[0].rollout.holds_on().count(), 0);
    let set = parse("rollout = { hold = [\"breaking\", \"new-imports\"] }").unwrap();
    assert_eq!(
        set.tenants[0].rollout.holds_on().collect::<Vec<_>>(),
        [HoldOn::Breaking, HoldOn::NewImports]
    );
    assert_eq!(set.tenants[0].rollout.canary, None);
    let ramped =
        parse("rollout = { canary = { steps = [10, 50], every = \"5m\", min_tasks = 40 } }")
            .unwrap();
    let ramp = ramped.tenants[0].rollout.canary.clone().unwrap();
    assert_eq!(
        (ramp.steps(), ramp.every(), ramp.margin(), ramp.min_tasks()),
        (&[10, 50][..], Duration::from_secs(300), 5, 40)
    );
    for (setting, problem) in [
        (
            "rollout = { hold = [\"breaking\", \"risky\"] }",
            "`acme`).rollout.hold: `risky` is not a change a roll-out can hold on: use every, breaking, new-imports or beyond-grants",
        ),
        ("rollout = { hold = \"breaking\" }", "expected a sequence"),
        (
            "rollout = { canary = { steps = [50, 10], every = \"5m\" } }",
            "`acme`).rollout.canary: steps: 1 to 10 percentages from 1 to 99, each over the one before; got [50, 10]",
        ),
        (
            "rollout = { canary = { steps = [10], every = \"soon\" } }",
            "`acme`).rollout.canary.every:",
        ),
        (
            "rollout = { canary = { steps = [10], every = \"1m\", margin = 101 } }",
            "`acme`).rollout.canary: margin: percentage points from 0 to 100, got 101",
        ),
        ("rollout = { gate = [] }", "unknown field `gate`"),
    ] {
        let said = parse(setting).unwrap_err().to_string();
        assert!(said.contains(problem), "{setting}: {said}");
    }
}

#[test]
fn rollout_shadow_records_only_named_types_within_bounds_and_a_bad_value_is_keyed() {
    let parse = |extra: &str| {
        Config::parse(
            &GOOD.replace("name = \"acme\"", &format!("name = \"acme\"\n{extra}")),
            Path::new("."),
        )
    };
    assert_eq!(parse("").unwrap().tenants[0].rollout.shadow, None);
    let set = parse(
        "rollout = { shadow = { types = [\"demo:x/api.a\"], expire = \"2h\", max_bytes = \"1MiB\", min_agreement = 90 } }",
    )
    .unwrap();
    let shadow = set.tenants[0].rollout.shadow.clone().unwrap();
    assert!(shadow.records("demo:x/api.a") && !shadow.records("demo:x/api.b"));
    assert_eq!(
        (
            shadow.sample(),
            shadow.expire(),
            shadow.max_bytes(),
            shadow.min_agreement()
        ),
        (50, Duration::from_secs(7200), 1 << 20, Some(90))
    );
    for (setting, problem) in [
        (
            "rollout = { shadow = { types = [] } }",
            "`acme`).rollout.shadow: types: name at least one activity type",
        ),
        (
            "rollout = { shadow = { types = [\"a\"], sample = 0 } }",
            "`acme`).rollout.shadow: sample: from 1 to 1000 attempts per type, got 0",
        ),
        (
            "rollout = { shadow = { types = [\"a\"], expire = \"later\" } }",
            "`acme`).rollout.shadow.expire:",
        ),
        (
            "rollout = { shadow = { types = [\"a\"], max_bytes = \"1KiB\" } }",
            "`acme`).rollout.shadow: max_bytes: from 64 KiB to 256 MiB, got 1024",
        ),
        (
            "rollout = { shadow = { types = [\"a\"], min_agreement = 101 } }",
            "`acme`).rollout.shadow: min_agreement: a percentage from 0 to 100, got 101",
        ),
        (
            "rollout = { shadow = { types = [\"a\"], record = true } }",
            "unknown field `record`",
        ),
    ] {
        let said = parse(setting).unwrap_err().to_string();
        assert!(said.contains(problem), "{setting}: {said}");
    }
}
