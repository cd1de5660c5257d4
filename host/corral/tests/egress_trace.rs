//! The secret-in-a-URL attack, read from what corral writes: a guest that
//! learned a key puts it in a path and a query, and neither the host's log
//! nor an exported span carries it in clear. A binary of its own, so its
//! subscriber can be the process's and see every thread's spans.

mod common;

use std::sync::Arc;

use common::egress::{grant, request, secret_file};
use common::http::recording_server;
use common::{example, host};
use corral_core::sandbox::Secrets;

/// Everything corral writes through `tracing` while `test` runs, on any
/// thread: its log (`corral serve`'s filter, even at `debug` for corral's
/// own targets) and every span it exports with its fields (the export's
/// filter). wasmtime's own crates are held at `error`, as `corral serve`
/// holds them: at `trace` they log every argument a guest passes.
/// Returned once `until` is among it (or after 10 s without it).
fn traced(test: impl Future<Output = ()>, until: &str) -> String {
    use std::sync::Mutex;
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    let sink = Sink::default();
    let (log, export) = (sink.clone(), sink.clone());
    let log_filter = format!("{},corral=debug", corral::log::SERVER_LOG);
    let subscriber = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || log.clone())
                .with_filter(tracing_subscriber::EnvFilter::new(log_filter)),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
                .with_ansi(false)
                .with_writer(move || export.clone())
                .with_filter(corral::telemetry::exported()),
        );
    // The process's subscriber, not this thread's: an `http` span closes
    // where the task's request is dropped, which may be another thread of
    // the host's (a thread's own subscriber missed it there, now and then).
    // This binary runs this one test, so nothing else writes to it.
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(test);
    // An `http` span is written when it closes, and it closes when the
    // task's request is dropped: on the host's runtime, possibly just after
    // the outcome came back. Wait for that line (a few seconds at most).
    let written = || String::from_utf8_lossy(&sink.0.lock().unwrap()).into_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !written().contains(until) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    written()
}

#[test]
fn a_secret_a_guest_learned_is_never_written_in_clear_in_the_log_or_a_span() {
    // A guest that learned the key (an API echoed it) puts it in a path,
    // as written and percent-encoded, and in a query: under the grant's
    // path rule (an `http` span's url) and outside it (a refusal in the
    // host's log).
    const KEY: &str = "sk_live_51Hcorral:TestKey";
    let (pay, _arrived) = recording_server(|_| (200, vec![], "ok".into()));
    let dir = tempfile::tempdir().unwrap();
    let secrets = Secrets::load(vec![secret_file(
        &dir,
        "PAY_KEY",
        KEY,
        &[format!("http://127.0.0.1:{pay}")],
    )])
    .unwrap();
    let host = host()
        .http_grant(
            grant(&format!("127.0.0.1:{pay}"))
                .with_paths(["/v1"])
                .unwrap(),
        )
        .secrets(Arc::new(secrets))
        .build()
        .unwrap();
    let fetch = host.load_file(example("fetch")).unwrap();
    let encoded = KEY.replace(':', "%3A");
    let urls = [
        format!("http://127.0.0.1:{pay}/v1/{KEY}"),
        format!("http://127.0.0.1:{pay}/v1/{encoded}"),
        format!("http://127.0.0.1:{pay}/elsewhere/{KEY}"),
        format!("http://127.0.0.1:{pay}/elsewhere/{encoded}"),
        format!("http://127.0.0.1:{pay}/v1/q?k={KEY}"),
    ];
    let written = traced(
        async {
            for url in &urls {
                let _ = fetch
                    .call("demo:fetch/api.send")
                    .arg(request("GET", url, &[], false))
                    .run()
                    .await;
            }
        },
        "url=GET",
    );
    assert!(written.contains("outbound HTTP refused"), "{written}");
    assert!(written.contains("url=GET"), "{written}");
    assert!(written.contains("[secret PAY_KEY]"), "{written}");
    for clear in [KEY, encoded.as_str(), "51Hcorral"] {
        assert!(!written.contains(clear), "{clear} in:\n{written}");
    }
}
