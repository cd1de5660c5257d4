//! Deny by default: no state survives between tasks, the guest sees no host
//! environment, no file outside its grants, no socket.

mod common;

use corral_core::sandbox::{DirMode, FailureClass};
use serde_json::json;

use common::{host, load};

#[tokio::test(flavor = "multi_thread")]
async fn no_state_survives_between_two_tasks_of_one_component() {
    let host = host().build().unwrap();
    let m = load(&host, "misbehave");
    for _ in 0..3 {
        let run = m.call("demo:misbehave/api.counter").run().await;
        assert_eq!(
            run.expect_ok(),
            &json!(1),
            "every task gets a fresh instance"
        );
    }
    let greeter = load(&host, "greeter");
    for _ in 0..2 {
        let run = greeter
            .call("demo:greeter/api.greet")
            .args([json!({"name": "x", "language": "english"}), json!("casual")])
            .run()
            .await;
        assert_eq!(run.expect_ok()["calls-in-instance"], 1);
    }
}

/// Each language's `remember` keeps its text, with 4 MiB of ballast each
/// time, in module state (beyond what the pool keeps resident between
/// tasks); a task that saw another's memory would hold an earlier text. The
/// Rust guest also checks a fresh 4 MiB allocation, which its allocator
/// does not clear, for bytes another task wrote.
#[tokio::test(flavor = "multi_thread")]
async fn no_task_sees_memory_another_task_wrote_in_any_language() {
    let host = host().build().unwrap();
    for (file, activity) in [
        ("misbehave", "demo:misbehave/api.remember"),
        ("python-shout", "remember"),
        ("js-greeter", "demo:js-greeter/api.remember"),
    ] {
        let component = load(&host, file);
        for text in ["first", "second", "third"] {
            // Within one task, `remember` does remember: twice is two.
            let run = component
                .call(activity)
                .args([json!(text), json!(2)])
                .run()
                .await;
            assert_eq!(
                run.expect_ok(),
                &json!([text, text]),
                "{file}: a task held what an earlier task wrote"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_guest_sees_only_the_environment_it_was_given() {
    // The host process has a rich environment (PATH,
    // HOME, CARGO_*); none of it may leak.
    assert!(std::env::var_os("PATH").is_some());
    let bare = host().build().unwrap();
    let run = load(&bare, "misbehave")
        .call("demo:misbehave/api.environment")
        .run()
        .await;
    assert_eq!(run.expect_ok(), &json!([]));

    let granted = host().env("REGION", "eu").build().unwrap();
    let run = load(&granted, "misbehave")
        .call("demo:misbehave/api.environment")
        .run()
        .await;
    assert_eq!(run.expect_ok(), &json!([["REGION", "eu"]]));
}

#[tokio::test(flavor = "multi_thread")]
async fn no_file_is_reachable_without_a_grant() {
    let host = host().build().unwrap();
    let m = load(&host, "misbehave");
    for path in [
        "/etc/passwd",
        "etc/passwd",
        "../../../../etc/passwd",
        "/",
        ".",
    ] {
        let run = m
            .call("demo:misbehave/api.read-file")
            .arg(json!(path))
            .run()
            .await;
        let f = run.expect_failure(FailureClass::Application);
        assert!(f.details.is_some(), "{path}: {f}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_granted_directory_is_readable_and_nothing_beyond_it() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "top secret").unwrap();
    let granted = outside.path().join("granted");
    std::fs::create_dir(&granted).unwrap();
    std::fs::write(granted.join("hello.txt"), "hello from the host").unwrap();
    std::fs::create_dir(granted.join("sub")).unwrap();

    let host = host()
        .dir(&granted, "/data", DirMode::ReadOnly)
        .build()
        .unwrap();
    let files = load(&host, "files");
    let run = files
        .call("demo:files/api.read")
        .arg(json!("/data/hello.txt"))
        .run()
        .await;
    assert_eq!(run.expect_ok(), &json!("hello from the host"));
    let run = files
        .call("demo:files/api.list-dir")
        .arg(json!("/data"))
        .run()
        .await;
    assert_eq!(run.expect_ok(), &json!(["hello.txt", "sub"]));

    let secret = outside.path().join("secret.txt").display().to_string();
    for escape in [
        "/data/../secret.txt",
        "/data/sub/../../secret.txt",
        secret.as_str(),
    ] {
        let run = files
            .call("demo:files/api.read")
            .arg(json!(escape))
            .run()
            .await;
        let f = run.expect_failure(FailureClass::Application);
        assert!(!f.message.contains("top secret"), "{escape}: {f}");
        assert!(
            ["NotFound", "Denied", "Io"].contains(&f.kind.as_str()),
            "{escape}: {f}"
        );
    }

    // Read-only means read-only.
    let run = files
        .call("demo:files/api.write")
        .args([json!("/data/new.txt"), json!("x")])
        .run()
        .await;
    run.expect_failure(FailureClass::Application);
    assert!(!granted.join("new.txt").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_write_grant_allows_writing_inside_it_only() {
    let dir = tempfile::tempdir().unwrap();
    let host = host()
        .dir(dir.path(), "/out", DirMode::ReadWrite)
        .build()
        .unwrap();
    let files = load(&host, "files");
    let run = files
        .call("demo:files/api.write")
        .args([json!("/out/result.txt"), json!("42")])
        .run()
        .await;
    run.expect_ok();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("result.txt")).unwrap(),
        "42"
    );
    let run = files
        .call("demo:files/api.write")
        .args([json!("/out/../escaped.txt"), json!("x")])
        .run()
        .await;
    run.expect_failure(FailureClass::Application);
    assert!(!dir.path().parent().unwrap().join("escaped.txt").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn no_socket_can_be_opened_and_no_name_resolved() {
    // A real listener the guest would reach if sockets were allowed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let host = host().build().unwrap();
    let m = load(&host, "misbehave");
    let run = m
        .call("demo:misbehave/api.connect")
        .arg(json!(address))
        .run()
        .await;
    let f = run.expect_failure(FailureClass::Application);
    assert!(f.message.to_lowercase().contains("denied"), "{f}");
    listener.set_nonblocking(true).unwrap();
    assert!(
        listener.accept().is_err(),
        "no connection reached the listener"
    );

    let run = m
        .call("demo:misbehave/api.resolve")
        .arg(json!("localhost"))
        .run()
        .await;
    run.expect_failure(FailureClass::Application);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grant_is_the_directory_opened_at_start_even_once_moved_or_removed() {
    let root = tempfile::tempdir().unwrap();
    let granted = root.path().join("granted");
    std::fs::create_dir(&granted).unwrap();
    std::fs::write(granted.join("note.txt"), "the granted note").unwrap();
    let host = host()
        .dir(&granted, "/data", DirMode::ReadOnly)
        .build()
        .unwrap();
    let files = load(&host, "files");
    let read = || {
        files
            .call("demo:files/api.read")
            .arg(json!("/data/note.txt"))
    };

    // Moved away, and another directory put at its path: the guest still
    // reads the directory it was granted, not whatever the path names now.
    let moved = root.path().join("moved");
    std::fs::rename(&granted, &moved).unwrap();
    std::fs::create_dir(&granted).unwrap();
    std::fs::write(granted.join("note.txt"), "an impostor").unwrap();
    assert_eq!(read().run().await.expect_ok(), &json!("the granted note"));

    // Removed: the guest's own I/O error, not a host failure mid-task.
    std::fs::remove_dir_all(&moved).unwrap();
    let run = read().run().await;
    let f = run.expect_failure(FailureClass::Application);
    assert_eq!(f.kind, "NotFound", "{f}");
}

/// A secret's value in bytes a guest returns (an API that echoed its key,
/// say) is redacted before corral encodes them as base64, where no
/// redaction of the JSON could find it: in a result, and in an error.
#[tokio::test(flavor = "multi_thread")]
async fn a_secrets_value_in_bytes_a_guest_returns_is_redacted_before_they_are_encoded() {
    use base64::Engine as _;
    use corral_core::sandbox::{SecretSource, SecretSpec, Secrets};
    const VALUE: &str = "sk_live_0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("key");
    std::fs::write(&file, VALUE).unwrap();
    let secrets = Secrets::load(vec![SecretSpec {
        name: "PAY_KEY".into(),
        source: SecretSource::File(file),
        hosts: vec!["pay.example".parse().unwrap()],
        in_query: false,
    }])
    .unwrap();
    let host = host()
        .secrets(std::sync::Arc::new(secrets))
        .build()
        .unwrap();
    // `echoed` returns the bytes `charged with <key>`; `refused` fails with
    // them.
    let text = format!("charged with {VALUE}");
    let wat = format!(
        r#"(component
             (core module $m
               (memory (export "mem") 1)
               (data (i32.const 0) "\20\00\00\00\{len:02x}\00\00\00")
               (data (i32.const 8) "\01\00\00\00\20\00\00\00\{len:02x}\00\00\00")
               (data (i32.const 32) "{text}")
               (func (export "echoed") (result i32) i32.const 0)
               (func (export "refused") (result i32) i32.const 8))
             (core instance $i (instantiate $m))
             (func (export "echoed") (result (list u8))
               (canon lift (core func $i "echoed") (memory (core memory $i "mem"))))
             (func (export "refused") (result (result (list u8) (error (list u8))))
               (canon lift (core func $i "refused") (memory (core memory $i "mem")))))"#,
        len = text.len(),
    );
    let guest = host.load_bytes(&wat::parse_str(&wat).unwrap()).unwrap();
    let decoded = |value: &serde_json::Value| {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(value.as_str().unwrap())
            .unwrap();
        String::from_utf8(bytes).unwrap()
    };
    let run = guest.call("echoed").run().await;
    assert_eq!(decoded(run.expect_ok()), "charged with [secret PAY_KEY]");
    let run = guest.call("refused").run().await;
    let failure = run.expect_failure(FailureClass::Application);
    let details = failure.details.clone().unwrap_or_default();
    assert!(!failure.to_string().contains(VALUE), "{failure}");
    assert_eq!(
        decoded(&details),
        "charged with [secret PAY_KEY]",
        "{details}"
    );
}
