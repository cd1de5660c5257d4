use super::*;

use std::time::Duration;

use corral_core::sandbox::{FailureClass, Limits};
use corral_core::share::{CpuMax, CpuShare};

mod reuse;

const GOOD: &str = r#"
    [host]
    max_concurrent = 8
    [[tenant]]
    name = "acme"
    temporal = { address = "http://127.0.0.1:7233", task_queue = "acme" }
    limits = { memory = "64MiB", timeout = "30s", max_concurrent = 4 }
    components = ["greeter.wasm"]
    aliases = { Greet = "demo:greeter/api.greet" }
    retry = { Trap = true }
"#;

fn error(text: &str) -> String {
    Config::parse(text, Path::new("/etc/corral"))
        .unwrap_err()
        .to_string()
}

#[test]
fn a_good_config_is_read_with_defaults_and_resolved_paths() {
    let config = Config::parse(GOOD, Path::new("/etc/corral")).unwrap();
    assert_eq!(config.host.max_concurrent, 8);
    assert_eq!(config.host.shutdown_grace, Duration::from_secs(30));
    let t = &config.tenants[0];
    assert_eq!(t.tenant.limits.memory, 64 << 20);
    assert_eq!(t.tenant.limits.timeout, Some(Duration::from_secs(30)));
    assert_eq!(t.max_concurrent, 4);
    assert!(t.type_limits.is_empty());
    let Engine::Temporal(temporal) = &t.engine else {
        panic!("a Temporal tenant")
    };
    assert_eq!(temporal.namespace, "default");
    assert_eq!(temporal.compression, Compression::Gzip, "the SDK's default");
    let components: Vec<String> = t.components.iter().map(ToString::to_string).collect();
    assert_eq!(components, ["/etc/corral/greeter.wasm"]);
    assert_eq!(t.aliases["Greet"], "demo:greeter/api.greet");
    assert!(t.tenant.retry.retryable(FailureClass::Trap));
    assert_eq!(config.host.admin_listen, None);
    assert_eq!(config.host.max_upload, 64 << 20);
}

#[test]
fn temporal_pollers_default_to_five_and_are_bounded() {
    let Engine::Temporal(temporal) = &Config::parse(GOOD, Path::new("/etc/corral"))
        .unwrap()
        .tenants[0]
        .engine
    else {
        panic!("a Temporal tenant")
    };
    assert_eq!(temporal.pollers.get(), 5, "the Temporal SDKs' default");
    let with = |n: &str| {
        GOOD.replace(
            "task_queue = \"acme\" }",
            &format!("task_queue = \"acme\", pollers = {n} }}"),
        )
    };
    let one = Config::parse(&with("1"), Path::new("/etc/corral")).unwrap();
    let Engine::Temporal(temporal) = &one.tenants[0].engine else {
        panic!("a Temporal tenant")
    };
    assert_eq!(temporal.pollers.get(), 1);
    let zero = error(&with("0"));
    assert!(
        zero.contains("pollers") && zero.contains("nonzero"),
        "{zero}"
    );
    let many = error(&with("65"));
    assert!(
        many.contains("temporal.pollers") && many.contains("65 is more than the 64"),
        "{many}"
    );
}

#[test]
fn temporal_compression_is_gzip_or_none() {
    let none = GOOD.replace(
        "task_queue = \"acme\" }",
        "task_queue = \"acme\", compression = \"none\" }",
    );
    let config = Config::parse(&none, Path::new("/etc/corral")).unwrap();
    let Engine::Temporal(temporal) = &config.tenants[0].engine else {
        panic!("a Temporal tenant")
    };
    assert_eq!(temporal.compression, Compression::None);
    let bad = error(&none.replace("\"none\"", "\"zstd\""));
    assert!(
        bad.contains("unknown variant `zstd`, expected `gzip` or `none`"),
        "{bad}"
    );
}

