//! End to end against a real `aion server` (aion-cli 0.31.0) on loopback
//! ports: AWL workflows call WASM activities served by the real `corral`
//! binary over Aion's worker protocol.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::activities::text;
use common::aion::{AionServer, HEARTBEAT_WINDOW_MS, awl};
use common::example;
use common::processes::{Corral, free_port, sample, scrape, serve_to_exit};

/// The AWL types and actions that match the example components.
const CONTRACT: &str = r#"
type Person { name: String, title: String?, language: Language }
type Language = English | French | German
type Tone = Formal | Casual
type Greeting { message: String, attempt: Int }

worker corral
  action greet(who: Person, tone: Tone) -> Greeting
  action succeed_on_attempt(succeed_on: Int) -> Int
    retry 2 every 1s
  action fail(kind: String, retryable: Bool) -> Nil
    retry 2 every 1s
  action count_to(target: Int, step_ms: Int) -> Int
  action nap(ms: Int) -> Nil
"#;

/// A corral serving the examples to `server` under AWL-friendly aliases.
fn corral(server: &AionServer, max_concurrent: u32, metrics: u16) -> Corral {
    Corral::serve(&config(server, max_concurrent, metrics))
}

fn config(server: &AionServer, max_concurrent: u32, metrics: u16) -> String {
    let components: Vec<String> = ["greeter", "progress", "misbehave"]
        .iter()
        .map(|c| format!("{:?}", example(c).display().to_string()))
        .collect();
    format!(
        r#"
        [host]
        shutdown_grace = "10s"
        metrics_listen = "127.0.0.1:{metrics}"
        [[tenant]]
        name = "acme"
        aion = {{ address = "{}", task_queue = "corral" }}
        limits = {{ timeout = "60s", max_concurrent = {max_concurrent}, cancel_grace = "1s" }}
        components = [{}]
        [tenant.aliases]
        greet = "demo:greeter/api.greet"
        succeed_on_attempt = "demo:progress/api.succeed-on-attempt"
        count_to = "demo:progress/api.count-to"
        fail = "demo:misbehave/api.fail"
        nap = "demo:misbehave/api.sleep"
        "#,
        server.address(),
        components.join(", ")
    )
}

/// A workflow with one step calling `call`, returning its result.
fn workflow(dir: &Path, name: &str, inputs: &str, result: &str, call: &str) -> std::path::PathBuf {
    awl(
        dir,
        name,
        &format!(
            "//! A corral end-to-end test.\nworkflow {name}\n{inputs}  outcome done: type {result}, route success\n{CONTRACT}\n\
             step call\n  {call} -> reply\n  route done(reply)\n"
        ),
    )
}

fn outcomes(metrics: u16, activity: &str, outcome: &str) -> f64 {
    let series = format!(
        "corral_tasks_total{{tenant=\"acme\",activity_type=\"{activity}\",outcome=\"{outcome}\"}}"
    );
    sample(&scrape(metrics), &series).unwrap_or(0.0)
}

