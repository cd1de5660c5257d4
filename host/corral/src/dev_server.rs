//! A Temporal dev server on loopback, as `corral dev`, the end-to-end tests
//! and the Temporal benchmark start it (`temporal server start-dev`).

/// A TCP port on 127.0.0.1 that is free right now, chosen at random below
/// the kernel's ephemeral range: a port from inside that range (what
/// binding port 0 gives) can be taken by any outgoing connection between
/// now and the moment the caller's server binds it.
pub fn free_loopback_port() -> std::io::Result<u16> {
    let ephemeral = ephemeral_ports_start().unwrap_or(32768);
    if ephemeral >= 4096 {
        let (low, high) = (ephemeral / 2, ephemeral);
        for _ in 0..32 {
            let mut bytes = [0u8; 2];
            getrandom::fill(&mut bytes).map_err(std::io::Error::other)?;
            let port = low + u16::from_le_bytes(bytes) % (high - low);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The first port of the kernel's ephemeral range (Linux).
fn ephemeral_ports_start() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The `temporal` CLI arguments that start a headless dev server on
/// loopback: the frontend on `port`, its HTTP and metrics endpoints on free
/// ports, and its state in `db` (in memory when `None`).
pub fn dev_server_args(port: u16, db: Option<&std::path::Path>) -> std::io::Result<Vec<String>> {
    let mut args: Vec<String> = [
        "server",
        "start-dev",
        "--headless",
        "--ip",
        "127.0.0.1",
        "--log-level",
        "error",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend([
        "--port".into(),
        port.to_string(),
        "--http-port".into(),
        free_loopback_port()?.to_string(),
        "--metrics-port".into(),
        free_loopback_port()?.to_string(),
    ]);
    if let Some(db) = db {
        args.extend(["--db-filename".into(), db.display().to_string()]);
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_binds_and_lies_below_the_ephemeral_range() -> std::io::Result<()> {
        let ephemeral = ephemeral_ports_start().unwrap_or(u16::MAX);
        for _ in 0..20 {
            let port = free_loopback_port()?;
            if ephemeral >= 4096 {
                assert!(port < ephemeral, "{port} is inside the ephemeral range");
            }
            std::net::TcpListener::bind(("127.0.0.1", port))?;
        }
        Ok(())
    }
}