#[test]
fn the_control_plane_keys_are_read() {
    let hash = "AB".repeat(32);
    let text = GOOD
        .replace(
            "max_concurrent = 8",
            &format!(
                "admin_listen = \"127.0.0.1:7466\"\ndata_dir = \"data\"\n\
                 metrics_listen = \"127.0.0.1:9466\"\noperator_token_sha256 = \"{hash}\"\n\
                 max_upload = \"8MiB\"\nlog_format = \"json\"\n\
                 admin_tls = {{ cert = \"c.pem\", key = \"k.pem\" }}"
            ),
        )
        .replace(
            "components = [\"greeter.wasm\"]",
            &format!("token_sha256 = \"{hash}\""),
        );
    let config = Config::parse(&text, Path::new("/etc/corral")).unwrap();
    let h = &config.host;
    assert_eq!(h.admin_listen, Some("127.0.0.1:7466".parse().unwrap()));
    assert_eq!(h.data_dir, Some(PathBuf::from("/etc/corral/data")));
    assert_eq!(h.metrics_listen, Some("127.0.0.1:9466".parse().unwrap()));
    assert_eq!(
        h.operator_token_sha256.map(|h| h.to_string()),
        Some("ab".repeat(32))
    );
    assert_eq!(h.max_upload, 8 << 20);
    assert!(h.log_json);
    assert_eq!(
        h.admin_tls.as_ref().unwrap().key,
        PathBuf::from("/etc/corral/k.pem")
    );
    assert!(config.tenants[0].components.is_empty(), "deployed later");
    assert_eq!(
        config.tenants[0].token_sha256.map(|h| h.to_string()),
        Some("ab".repeat(32))
    );
}

