//! Registry credentials against a real registry that demands a password
//! (`docker-registry` with htpasswd): the CLI's from its environment, a
//! host's and a tenant's from a variable or a file named in the
//! configuration. A wrong or missing password is refused naming the
//! reference; no password ever reaches a log line.

mod common;

use std::process::{Command, Output};

use common::activities::text;
use common::admin::Host;
use common::example;
use common::registry::Registry;

const PASSWORD: &str = "correct-horse-battery";

fn corral(args: &[&str], password: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_corral"));
    command
        .args(args)
        .env_remove("CORRAL_REGISTRY_USERNAME")
        .env_remove("CORRAL_REGISTRY_PASSWORD");
    if let Some(password) = password {
        command
            .env("CORRAL_REGISTRY_USERNAME", "alice")
            .env("CORRAL_REGISTRY_PASSWORD", password);
    }
    command.output().expect("corral runs")
}

#[test]
fn credentials_come_from_the_environment_or_a_file_and_wrong_ones_are_refused() {
    let registry = Registry::start_with_auth("alice", PASSWORD);
    let host_port = registry.host();
    let reference = format!("oci://{host_port}/acme/progress:1.0");
    let progress = example("progress");
    let insecure = ["--insecure-registry", host_port.as_str()];

    let push = |password| {
        let mut args = vec!["push", progress.to_str().unwrap(), reference.as_str()];
        args.extend(insecure);
        corral(&args, password)
    };
    for password in [None, Some("wrong")] {
        let out = push(password);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(
            text(&out).contains(&format!(
                "the registry refused the credentials for {reference}"
            )),
            "{}",
            text(&out)
        );
    }
    let out = push(Some(PASSWORD));
    assert!(out.status.success(), "{}", text(&out));
    let out = corral(
        &["inspect", &reference, insecure[0], insecure[1]],
        Some(PASSWORD),
    );
    assert!(out.status.success(), "{}", text(&out));

    // A host: alpha's credential from a file, beta none of its own.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("registry-password");
    std::fs::write(&file, format!("{PASSWORD}\n")).unwrap();
    let host = Host::new(&format!("insecure_registries = [{host_port:?}]"));
    let allowed = format!("registries = [\"{host_port}/acme\"]");
    let alpha = format!(
        "{allowed}\nregistry_credentials = {{ {host_port:?} = {{ username = \"alice\", password_file = {:?} }} }}",
        file.display().to_string()
    );
    let serving = host.serve([&alpha, &allowed]);
    let deployed = host.alpha(&["deploy", &reference, "--json"]);
    assert_eq!(
        deployed["labels"]["oci.reference"],
        reference.as_str(),
        "{deployed}"
    );
    let out = host.cli(&host.tokens[1].token, &["deploy", &reference]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("the registry refused the credentials"),
        "{}",
        text(&out)
    );
    assert!(!serving.stderr().contains(PASSWORD), "{}", serving.stderr());
    assert!(!serving.stdout().contains(PASSWORD));
}

#[test]
fn a_password_in_the_configuration_text_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("corral.toml");
    std::fs::write(
        &config,
        r#"
[host]
registry_credentials = { "registry.example.com" = { username = "alice", password = "hunter2" } }

[[tenant]]
name = "acme"
temporal = { address = "http://127.0.0.1:7233", task_queue = "acme" }
components = ["greeter.wasm"]
"#,
    )
    .unwrap();
    let out = corral(&["serve", "--config", config.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("a password is never read from the configuration"),
        "{}",
        text(&out)
    );
    assert!(!text(&out).contains("hunter2"), "{}", text(&out));
}