#[test]
fn awl_workflows_get_typed_results_and_failures_follow_the_retry_policy() {
    let server = AionServer::start();
    let dir = tempfile::tempdir().unwrap();
    let greet = workflow(
        dir.path(),
        "greet_one",
        "  input who: Person\n  input tone: Tone\n",
        "Greeting",
        "greet(who: who, tone: tone)",
    );
    let third = workflow(
        dir.path(),
        "third_time",
        "",
        "Int",
        "succeed_on_attempt(succeed_on: 3)",
    );
    let terminal = workflow(
        dir.path(),
        "terminal",
        "",
        "Nil",
        "fail(kind: \"Broken\", retryable: false)",
    );
    let flaky = workflow(
        dir.path(),
        "flaky",
        "",
        "Nil",
        "fail(kind: \"Flaky\", retryable: true)",
    );
    // Deployed first, so registering checks the components against them.
    deploy(&server, &[&greet, &third, &terminal, &flaky]);
    let metrics = free_port();
    let corral = corral(&server, 4, metrics);

    let (result, out) = server.run(
        &greet,
        r#"{"who": {"name": "Ada", "language": "French"}, "tone": "Formal"}"#,
    );
    assert!(out.status.success(), "{}\n{}", text(&out), corral.stderr());
    let greeting = &result.expect("a result document")["result"]["payload"];
    assert_eq!(greeting["message"], "Bonjour, Ada!", "{greeting}");
    assert_eq!(greeting["attempt"], 1, "{greeting}");

    // Retryable failures are retried by Aion's policy: the guest succeeds on
    // its third attempt and says which attempt that was.
    let (result, out) = server.run(&third, "{}");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(result.expect("a result document")["result"]["payload"], 3);
    assert_eq!(
        outcomes(
            metrics,
            "demo:progress/api.succeed-on-attempt",
            "Application"
        ),
        2.0
    );

    // A non-retryable failure fails the workflow at once.
    let (_, out) = server.run(&terminal, "{}");
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("Broken"), "{}", text(&out));
    assert_eq!(
        outcomes(metrics, "demo:misbehave/api.fail", "Application"),
        1.0
    );

    // A retryable one is attempted three times (`retry 2`), then fails.
    let (_, out) = server.run(&flaky, "{}");
    assert!(!out.status.success(), "{}", text(&out));
    assert_eq!(
        outcomes(metrics, "demo:misbehave/api.fail", "Application"),
        4.0
    );
}

