//! Attacks from a registry a tenant controls, against `corral serve`: the
//! tenant's `registries` rule allows the registry, and the registry does
//! what it likes — points the host elsewhere (a redirect, a token realm, a
//! layer's URLs), sends a manifest without end or with twenty thousand
//! layers, drips a byte at a time, names a digest that is not one, answers
//! with an error page full of terminal escapes. Each asserts the bound, that
//! nothing reached a bystander, and that the host serves on.

mod common;

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::activities::text;
use common::admin::Host;
use common::http::{Head, loopback_server, recording_server, respond, respond_huge};
use common::processes::scrape;
use common::registry::Registry;

/// How late a deadline may be met on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(8);

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// A manifest of one wasm layer of `size` bytes, with `extra` fields in
/// the layer's descriptor.
fn manifest(layers: usize, extra: &str) -> String {
    let layer = format!(
        r#"{{"mediaType":"application/wasm","digest":"sha256:{}","size":10{extra}}}"#,
        "b".repeat(64)
    );
    format!(
        r#"{{"schemaVersion":2,"mediaType":"{MANIFEST_TYPE}","config":{{"mediaType":"application/vnd.wasm.config.v0+json","digest":"sha256:{}","size":2}},"layers":[{}]}}"#,
        "a".repeat(64),
        vec![layer; layers].join(",")
    )
}