#[test]
fn registries_and_oci_components_are_checked_and_named_by_key() {
    let with = |line: &str| GOOD.replace("components = [", &format!("{line}\ncomponents = ["));
    let config = Config::parse(
        &with(r#"registries = ["registry.example.com/acme"]"#),
        Path::new("/etc/corral"),
    )
    .unwrap();
    assert_eq!(
        config.tenants[0].registries[0].to_string(),
        "registry.example.com/acme"
    );
    assert!(
        error(&with(r#"registries = ["https://registry.example.com"]"#))
            .contains("tenant[0] (`acme`).registries: `https://registry.example.com`")
    );
    let oci = GOOD.replace(
        "\"greeter.wasm\"",
        "\"oci://registry.example.com/acme/greeter:1.0\"",
    );
    let config = Config::parse(&oci, Path::new("/etc/corral")).unwrap();
    assert_eq!(
        config.tenants[0].components[0].to_string(),
        "oci://registry.example.com/acme/greeter:1.0"
    );
    assert!(
        error(&GOOD.replace("\"greeter.wasm\"", "\"oci://registry.example.com/acme/greeter\""))
            .contains("tenant[0] (`acme`).components: `oci://registry.example.com/acme/greeter` is not an OCI reference: it names no tag or digest")
    );
}

#[test]
fn errors_name_the_key() {
    assert!(
        error(&GOOD.replace("max_concurrent = 4", "max_concurrent = 0"))
            .contains("tenant[0] (`acme`).limits.max_concurrent: must be at least 1, got 0")
    );
    assert!(
        error(&GOOD.replace("\"64MiB\"", "\"64 parsecs\""))
            .contains("tenant[0] (`acme`).limits.memory")
    );
    assert!(
        error(&GOOD.replace("\"30s\"", "\"30\"")).contains("limits.timeout: `30` needs a unit")
    );
    assert!(
        error(&GOOD.replace("http://127.0.0.1:7233", "127.0.0.1:7233"))
            .contains("temporal.address")
    );
    assert!(
        error(&GOOD.replace(
            "max_concurrent = 4",
            "max_concurrent = 4, per_type = { Greet = 0 }"
        ))
        .contains("tenant[0] (`acme`).limits.per_type.Greet: must be at least 1, got 0")
    );
    assert!(
        error(&GOOD.replace(
            "max_concurrent = 4",
            "max_concurrent = 4, per_type = { Greet = 5 }"
        ))
        .contains("limits.per_type.Greet: 5 is above the tenant's max_concurrent of 4")
    );
    assert!(
        error(&GOOD.replace("Trap = true", "Oops = true"))
            .contains("`Oops` is not a failure class")
    );
    let unknown = error(&GOOD.replace("max_concurrent = 8", "max_concurent = 8"));
    assert!(
        unknown.contains("unknown field `max_concurent`"),
        "{unknown}"
    );
    assert!(
        error("[host]\nmax_concurrent = 0\n").contains("host.max_concurrent: must be at least 1")
    );
    assert!(error("[host]\nmax_compiles = 0\n").contains("host.max_compiles: must be at least 1"));
    let many = error(&GOOD.replace("max_concurrent = 8", "max_compiles = 65"));
    assert!(
        many.contains("host.max_compiles: must be at most 64, got 65"),
        "{many}"
    );
    assert_eq!(
        Config::parse(
            &GOOD.replace("max_concurrent = 8", "max_compiles = 4"),
            Path::new(".")
        )
        .unwrap()
        .host
        .max_compiles,
        4
    );
    for (setting, problem) in [
        (
            "cpu_weight = 0",
            "cpu_weight: must be a whole number from 1 to 10000, got 0",
        ),
        (
            "cpu_weight = 10001",
            "cpu_weight: must be a whole number from 1 to 10000, got 10001",
        ),
        (
            "cpu_max = 0",
            "cpu_max: must be from 0.01 to 1024 cores, got 0",
        ),
        (
            "cpu_max = -1.5",
            "cpu_max: must be from 0.01 to 1024 cores, got -1.5",
        ),
        (
            "cpu_max = \"half\"",
            "invalid type: string \"half\", expected f64",
        ),
    ] {
        let said = error(&GOOD.replace("name = \"acme\"", &format!("name = \"acme\"\n{setting}")));
        assert!(said.contains(problem), "{setting}: {said}");
    }
    let cpu = |extra: &str| {
        Config::parse(
            &GOOD.replace("name = \"acme\"", &format!("name = \"acme\"\n{extra}")),
            Path::new("."),
        )
        .unwrap()
        .tenants[0]
            .tenant
            .cpu
    };
    assert_eq!(cpu(""), CpuShare::default());
    let set = cpu("cpu_weight = 300\ncpu_max = 1");
    assert_eq!(set.weight.get(), 300);
    assert_eq!(set.max.map(CpuMax::millicores), Some(1000));
    assert_eq!(cpu("cpu_max = 0.25").max.map(CpuMax::millicores), Some(250));
    assert!(error("").contains("no [[tenant]]"));
    assert!(
        error(&GOOD.replace("max_concurrent = 8", "admin_listen = \"127.0.0.1:7466\""))
            .contains("host.data_dir: required with host.admin_listen")
    );
    assert!(
        error(&GOOD.replace("max_concurrent = 8", "admin_listen = \"localhost\""))
            .contains("host.admin_listen: `localhost` is not an address")
    );
    assert!(
        error(&GOOD.replace("name = \"acme\"", "name = \"acme\"\ntoken_sha256 = \"abc\""))
            .contains("tenant[0] (`acme`).token_sha256: `abc` is not a hex SHA-256")
    );
    assert!(
        error(&GOOD.replace("max_concurrent = 8", "log_format = \"xml\""))
            .contains("host.log_format: `xml` is not text or json")
    );
    assert!(
        error(&GOOD.replace("components = [\"greeter.wasm\"]", ""))
            .contains("no component to serve (list some, follow a tag, or set host.admin_listen")
    );
    assert!(error(&format!("{GOOD}\n[[tenant]]\nname = \"acme\"\n")).contains("configured twice"));
}

#[test]
fn a_tenant_serves_either_engine_and_names_the_aion_keys() {
    let aion = GOOD.replace(
        "temporal = { address = \"http://127.0.0.1:7233\", task_queue = \"acme\" }",
        "aion = { address = \"127.0.0.1:50051\", task_queue = \"acme\", node = \"eu-1\" }",
    );
    let config = Config::parse(&aion, Path::new("/etc/corral")).unwrap();
    assert_eq!(
        config.tenants[0].engine,
        Engine::Aion(AionBinding {
            address: "http://127.0.0.1:50051".into(),
            namespace: "default".into(),
            task_queue: "acme".into(),
            node: "eu-1".into(),
        })
    );
    let both = GOOD.replace(
        "name = \"acme\"",
        "name = \"acme\"\naion = { address = \"127.0.0.1:50051\" }",
    );
    assert!(error(&both).contains("tenant[0] (`acme`).aion: a tenant serves one engine"));
    let neither = GOOD.replace(
        "temporal = { address = \"http://127.0.0.1:7233\", task_queue = \"acme\" }",
        "",
    );
    assert!(error(&neither).contains("`temporal = {…}` or `aion = {…}`"));
    assert!(
        error(&aion.replace("127.0.0.1:50051", "not an address"))
            .contains("tenant[0] (`acme`).aion.address: `not an address` is not an address")
    );
    assert!(
        error(&aion.replace("task_queue = \"acme\"", "task_queue = \"\""))
            .contains("aion.task_queue: must not be empty")
    );
    assert!(error(&aion.replace("node =", "nod =")).contains("unknown field `nod`"));
    let http = GOOD.replace(
        "retry = { Trap = true }",
        "capabilities = { http_hosts = [\"api.example.com\", \"http://x\"] }",
    );
    assert!(
        error(&http)
            .contains("tenant[0] (`acme`).capabilities.http_hosts[1]: `http://x` is not a host"),
        "{}",
        error(&http)
    );
}

#[test]
fn a_plaintext_admin_api_beyond_loopback_needs_the_operator_to_say_so() {
    let with = |host: &str| {
        GOOD.replace(
            "[host]\n    max_concurrent = 8",
            &format!("[host]\n    max_concurrent = 8\n    data_dir = \"data\"\n    {host}"),
        )
    };
    let open = with(r#"admin_listen = "0.0.0.0:7466""#);
    let e = Config::parse(&open, Path::new("/etc/corral"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("host.admin_listen: 0.0.0.0:7466"), "{e}");
    assert!(
        e.contains("host.admin_tls") && e.contains("admin_plaintext"),
        "{e}"
    );
    let said_so = with("admin_listen = \"0.0.0.0:7466\"\n    admin_plaintext = true");
    assert!(Config::parse(&said_so, Path::new("/etc/corral")).is_ok());
    let loopback = with(r#"admin_listen = "127.0.0.1:7466""#);
    assert!(Config::parse(&loopback, Path::new("/etc/corral")).is_ok());
}

#[test]
fn max_http_bytes_is_a_byte_size() {
    let text = GOOD.replace(
        "max_concurrent = 4 }",
        "max_concurrent = 4, max_http_bytes = \"2MiB\" }",
    );
    let config = Config::parse(&text, Path::new("/etc/corral")).unwrap();
    assert_eq!(config.tenants[0].tenant.limits.max_http_bytes, 2 << 20);
    let text = GOOD.replace(
        "max_concurrent = 4 }",
        "max_concurrent = 4, max_http_bytes = \"lots\" }",
    );
    let e = error(&text);
    assert!(
        e.contains("limits.max_http_bytes: `lots` is not a byte size"),
        "{e}"
    );
}

#[test]
fn max_handles_is_read_and_must_be_positive() {
    let text = GOOD.replace(
        "max_concurrent = 4 }",
        "max_concurrent = 4, max_handles = 64 }",
    );
    let config = Config::parse(&text, Path::new("/etc/corral")).unwrap();
    assert_eq!(config.tenants[0].tenant.limits.max_handles, 64);
    let text = GOOD.replace(
        "max_concurrent = 4 }",
        "max_concurrent = 4, max_handles = 0 }",
    );
    let e = error(&text);
    assert!(
        e.contains("limits.max_handles: must be at least 1, got 0"),
        "{e}"
    );
}

#[test]
fn secrets_config_and_egress_rules_are_checked_and_named_by_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pay.key"), "sk_test_0123456789\n").unwrap();
    let with = |extra: &str| GOOD.replace("retry = { Trap = true }", extra);
    let good = with(
        r#"config = { region = "eu" }
secrets = { PAY_KEY = { file = "pay.key", hosts = ["api.stripe.com"] } }
capabilities = { http_hosts = ["a.example", { host = "api.stripe.com", methods = ["POST"], paths = ["/v1/charges"] }] }"#,
    );
    let config = Config::parse(&good, dir.path()).unwrap();
    let caps = &config.tenants[0].tenant.capabilities;
    assert_eq!(caps.config.get("region").map(String::as_str), Some("eu"));
    assert_eq!(
        caps.http_hosts
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["a.example", "api.stripe.com methods POST paths /v1/charges"]
    );
    assert_eq!(
        caps.secrets.placeholders().collect::<Vec<_>>(),
        [("PAY_KEY", "corral-secret:PAY_KEY")]
    );

    let problem = |extra: &str| match Config::parse(&with(extra), dir.path()) {
        Ok(_) => panic!("accepted: {extra}"),
        Err(e) => e.to_string(),
    };
    // A value in the text is refused without being quoted.
    let e = problem(r#"secrets = { K = { value = "sk_live_in_the_file", hosts = ["a"] } }"#);
    assert!(
        e.contains("secrets.K.value: a secret's value is never read from the configuration"),
        "{e}"
    );
    assert!(!e.contains("sk_live_in_the_file"), "{e}");
    // So is a value written in place of its source, as a string or in
    // dotted form.
    for written in [
        r#"secrets = { K = "sk_live_in_the_file" }"#,
        r#"secrets.K = "sk_live_in_the_file""#,
        r#"secrets = { K = ["sk_live_in_the_file"] }"#,
    ] {
        let e = problem(written);
        assert!(
            e.contains("secrets.K: a secret's value is never written in the configuration"),
            "{written}: {e}"
        );
        assert!(!e.contains("sk_live_in_the_file"), "{written}: {e}");
    }
    // Nor is it quoted where the text is not TOML, or `secrets` not a
    // table: an error names the line, not what it holds.
    for written in [
        r#"secrets.K = sk_live_in_the_file"#,
        r#"secrets = "sk_live_in_the_file""#,
    ] {
        let e = problem(written);
        assert!(e.contains("line "), "{written}: {e}");
        assert!(!e.contains("sk_live_in_the_file"), "{written}: {e}");
    }
    let e = problem(r#"secrets = { K = { file = "pay.key", env = "X", hosts = ["a"] } }"#);
    assert!(e.contains("secrets.K: give exactly one of env"), "{e}");
    let e = problem(r#"secrets = { K = { file = "missing.key", hosts = ["a"] } }"#);
    assert!(
        e.contains("secret `K`: file") && e.contains("missing.key"),
        "{e}"
    );
    let e = problem(r#"secrets = { K = { file = "pay.key" } }"#);
    assert!(e.contains("names no host"), "{e}");
    let e = problem(
        r#"secrets = { K = { file = "pay.key", hosts = ["a"] } }
config = { K = "x" }"#,
    );
    assert!(e.contains("would hide the config key `K`"), "{e}");
    let e = problem(r#"capabilities = { http_hosts = [{ host = "a", method = ["GET"] }] }"#);
    assert!(
        e.contains("capabilities.http_hosts[0]: unknown field `method`"),
        "{e}"
    );
    let e = problem(r#"capabilities = { http_hosts = [{ host = "a", paths = ["/a/../b"] }] }"#);
    assert!(e.contains("path `/a/../b` must start with `/`"), "{e}");
    let e = problem(r#"capabilities = { http_hosts = [7] }"#);
    assert!(e.contains("a grant is a host"), "{e}");
}

/// The first ```toml block of a document.
fn first_toml_block(doc: &str) -> &str {
    let start = doc.find("```toml\n").unwrap() + "```toml\n".len();
    &doc[start..start + doc[start..].find("```").unwrap()]
}

/// The README's configuration reads as it says (with a real token hash in
/// place of its `…`).
#[test]
fn the_readme_configuration_is_valid() {
    let readme = include_str!("../../../../../README.md");
    let block = first_toml_block(&readme[readme.find("## Serve activities").unwrap()..]);
    let text = block.replace(
        "token_sha256 = \"…\"",
        &format!("token_sha256 = \"{}\"", "ab".repeat(32)),
    );
    let config = Config::parse(&text, Path::new("/etc/corral")).unwrap();
    let acme = &config.tenants[0];
    assert_eq!(acme.tenant.name, "acme");
    assert_eq!(acme.max_concurrent, 16);
    assert!(acme.token_sha256.is_some());
    assert_eq!(
        acme.tenant.capabilities.http_hosts[0].to_string(),
        "api.example.com"
    );
    assert!(config.host.admin_listen.is_some());
}

/// The keyed-API page's configuration reads as it says.
#[test]
fn the_keyed_api_configuration_is_valid() {
    let block = first_toml_block(include_str!("../../../../../docs/keyed-apis.md"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pay.key"), "sk_test_0123456789").unwrap();
    let text = block.replace("/run/secrets/acme-pay.key", "pay.key");
    let config = Config::parse(&text, dir.path()).unwrap();
    assert_eq!(config.host.secret_refresh, Duration::from_secs(60));
    let tracing = config.host.tracing.as_ref().unwrap();
    assert_eq!(tracing.otlp_endpoint, "http://127.0.0.1:4317");
    let caps = &config.tenants[0].tenant.capabilities;
    assert_eq!(caps.config.get("currency").map(String::as_str), Some("EUR"));
    assert_eq!(
        caps.http_hosts[0].to_string(),
        "api.stripe.com methods POST paths /v1/charges"
    );
    assert_eq!(caps.secrets.specs().next().unwrap().name, "PAY_KEY");
}

#[test]
fn a_bad_trace_endpoint_or_secret_refresh_is_named() {
    let with = |host: &str| GOOD.replacen("[host]", &format!("[host]\n{host}"), 1);
    let problem = |host: &str| error(&with(host));
    let e = problem(r#"tracing = { otlp_endpoint = "127.0.0.1:4317" }"#);
    assert!(
        e.contains("host.tracing.otlp_endpoint: `127.0.0.1:4317` is not an OTLP/gRPC endpoint such as http://127.0.0.1:4317"),
        "{e}"
    );
    let e = problem(r#"tracing = { otlp_endpoint = "http://x:4317", sampler = "all" }"#);
    assert!(e.contains("unknown field `sampler`"), "{e}");
    let e = problem(r#"secret_refresh = "0s""#);
    assert!(e.contains("host.secret_refresh: must be above zero"), "{e}");
    let ok = Config::parse(
        &with(r#"tracing = { otlp_endpoint = "http://collector:4317" }"#),
        Path::new("/etc/corral"),
    )
    .unwrap();
    assert_eq!(ok.host.tracing.unwrap().service_name, "corral");
}

/// The defaults `docs/operating-safely.md` lists for a tenant are the ones
/// the code has (`Limits::default()`, `Quota::default()`), and a tenant that
/// sets no limit gets exactly them.
#[test]
fn the_documented_tenant_defaults_are_the_code_s() {
    use corral_core::sandbox::{parse_bytes, parse_duration};
    let doc = include_str!("../../../../../docs/operating-safely.md");
    let cell = |name: &str| -> String {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}`")))
            .unwrap_or_else(|| panic!("no row for `{name}`"));
        row.split('|').nth(2).unwrap().trim().replace(' ', "")
    };
    let bytes = |name: &str| parse_bytes(&cell(name)).unwrap();
    let secs = |name: &str| parse_duration(&cell(name)).unwrap();
    let count = |name: &str| cell(name).replace(',', "").parse::<u64>().unwrap();
    let d = Limits::default();
    assert_eq!(bytes("memory"), d.memory);
    assert_eq!(Some(secs("timeout")), d.timeout);
    assert_eq!(secs("cancel_grace"), d.cancel_grace);
    assert_eq!((cell("fuel").as_str(), d.fuel), ("none", None));
    assert_eq!(bytes("max_input"), d.max_input as u64);
    assert_eq!(bytes("max_output"), d.max_output as u64);
    assert_eq!(bytes("max_stdio"), d.max_stdio as u64);
    assert_eq!(count("max_handles"), d.max_handles as u64);
    assert_eq!(count("max_http_requests"), u64::from(d.max_http_requests));
    assert_eq!(bytes("max_http_bytes"), d.max_http_bytes);
    let quota = Quota::default();
    assert_eq!(
        cell("max_versions"),
        format!("{},{}", quota.versions, "1GiB"),
        "max_versions, max_stored"
    );
    assert_eq!(parse_bytes("1GiB").unwrap(), quota.bytes);

    let config = Config::parse(GOOD_WITHOUT_LIMITS, Path::new("/etc/corral")).unwrap();
    let tenant = &config.tenants[0];
    assert_eq!(tenant.tenant.limits, d);
    assert_eq!(tenant.quota.versions, quota.versions);
    assert_eq!(tenant.quota.bytes, quota.bytes);
}

const GOOD_WITHOUT_LIMITS: &str = r#"
[[tenant]]
name = "acme"
temporal = { address = "http://127.0.0.1:7233", task_queue = "acme" }
components = ["greeter.wasm"]
"#;