#[test]
fn a_workflow_contract_the_component_contradicts_is_refused_by_name() {
    let server = AionServer::start();
    let dir = tempfile::tempdir().unwrap();
    // The workflow expects a field the greeter never returns.
    let wrong = awl(
        dir.path(),
        "wrong",
        &format!(
            "//! Expects more than the greeter gives.\nworkflow wrong\n  input who: Person\n  input tone: Tone\n  outcome done: type Reply, route success\n\
             type Reply {{ message: String, mood: String }}\n{}\n\
             step call\n  greet(who: who, tone: tone) -> reply\n  route done(reply)\n",
            CONTRACT.replace(
                "action greet(who: Person, tone: Tone) -> Greeting",
                "action greet(who: Person, tone: Tone) -> Reply"
            )
        ),
    );
    let out = server.cli(&["deploy", &wrong.display().to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    let config = dir.path().join("corral.toml");
    std::fs::write(&config, config_text(&server)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["serve", "--config", &config.display().to_string()])
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("refused to register task queue `corral`"),
        "{said}"
    );
    assert!(said.contains("mood"), "the refusal names the field: {said}");
}

fn config_text(server: &AionServer) -> String {
    config(server, 2, free_port())
}

#[test]
fn backpressure_liveness_and_cancellation() {
    let server = AionServer::start();
    let dir = tempfile::tempdir().unwrap();
    let nap = workflow(dir.path(), "nap", "  input ms: Int\n", "Nil", "nap(ms: ms)");
    let count = workflow(
        dir.path(),
        "count",
        "",
        "Int",
        "count_to(target: 16, step_ms: 1000)",
    );
    let long = workflow(
        dir.path(),
        "long",
        "",
        "Int",
        "count_to(target: 600, step_ms: 100)",
    );
    deploy(&server, &[&nap, &count, &long]);
    let metrics = free_port();
    let corral = corral(&server, 2, metrics);

    // Five workflows at once against a tenant limit of two.
    let runs: Vec<_> = (0..5)
        .map(|_| {
            let path = nap.clone();
            let endpoint = server.address();
            let home = server.home().to_owned();
            std::thread::spawn(move || {
                std::process::Command::new("aion")
                    .env("AION_HOME", home)
                    .args(["--endpoint", &endpoint, "run", &path.display().to_string()])
                    .args(["--input", r#"{"ms": 1500}"#, "--timeout", "120s"])
                    .output()
                    .unwrap()
            })
        })
        .collect();
    let mut most = 0.0f64;
    while !runs.iter().all(|r| r.is_finished()) {
        let now =
            sample(&scrape(metrics), "corral_tasks_in_flight{tenant=\"acme\"}").unwrap_or(0.0);
        most = most.max(now);
        std::thread::sleep(Duration::from_millis(50));
    }
    for run in runs {
        let out = run.join().unwrap();
        assert!(out.status.success(), "{}", text(&out));
    }
    assert_eq!(
        most, 2.0,
        "never more than the tenant's limit in flight, and the limit reached"
    );
    let completed = outcomes(metrics, "demo:misbehave/api.sleep", "Completed");
    assert_eq!(completed, 5.0, "{}", corral.stderr());

    // A heartbeating activity outlives several heartbeat windows.
    let started = Instant::now();
    let (result, out) = server.run(&count, "{}");
    assert!(out.status.success(), "{}\n{}", text(&out), corral.stderr());
    assert_eq!(result.expect("a result document")["result"]["payload"], 16);
    assert!(started.elapsed() > Duration::from_millis(3 * HEARTBEAT_WINDOW_MS));
    // So does one that never heartbeats itself: corral heartbeats for it.
    let (_, out) = server.run(&nap, &format!(r#"{{"ms": {}}}"#, 3 * HEARTBEAT_WINDOW_MS));
    assert!(out.status.success(), "{}\n{}", text(&out), corral.stderr());

    // A cancelled workflow's activity is cancelled in the guest.
    let id = start_workflow(&server, "long");
    let deadline = Instant::now() + Duration::from_secs(30);
    while sample(&scrape(metrics), "corral_tasks_in_flight{tenant=\"acme\"}") != Some(1.0) {
        assert!(Instant::now() < deadline, "the activity never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = server.cli(&["cancel", &id, "--reason", "test"]);
    assert!(out.status.success(), "{}", text(&out));
    let deadline = Instant::now() + Duration::from_secs(30);
    while outcomes(metrics, "demo:progress/api.count-to", "Cancelled") < 1.0 {
        assert!(
            Instant::now() < deadline,
            "not cancelled:\n{}",
            corral.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let described = settled(&server, &id, Duration::from_secs(30)).to_string();
    assert!(described.contains("Cancelled"), "{described}");
}

/// Polls `aion describe` until the workflow is no longer running.
fn settled(server: &AionServer, id: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let out = server.cli(&["describe", id]);
        let described: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if out.status.success() && described["summary"]["status"] != "Running" {
            return described;
        }
        assert!(Instant::now() < deadline, "still running: {}", text(&out));
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn deploy(server: &AionServer, workflows: &[&Path]) {
    for awl in workflows {
        let out = server.cli(&["deploy", &awl.display().to_string()]);
        assert!(out.status.success(), "{}", text(&out));
    }
}

fn start_workflow(server: &AionServer, name: &str) -> String {
    let out = server.cli(&["start", name, "--input", "{}"]);
    assert!(out.status.success(), "{}", text(&out));
    let started: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    started["workflow_id"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no workflow id: {}", text(&out)))
}

#[test]
fn a_drained_and_restarted_server_still_gets_the_result() {
    let home = tempfile::tempdir().unwrap();
    let (grpc, http) = (free_port(), free_port());
    let mut server = AionServer::start_in(home.path(), grpc, http);
    let dir = tempfile::tempdir().unwrap();
    let count = workflow(
        dir.path(),
        "count_on",
        "",
        "Int",
        "count_to(target: 12, step_ms: 500)",
    );
    deploy(&server, &[&count]);
    let metrics = free_port();
    let corral = corral(&server, 2, metrics);
    let id = start_workflow(&server, "count_on");
    let deadline = Instant::now() + Duration::from_secs(30);
    while sample(&scrape(metrics), "corral_tasks_in_flight{tenant=\"acme\"}") != Some(1.0) {
        assert!(Instant::now() < deadline, "the activity never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    // SIGTERM: the server drains its workers and exits; the guest runs on.
    server.stop();
    std::thread::sleep(Duration::from_secs(1));
    let server = AionServer::start_in(home.path(), grpc, http);
    let described = settled(&server, &id, Duration::from_secs(90));
    assert_eq!(
        described["summary"]["status"],
        "Completed",
        "{described}\ncorral:\n{}",
        corral.stderr()
    );
    // The attempt that ran through the drain was reported to the draining
    // server and acknowledged before corral closed the stream; Aion 0.31
    // may still dispatch the activity again after its restart (its
    // acknowledgement is not a durability receipt): at least once, never
    // lost.
    let log = corral.stderr();
    let drained = log
        .find("drained: everything reported")
        .unwrap_or_else(|| panic!("{log}"));
    let first = log
        .find("activity_type=count_to activity_id=0 attempt=1}: corral_core::session::task: completed")
        .unwrap_or_else(|| panic!("{log}"));
    assert!(first < drained, "{log}");
    assert!(outcomes(metrics, "demo:progress/api.count-to", "Completed") >= 1.0);
}

#[test]
fn one_host_serves_a_temporal_tenant_and_an_aion_tenant_at_once() {
    use common::activities::{execute, unique};
    use common::temporal::TemporalServer;

    let aion = AionServer::start();
    let temporal = TemporalServer::start();
    let dir = tempfile::tempdir().unwrap();
    let greet = awl(
        dir.path(),
        "greet_mixed",
        "//! Greets through corral's Aion tenant.\nworkflow greet_mixed\n  input who: Person\n  input tone: Tone\n  outcome done: type Greeting, route success\n\
         type Person { name: String, title: String?, language: Language }\n\
         type Language = English | French | German\n\
         type Tone = Formal | Casual\n\
         type Greeting { message: String, attempt: Int }\n\
         worker corral\n  action greet(who: Person, tone: Tone) -> Greeting\n\
         step call\n  greet(who: who, tone: tone) -> reply\n  route done(reply)\n",
    );
    deploy(&aion, &[&greet]);
    let queue = unique("mixed");
    let greeter = format!("{:?}", example("greeter").display().to_string());
    let corral = Corral::serve(&format!(
        r#"
        [[tenant]]
        name = "on-temporal"
        temporal = {{ address = "http://{}", task_queue = "{queue}" }}
        components = [{greeter}]
        aliases = {{ Greet = "demo:greeter/api.greet" }}
        [[tenant]]
        name = "on-aion"
        aion = {{ address = "{}", task_queue = "corral" }}
        components = [{greeter}]
        aliases = {{ greet = "demo:greeter/api.greet" }}
        "#,
        temporal.address(),
        aion.address()
    ));
    let (_, greeting) = execute(
        &temporal,
        &queue,
        "Greet",
        &[r#"{"name": "Grace", "language": "english"}"#, r#""casual""#],
        &[],
    );
    assert_eq!(
        greeting["status"],
        "COMPLETED",
        "{greeting}\n{}",
        corral.stderr()
    );
    assert!(
        greeting["result"].to_string().contains("Grace"),
        "{greeting}"
    );

    let (result, out) = aion.run(
        &greet,
        r#"{"who": {"name": "Ada", "language": "German"}, "tone": "Casual"}"#,
    );
    assert!(out.status.success(), "{}\n{}", text(&out), corral.stderr());
    assert_eq!(
        result.expect("a result document")["result"]["payload"]["message"],
        "Hallo, Ada!"
    );
}

#[test]
fn a_deploy_while_serving_registers_the_new_activity_types_with_aion() {
    use common::admin::token;

    let server = AionServer::start();
    let data = tempfile::tempdir().unwrap();
    let admin = free_port();
    let acme = token();
    let greeter = format!("{:?}", example("greeter").display().to_string());
    let corral = Corral::serve(&format!(
        r#"
        [host]
        admin_listen = "127.0.0.1:{admin}"
        data_dir = {:?}
        [[tenant]]
        name = "acme"
        token_sha256 = "{}"
        aion = {{ address = "{}", task_queue = "corral" }}
        components = [{greeter}]
        aliases = {{ greet = "demo:greeter/api.greet" }}
        rollout = {{ shadow = {{ types = ["demo:progress/api.count-to"], min_agreement = 100 }} }}
        "#,
        data.path().display().to_string(),
        acme.sha256,
        server.address(),
    ));
    let acme_cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(args)
            .env("CORRAL_ENDPOINT", format!("http://127.0.0.1:{admin}"))
            .env("CORRAL_TOKEN", &acme.token)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice::<Value>(&out.stdout).unwrap_or_default()
    };
    let alias = "count_to=demo:progress/api.count-to";
    let progress = example("progress").display().to_string();
    acme_cli(&["deploy", &progress, "--alias", alias]);

    let dir = tempfile::tempdir().unwrap();
    let count = awl(
        dir.path(),
        "count_new",
        "//! Calls an activity type deployed while corral serves.\n\
         workflow count_new\n  outcome done: type Int, route success\n\
         worker corral\n  action count_to(target: Int, step_ms: Int) -> Int\n\
         step call\n  count_to(target: 3, step_ms: 10) -> reply\n  route done(reply)\n",
    );
    let (result, out) = server.run(&count, "{}");
    assert!(out.status.success(), "{}\n{}", text(&out), corral.stderr());
    assert_eq!(result.expect("a result document")["result"]["payload"], 3);
    assert_eq!(
        corral
            .stderr()
            .matches("registered with the Aion server")
            .count(),
        2,
        "registered again after the deploy:\n{}",
        corral.stderr()
    );

    // Shadow replay through Aion: the attempt was recorded, and the same
    // code rebuilt (a custom section more) replays it and agrees.
    let status = acme_cli(&["status", "--json"]);
    assert_eq!(
        status["tenants"][0]["recorded"][0]["attempts"], 1,
        "{status}"
    );
    let mut rebuilt = std::fs::read(example("progress")).unwrap();
    rebuilt.extend_from_slice(&[0, 8, 7]);
    rebuilt.extend_from_slice(b"rebuilt");
    let rebuilt_file = dir.path().join("progress.wasm");
    std::fs::write(&rebuilt_file, &rebuilt).unwrap();
    let rebuilt_file = rebuilt_file.display().to_string();
    let deployed = acme_cli(&["deploy", &rebuilt_file, "--alias", alias, "--json"]);
    let replayed = &deployed["changes"]["replayed"][0];
    assert_eq!(replayed["name"], "demo:progress/api.count-to", "{deployed}");
    assert_eq!(
        (&replayed["replayed"], &replayed["agreed"]),
        (&Value::from(1), &Value::from(1)),
        "{deployed}"
    );
    assert_eq!(deployed["active"], true, "{deployed}");

    // A canary through Aion: another build takes every second task of the
    // type, and each side's outcomes are counted.
    let mut another = std::fs::read(example("progress")).unwrap();
    another.extend_from_slice(&[0, 8, 7]);
    another.extend_from_slice(b"another");
    let candidate_file = dir.path().join("candidate").join("progress.wasm");
    std::fs::create_dir_all(candidate_file.parent().unwrap()).unwrap();
    std::fs::write(&candidate_file, &another).unwrap();
    let candidate_file = candidate_file.display().to_string();
    let canary = acme_cli(&[
        "deploy",
        &candidate_file,
        "--alias",
        alias,
        "--canary",
        "50/1h",
        "--json",
    ]);
    assert_eq!(canary["canary_percent"], 50, "{canary}");
    for _ in 0..2 {
        let (result, out) = server.run(&count, "{}");
        assert!(out.status.success(), "{}\n{}", text(&out), corral.stderr());
        assert_eq!(result.expect("a result document")["result"]["payload"], 3);
    }
    let status = acme_cli(&["status", "--json"]);
    let split = &status["tenants"][0]["canaries"][0];
    assert_eq!(split["candidate"], canary["digest"], "{status}");
    assert_eq!(split["candidate_outcomes"]["Completed"], 1, "{status}");
    assert_eq!(split["active_outcomes"]["Completed"], 1, "{status}");
}

#[test]
fn an_unreachable_aion_server_is_named_at_start() {
    let greeter = format!("{:?}", example("greeter").display().to_string());
    let address = format!("127.0.0.1:{}", free_port());
    let out = serve_to_exit(&format!(
        "[host]\nconnect_timeout = \"1s\"\n[[tenant]]\nname = \"acme\"\n\
         aion = {{ address = \"{address}\" }}\ncomponents = [{greeter}]\n"
    ));
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains(&format!(
            "tenant `acme`: cannot reach the Aion server at http://{address} (is `aion server` running?)"
        )),
        "{said}"
    );
}