/// A hostile registry on loopback: what it does depends on the repository
/// asked for; every other request (the `/v2/` ping) is answered 200.
fn hostile_registry(bystander: u16) -> u16 {
    loopback_server(move |head: &Head, _: &mut BufReader<&TcpStream>, stream| {
        let target = head.target();
        let manifest_of =
            |repository: &str| target.starts_with(&format!("/v2/acme/{repository}/manifests/"));
        if manifest_of("redirect") {
            let to = format!("http://127.0.0.1:{bystander}/stolen");
            respond(stream, "307 Temporary Redirect", &[("location", to)], b"");
        } else if manifest_of("urls") {
            let urls = format!(r#","urls":["http://127.0.0.1:{bystander}/blob"]"#);
            let body = manifest(1, &urls);
            respond(
                stream,
                "200 OK",
                &[("content-type", MANIFEST_TYPE.into())],
                body.as_bytes(),
            );
        } else if manifest_of("layers") {
            let body = manifest(20_000, "");
            respond(
                stream,
                "200 OK",
                &[("content-type", MANIFEST_TYPE.into())],
                body.as_bytes(),
            );
        } else if manifest_of("huge") {
            // 64 MiB of manifest, announced and sent.
            respond_huge(stream, MANIFEST_TYPE, 64);
        } else if manifest_of("errorpage") {
            let page = "\u{1b}[2J\u{1b}[31mFAKE corral: deployed\n".repeat(20_000);
            respond(stream, "500 Internal Server Error", &[], page.as_bytes());
        } else if manifest_of("slow") {
            // A byte every second, for as long as anyone listens.
            let mut stream = stream;
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n");
            while stream.write_all(b" ").is_ok() {
                std::thread::sleep(Duration::from_secs(1));
            }
        } else if target.contains("/baddigest/manifests/") {
            let forged = r#"sha256:"} 9 forged_sample{x="1"#.to_owned();
            respond(stream, "200 OK", &[("docker-content-digest", forged)], b"");
        } else {
            respond(stream, "200 OK", &[], b"");
        }
    })
}

/// A registry whose `/v2/` asks for a token from a realm elsewhere.
fn realm_registry(bystander: u16) -> u16 {
    loopback_server(move |_: &Head, _: &mut BufReader<&TcpStream>, stream| {
        let challenge = format!(
            r#"Bearer realm="http://127.0.0.1:{bystander}/token",service="evil",scope="repository:acme/x:pull""#
        );
        respond(
            stream,
            "401 Unauthorized",
            &[("www-authenticate", challenge)],
            b"",
        );
    })
}

/// A registry that asks for a token from itself and hands out a JWT whose
/// `exp` claim is three megabytes of text with terminal escapes: the
/// OCI client warned about it, quoting the claim whole.
fn token_registry() -> u16 {
    use base64::Engine as _;
    let b64 = |json: String| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json);
    let claims = serde_json::json!({
        "exp": format!("\u{1b}[2J\nWARN corral: FORGED {}", "A".repeat(3 << 20)),
    });
    let jwt = format!(
        "{}.{}.c2ln",
        b64(r#"{"alg":"HS256","typ":"JWT"}"#.to_owned()),
        b64(claims.to_string())
    );
    let token = serde_json::json!({ "token": jwt }).to_string();
    loopback_server(move |head: &Head, _: &mut BufReader<&TcpStream>, stream| {
        let authorized = head.headers.iter().any(|(name, _)| name == "authorization");
        let itself = head
            .headers
            .iter()
            .find(|(name, _)| name == "host")
            .map(|(_, host)| host.clone())
            .unwrap_or_default();
        if head.target().starts_with("/token") {
            let json = ("content-type", "application/json".to_owned());
            respond(stream, "200 OK", &[json], token.as_bytes());
        } else if authorized {
            respond(stream, "404 Not Found", &[], b"");
        } else {
            let challenge = format!(
                r#"Bearer realm="http://{itself}/token",service="evil",scope="repository:acme/x:pull""#
            );
            respond(
                stream,
                "401 Unauthorized",
                &[("www-authenticate", challenge)],
                b"",
            );
        }
    })
}

/// The longest line in `text`.
fn longest_line(text: &str) -> usize {
    text.lines().map(str::len).max().unwrap_or(0)
}

#[test]
fn every_byte_comes_from_a_host_a_rule_names_and_a_registry_cannot_flood_the_host() {
    let (bystander, arrived) = recording_server(|_| (200, vec![], "stolen".into()));
    let registry = hostile_registry(bystander);
    let realm = realm_registry(bystander);
    let hostile = format!("127.0.0.1:{registry}");
    let realm_host = format!("127.0.0.1:{realm}");
    let token_host = format!("127.0.0.1:{}", token_registry());
    let host = Host::new(&format!(
        "insecure_registries = [{hostile:?}, {realm_host:?}, {token_host:?}]\nregistry_deadline = \"4s\""
    ));
    let corral = host.serve([
        &format!("registries = [{hostile:?}, {realm_host:?}, {token_host:?}]"),
        "",
    ]);
    let deploy = |repository: &str, says: &str| -> String {
        let reference = match repository {
            "realm" => format!("oci://{realm_host}/acme/x:1"),
            "token" => format!("oci://{token_host}/acme/x:1"),
            _ => format!("oci://{hostile}/acme/{repository}:1"),
        };
        let started = Instant::now();
        let out = host.cli(&host.tokens[0].token, &["deploy", &reference]);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{repository}: {said}");
        assert!(said.contains(says), "{repository}: no `{says}` in {said}");
        assert!(
            started.elapsed() < Duration::from_secs(4) + SLACK,
            "{repository} took {:?}",
            started.elapsed()
        );
        said
    };
    let rss = || corral.status_kib("VmRSS");

    // Pointed elsewhere: refused, naming where, and nothing sent there.
    let elsewhere =
        format!("sent the host to 127.0.0.1:{bystander}, which no `registries` rule names");
    deploy("redirect", &elsewhere);
    deploy("realm", &elsewhere);
    deploy("urls", "its layer names URLs to fetch it from");
    assert!(
        arrived.recv_timeout(Duration::from_millis(200)).is_err(),
        "a request reached the bystander"
    );

    // A manifest without end: cut off near its bound, the host's memory
    // untouched (it was +110 MiB for this one).
    let before = rss();
    deploy("huge", "the registry sent more than the pull allows");
    let grown = rss().saturating_sub(before);
    eprintln!("a 64 MiB manifest grew the host by {grown} KiB");
    assert!(grown < 32 << 10, "the host grew by {grown} KiB");

    // Twenty thousand layers, an error page of escapes: bounded and
    // escaped, in the answer and in the host's log.
    let said = deploy("layers", "it has layers [application/wasm, ");
    assert!(said.contains("and 19995 more"), "{said}");
    assert!(said.len() < 2048, "{} bytes of error", said.len());
    let said = deploy("errorpage", "acme/errorpage:1");
    assert!(said.len() < 2048, "{} bytes of error", said.len());
    assert!(!said.contains('\u{1b}'), "{said}");
    assert!(!said.contains("\nFAKE"), "{said}");

    // A token the client cannot read, three megabytes of it: not quoted
    // in the host's log (checked with the rest below).
    deploy("token", "acme/x:1");

    // A byte a second: the pull's deadline ends it.
    let started = Instant::now();
    deploy("slow", "did not finish within 4s");
    eprintln!(
        "a registry dripping a byte a second was cut off after {:?}",
        started.elapsed()
    );

    let log = corral.stderr();
    assert!(
        longest_line(&log) < 4096,
        "a log line of {} bytes",
        longest_line(&log)
    );
    assert!(!log.contains('\u{1b}'), "escapes in the host's log");
    assert!(
        !log.contains("FORGED"),
        "the registry's token in the host's log"
    );
    let out = host.cli(&host.tokens[0].token, &["status", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_digest_a_registry_names_is_checked_before_metrics_show_it() {
    let (bystander, _) = recording_server(|_| (200, vec![], String::new()));
    let registry = hostile_registry(bystander);
    let hostile = format!("127.0.0.1:{registry}");
    let host = Host::new(&format!(
        "insecure_registries = [{hostile:?}]\nfollow_interval = \"1s\""
    ));
    let corral = host.serve([
        &format!(
            "registries = [{hostile:?}]\nfollow = [\"oci://{hostile}/acme/baddigest:stable\"]"
        ),
        "",
    ]);
    corral.await_logged("is not a sha256 digest", 1);
    let scraped = scrape(host.metrics());
    assert!(!scraped.contains("forged_sample"), "{scraped}");
    let follow: Vec<&str> = scraped
        .lines()
        .filter(|l| l.starts_with("corral_follow_info{"))
        .collect();
    assert_eq!(follow.len(), 1, "{scraped}");
    assert!(
        follow[0].contains(r#"wanted="""#) && follow[0].ends_with("} 1"),
        "{}",
        follow[0]
    );
}

#[test]
fn one_slow_registry_holds_up_no_other_tenants_roll_outs() {
    let (bystander, _) = recording_server(|_| (200, vec![], String::new()));
    let slow = format!("127.0.0.1:{}", hostile_registry(bystander));
    let good = Registry::start();
    let good_host = good.host();
    let versioned = common::example("versioned");
    let v2 = versioned.parent().unwrap().join("v2/versioned.wasm");
    let stable = format!("oci://{good_host}/acme/versioned:stable");
    good.push(&versioned, &stable);
    let host = Host::new(&format!(
        "insecure_registries = [{slow:?}, {good_host:?}]\nfollow_interval = \"1s\"\nregistry_deadline = \"120s\""
    ));
    // Alpha follows a tag on the registry that drips; beta one on a good
    // registry. The start waits 10 s at most for the first checks, not the
    // drip's 120 s.
    let starting = Instant::now();
    let corral = host.serve([
        &format!("registries = [{slow:?}]\nfollow = [\"oci://{slow}/acme/slow:stable\"]"),
        &format!("registries = [{good_host:?}]\nfollow = [{stable:?}]"),
    ]);
    let started = starting.elapsed();
    corral.await_logged("followed tags not all checked within 10s", 1);
    assert!(
        started < Duration::from_secs(10) + 2 * SLACK,
        "the start waited {started:?} for a registry that drips"
    );
    corral.await_logged(&format!("following {stable}: activated"), 1);
    // Beta's tag moves while alpha's check is stuck: beta rolls out.
    let moved = good.push(&v2, &stable);
    corral.await_logged(&format!("({moved})"), 1);
    assert!(
        !corral.stderr().contains("acme/slow:stable: oci://"),
        "alpha's check ended (its deadline is 120 s): {}",
        corral.stderr()
    );
}

#[test]
fn the_hosts_own_registry_password_never_goes_to_a_tenants_registry() {
    const PASSWORD: &str = "HostRegistryPassw0rd";
    // The tenant's registry asks for credentials and records what comes.
    let (registry, arrived) = recording_server(|_| {
        let challenge = (
            "www-authenticate".to_owned(),
            r#"Basic realm="tenant""#.to_owned(),
        );
        (401, vec![challenge], String::new())
    });
    let tenant_registry = format!("127.0.0.1:{registry}");
    let host = Host::new(&format!("insecure_registries = [{tenant_registry:?}]"));
    let config = host.config([&format!("registries = [{tenant_registry:?}]"), ""]);
    let _corral = common::processes::Corral::serve_with(
        &[
            ("CORRAL_REGISTRY_USERNAME", "hostbot"),
            ("CORRAL_REGISTRY_PASSWORD", PASSWORD),
        ],
        &config,
    );
    let reference = format!("oci://{tenant_registry}/acme/x:1");
    let out = host.cli(&host.tokens[0].token, &["deploy", &reference]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let mut asked = 0;
    while let Ok((head, _)) = arrived.recv_timeout(Duration::from_millis(200)) {
        asked += 1;
        let authorization = head.header("authorization").unwrap_or_default();
        assert!(
            authorization.is_empty(),
            "the tenant's registry got `{authorization}` (the host's own credential)"
        );
    }
    assert!(asked > 0, "the registry was never asked");
}

/// A registry whose connections are never accepted (its queue is full, as
/// a registry host drowning or dropping SYNs): each connection the pull
/// makes gives up within its 10 s, the deploy is refused naming where it
/// could not connect, long before the pull's whole deadline, and the host
/// serves on.
#[test]
fn a_registry_that_never_accepts_a_connection_fails_the_pull_at_its_connect_timeout() {
    use std::os::fd::AsRawFd as _;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    // SAFETY: listen on a socket this test owns, to shrink its queue.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
    let address = listener.local_addr().unwrap();
    // Connections that complete but are never accepted fill the queue;
    // from then on a connection's handshake gets no answer.
    let mut filling = Vec::new();
    loop {
        match TcpStream::connect_timeout(&address, Duration::from_millis(500)) {
            Ok(stream) => filling.push(stream),
            Err(_) => break,
        }
        assert!(filling.len() < 64, "the queue never filled");
    }
    let registry = address.to_string();
    let host = Host::new(&format!(
        "insecure_registries = [{registry:?}]\nregistry_deadline = \"120s\""
    ));
    let _corral = host.serve([&format!("registries = [{registry:?}]"), ""]);
    let started = Instant::now();
    let out = host.cli(
        &host.tokens[0].token,
        &["deploy", &format!("oci://{registry}/acme/x:1")],
    );
    let took = started.elapsed();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains(&registry), "{said}");
    assert!(said.contains("no connection within 10s"), "{said}");
    // One connect timeout, or a few (the client may try again), but not
    // the pull's 120 s.
    assert!(took < Duration::from_secs(60), "{took:?}: {said}");
    let status = host.cli(&host.operator.token, &["status", "--json"]);
    assert!(status.status.success(), "{}", text(&status));
    drop(filling);
}
