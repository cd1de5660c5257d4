//! Loading components: every bad input refused with a reason that names the
//! problem, and compiled code cached on disk across restarts.

mod common;

use corral_core::sandbox::LoadError;
use corral_core::testing::TestHost;
use serde_json::json;

use common::{example, host};

fn refusal(bytes: &[u8]) -> LoadError {
    match host().build().unwrap().load_bytes(bytes) {
        Ok(_) => panic!("the component was accepted"),
        Err(e) => e,
    }
}

#[test]
fn garbage_is_not_webassembly() {
    let e = refusal(b"#!/bin/sh\necho hello\n");
    assert_eq!(e, LoadError::NotWasm);
    assert!(e.to_string().contains("not a WebAssembly binary"), "{e}");
    assert_eq!(refusal(b""), LoadError::NotWasm);
}

#[test]
fn a_core_module_is_refused_with_how_to_make_a_component() {
    let module = wat::parse_str("(module (func (export \"run\")))").unwrap();
    let e = refusal(&module);
    assert_eq!(e, LoadError::CoreModule);
    assert!(e.to_string().contains("wasm32-wasip2"), "{e}");
}

#[test]
fn a_truncated_component_is_invalid() {
    let bytes = std::fs::read(example("greeter")).unwrap();
    let e = refusal(&bytes[..bytes.len() / 2]);
    assert!(matches!(e, LoadError::Invalid(_)), "{e:?}");
    assert!(e.to_string().starts_with("invalid component: "), "{e}");
}

#[test]
fn imports_the_host_does_not_provide_are_each_named() {
    let component = wat::parse_str(
        r#"(component
            (import "wasi:http/incoming-handler@0.2.0" (instance))
            (import "wasi:io/streams@0.2.0" (instance))
            (import "acme:vault/secrets@1.0.0" (instance))
        )"#,
    )
    .unwrap();
    let e = refusal(&component);
    assert_eq!(
        e,
        LoadError::UnsatisfiedImports(vec![
            "wasi:http/incoming-handler@0.2.0".into(),
            "acme:vault/secrets@1.0.0".into(),
        ])
    );
    assert!(
        e.to_string()
            .contains("`wasi:http/incoming-handler@0.2.0`, `acme:vault/secrets@1.0.0`"),
        "{e}"
    );
}

#[test]
fn an_import_of_the_right_name_but_wrong_type_is_a_link_error() {
    let component = wat::parse_str(
        r#"(component
            (import "corral:activity/context@0.1.0" (instance
                (export "info" (func (result u32)))
            ))
        )"#,
    )
    .unwrap();
    let e = refusal(&component);
    assert!(matches!(e, LoadError::Link(_)), "{e:?}");
    assert!(e.to_string().contains("info"), "{e}");
}

#[test]
fn a_component_without_usable_exports_is_refused_with_the_reasons() {
    assert!(matches!(
        refusal(&wat::parse_str("(component)").unwrap()),
        LoadError::NoActivities(_)
    ));
    let component = wat::parse_str(
        r#"(component
            (type $r (resource (rep i32)))
            (export $re "thing" (type $r))
            (core module $m (func (export "f") (param i32)))
            (core instance $i (instantiate $m))
            (func $f (param "t" (own $re)) (canon lift (core func $i "f")))
            (export "consume" (func $f))
        )"#,
    )
    .unwrap();
    let e = refusal(&component);
    let LoadError::NoActivities(unsupported) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(unsupported.len(), 1);
    assert_eq!(unsupported[0].name, "consume");
    assert!(
        e.to_string()
            .contains("`consume`: `own<resource>` cannot travel as JSON"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn compiled_code_is_cached_by_digest_and_survives_a_restart() {
    let cache = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(example("greeter")).unwrap();
    let first = TestHost::builder().cache_dir(cache.path()).build().unwrap();
    assert!(
        !first.load_bytes(&bytes).unwrap().loaded().from_cache,
        "compiled the first time"
    );
    assert!(first.load_bytes(&bytes).unwrap().loaded().from_cache);
    let cached: Vec<_> = std::fs::read_dir(cache.path()).unwrap().collect();
    assert_eq!(cached.len(), 1, "one artifact, no temporary files left");
    drop(first);

    // A new sandbox (as after a restart) reuses the artifact and runs it.
    let restarted = TestHost::builder().cache_dir(cache.path()).build().unwrap();
    let greeter = restarted.load_bytes(&bytes).unwrap();
    assert!(greeter.loaded().from_cache);
    let run = greeter
        .call("demo:greeter/api.greet")
        .args([
            json!({"name": "Ada", "language": "english"}),
            json!("formal"),
        ])
        .run()
        .await;
    assert_eq!(run.expect_ok()["message"], "Good day, Ada!");
}

#[test]
fn a_corrupt_cache_entry_is_recompiled_not_trusted() {
    let cache = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(example("greeter")).unwrap();
    let host = TestHost::builder().cache_dir(cache.path()).build().unwrap();
    host.load_bytes(&bytes).unwrap();
    let entry = std::fs::read_dir(cache.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(&entry, b"garbage").unwrap();
    let reloaded = TestHost::builder().cache_dir(cache.path()).build().unwrap();
    let greeter = reloaded.load_bytes(&bytes).unwrap();
    assert!(!greeter.loaded().from_cache);
    assert!(
        reloaded.load_bytes(&bytes).unwrap().loaded().from_cache,
        "the entry was rewritten"
    );
}

#[test]
fn a_bad_tenant_policy_is_refused_before_any_task() {
    let missing = host()
        .dir(
            "/no/such/directory",
            "/data",
            corral_core::sandbox::DirMode::ReadOnly,
        )
        .build();
    let e = missing.err().unwrap().to_string();
    assert!(e.contains("/no/such/directory"), "{e}");
    let huge = host().memory(64 << 30).build().err().unwrap().to_string();
    assert!(
        huge.contains("memory limit 64 GiB is above the host's maximum of 1 GiB"),
        "{huge}"
    );
}

/// Tenants loading the same bytes share one compiled component (code
/// mapped once, one memory image): without a compile cache, a second load
/// while the first is in use compiles nothing; once neither is in use, the
/// next load compiles again.
#[test]
fn the_same_bytes_loaded_twice_share_one_compiled_component() {
    let bytes = std::fs::read(example("greeter")).unwrap();
    let host = TestHost::builder().build().unwrap();
    let first = host.load_bytes(&bytes).unwrap();
    assert!(!first.loaded().from_cache, "compiled the first time");
    let second = host.load_bytes(&bytes).unwrap();
    assert!(second.loaded().from_cache, "shared, not compiled again");
    drop((first, second));
    assert!(
        !host.load_bytes(&bytes).unwrap().loaded().from_cache,
        "nothing held it any more"
    );
}
