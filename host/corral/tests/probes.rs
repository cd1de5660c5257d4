//! The probes an orchestrator asks, against the real binary and a real
//! Temporal dev server: `/livez` answers from the start; `/readyz` is not
//! ready while the configured components compile, while the tenant's
//! Temporal server does not answer, and from the moment the host is told
//! to stop while its tasks drain; it is ready otherwise, and answers at
//! once with guests busy on every core.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::activities::{start, unique};
use common::example;
use common::processes::{Corral, free_port, sample, scrape};
use common::temporal::TemporalServer;

/// How late a deadline may be met on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(8);

/// `GET path` on `port`: the status and the body, or `None` while nothing
/// listens there.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: corral\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let status = answer.split_whitespace().nth(1)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

/// Asks `path` until `wanted` holds of its answer (at most 90 s); the
/// answer.
fn until(port: u16, path: &str, what: &str, wanted: impl Fn(u16, &str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last = None;
    while Instant::now() < deadline {
        if let Some((status, body)) = get(port, path) {
            if wanted(status, &body) {
                return body;
            }
            last = Some((status, body));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{path} never {what}; last: {last:?}");
}

fn config(server: &TemporalServer, metrics: u16, queue: &str, components: &[&str]) -> String {
    let components: Vec<String> = components
        .iter()
        .map(|c| format!("{:?}", example(c).display().to_string()))
        .collect();
    format!(
        r#"
[host]
max_concurrent = 4
shutdown_grace = "20s"
metrics_listen = "127.0.0.1:{metrics}"

[[tenant]]
name = "acme"
temporal = {{ address = "http://{address}", task_queue = "{queue}" }}
components = [{components}]
"#,
        address = server.address(),
        components = components.join(", "),
    )
}

#[test]
fn a_host_is_not_ready_while_it_compiles_ready_then_and_not_ready_at_once_when_told_to_stop() {
    let server = TemporalServer::start();
    let metrics = free_port();
    let queue = unique("probes");
    // The Python example takes Cranelift seconds: the start is still
    // compiling when the listener answers.
    let corral = Corral::launch(&config(
        &server,
        metrics,
        &queue,
        &["python-shout", "misbehave"],
    ));
    let said = until(metrics, "/readyz", "answered", |_, _| true);
    assert!(
        said.starts_with("not ready: starting: loading and compiling the configured components"),
        "{said}"
    );
    let (status, live) = get(metrics, "/livez").unwrap();
    assert_eq!((status, live.as_str()), (200, "live\n"));
    let (status, _) = get(metrics, "/metrics").unwrap();
    assert_eq!(status, 503, "a scrape before the host serves");
    until(metrics, "/readyz", "said ready", |status, _| status == 200);
    corral.await_logged("corral: ready", 1);

    // Guests spinning on every core: the probes answer at once all the
    // same (the host's runtime runs before the guests' threads).
    for _ in 0..4 {
        start(
            &server,
            &queue,
            "demo:misbehave/api.spin",
            &[],
            &["--start-to-close-timeout", "120s"],
        );
    }
    let in_flight = r#"corral_tasks_in_flight{tenant="acme"}"#;
    let deadline = Instant::now() + Duration::from_secs(60);
    while sample(&scrape(metrics), in_flight) != Some(4.0) {
        assert!(Instant::now() < deadline, "{}", scrape(metrics));
        std::thread::sleep(Duration::from_millis(100));
    }
    for path in ["/livez", "/readyz"] {
        let asked = Instant::now();
        let (status, _) = get(metrics, path).unwrap();
        let took = asked.elapsed();
        assert_eq!(status, 200, "{path}");
        assert!(
            took < Duration::from_secs(2),
            "{path} took {took:?} beside the guests"
        );
    }

    // Told to stop: not ready at once, while the tasks it runs drain.
    // SAFETY: a signal to the process this test started.
    assert_eq!(
        unsafe { libc::kill(corral.pid() as libc::pid_t, libc::SIGTERM) },
        0
    );
    let said = until(metrics, "/readyz", "said draining", |status, _| {
        status == 503
    });
    assert_eq!(
        said,
        "not ready: draining: told to stop, finishing its tasks\n"
    );
    assert_eq!(
        sample(&scrape(metrics), in_flight),
        Some(4.0),
        "the tasks still drain"
    );
    let (status, detail) = get(metrics, "/readyz?verbose").unwrap();
    assert_eq!(status, 503);
    let detail: serde_json::Value = serde_json::from_str(&detail).unwrap();
    assert_eq!(detail["phase"], "draining", "{detail}");
    assert_eq!(get(metrics, "/livez").unwrap().0, 200);
}

#[test]
fn a_host_whose_temporal_server_stops_answering_is_not_ready_until_it_answers_again() {
    let mut server = TemporalServer::start();
    let metrics = free_port();
    let queue = unique("probes");
    let _corral = Corral::serve(&config(&server, metrics, &queue, &["echo"]));
    until(metrics, "/readyz", "said ready", |status, _| status == 200);
    server.stop();
    let stopped = Instant::now();
    let said = until(metrics, "/readyz", "said not ready", |status, _| {
        status == 503
    });
    assert!(
        stopped.elapsed() < Duration::from_secs(5) + SLACK,
        "{:?}",
        stopped.elapsed()
    );
    assert!(said.starts_with("not ready: tenant `acme`: "), "{said}");
    assert!(said.contains(&server.address()), "{said}");
    // The host itself is alive.
    assert_eq!(get(metrics, "/livez").unwrap().0, 200);
    // The same server back: ready again.
    let db = server.db().to_owned();
    let _again = TemporalServer::start_on(server.port(), &db);
    until(metrics, "/readyz", "said ready again", |status, _| {
        status == 200
    });
}
