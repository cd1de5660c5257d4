//! Attacks on the admin API's connections, against the real binary:
//! strangers that take connection slots and keep talking but never
//! authenticate, and a client that opens more calls on a connection than
//! the host allows (speaking raw HTTP/2, since a well-behaved client
//! library keeps to the host's limit by itself). Each asserts the bound and
//! that the host then serves.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::activities::text;
use common::admin::Host;

/// The admin API's slots for connections that have not authenticated,
/// and how long one may stay so (`control/server.rs`).
const STRANGERS: usize = 32;
const AUTHENTICATE_WITHIN: Duration = Duration::from_secs(10);
/// How late a deadline may be met on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(8);

/// Waits (up to `within`) until the peer closes `stream`, reading past
/// anything it sends first; whether it did.
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buffer = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// A connection that speaks HTTP/2 and keeps talking (a PING now and then,
/// as a client answering keepalives would) but never makes a call.
fn stranger(address: (&str, u16)) -> TcpStream {
    let mut conn = TcpStream::connect(address).unwrap();
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    conn.write_all(&frame(SETTINGS, 0, 0, &[])).unwrap();
    conn
}

#[test]
fn strangers_who_never_authenticate_cannot_shut_an_operator_out() {
    let host = Host::new("");
    let corral = host.serve(["", ""]);
    let address = ("127.0.0.1", host.admin());
    let before = corral.open_fds();
    let opened = Instant::now();
    // Twice the slots of strangers (and every slot the old cap had), each
    // talking HTTP/2 every half second for as long as it is open ...
    let mut held: Vec<TcpStream> = (0..2 * STRANGERS).map(|_| stranger(address)).collect();
    let talking: Vec<TcpStream> = held.iter().map(|c| c.try_clone().unwrap()).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let talker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut talking = talking;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for conn in &mut talking {
                    let _ = conn.write_all(&frame(PING, 0, 0, &[0; 8]));
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    // ... and the operator (and a tenant) get through at once.
    for token in [&host.operator.token, &host.tokens[0].token] {
        let out = host.cli(token, &["status", "--json"]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let during = corral.open_fds();
    assert!(
        during <= before + STRANGERS + 4,
        "{before} descriptors before, {during} with {} strangers",
        2 * STRANGERS
    );
    // Each stranger is closed at its deadline, however much it talks (the
    // oldest sooner, to make room).
    for conn in &mut held {
        let left = (AUTHENTICATE_WITHIN + SLACK).saturating_sub(opened.elapsed());
        assert!(
            closed_within(conn, left),
            "a stranger was still open {:?} after it was opened",
            opened.elapsed()
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = talker.join();
    eprintln!("all closed {:?} after they were opened", opened.elapsed());
    let out = host.cli(&host.tokens[0].token, &["status", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
}

/// A stranger that sends PINGs and never reads: its small receive buffer
/// and then the host's send buffer fill with the host's answers, the
/// host's writes wait on it, and it stops once its own writes have waited
/// a second (the host reads nothing more while its writes wait).
fn stalled_stranger(address: (&str, u16)) -> Result<TcpStream, String> {
    let started = Instant::now();
    let mut conn = stranger(address);
    let size: libc::c_int = 1024;
    // SAFETY: setsockopt on an open socket, with an int it reads.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&conn),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&raw const size).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    conn.set_nonblocking(true).unwrap();
    let pings = frame(PING, 0, 0, &[0; 8]);
    let mut waiting: Option<Instant> = None;
    loop {
        match conn.write(&pings) {
            Ok(_) => waiting = None,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if waiting.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(1) {
                    return Ok(conn);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                return Err(format!(
                    "the host closed a stranger {:?} after it was opened, before it stalled: {e}",
                    started.elapsed()
                ));
            }
        }
    }
}

#[test]
fn a_stranger_that_stops_reading_is_still_closed_at_its_deadline() {
    let host = Host::new("");
    let corral = host.serve(["", ""]);
    let address = ("127.0.0.1", host.admin());
    let before = corral.open_fds();
    let opened = Instant::now();
    let held: Vec<TcpStream> = (0..3)
        .map(|_| stalled_stranger(address).unwrap_or_else(|e| panic!("{e}\n{}", corral.stderr())))
        .collect();
    eprintln!(
        "3 strangers stalled {:?} after they were opened: {} descriptors, {before} before",
        opened.elapsed(),
        corral.open_fds()
    );
    // The host can neither read from them nor write to them: their
    // deadline closes them all the same (they held their descriptors,
    // and slots, for as long as they liked).
    let deadline = opened + AUTHENTICATE_WITHIN + SLACK;
    while corral.open_fds() > before {
        assert!(
            Instant::now() < deadline,
            "{} descriptors open {:?} after the strangers were opened, {before} before",
            corral.open_fds(),
            opened.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("all closed {:?} after they were opened", opened.elapsed());
    drop(held);
    let out = host.cli(&host.tokens[0].token, &["status", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
}

/// An HTTP/2 frame: its type, flags, stream and payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap();
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Reads one frame: (type, flags, stream, payload).
fn read_frame(stream: &mut TcpStream) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    stream.read_exact(&mut head)?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload)?;
    Ok((head[3], head[4], id, payload))
}

/// An HPACK block for `POST /corral.v1.Admin/Status` over http, with the
/// gRPC content type: indexed `:method POST` and `:scheme http`, literals
/// for the rest.
fn status_call_headers() -> Vec<u8> {
    call_headers("/corral.v1.Admin/Status", None)
}

/// The same for the method at `path`, with `token` as a bearer if given.
fn call_headers(path: &str, token: Option<&str>) -> Vec<u8> {
    let mut block = vec![0x83, 0x86];
    let mut literal = |name_index: u8, name: &str, value: &str| {
        block.push(name_index);
        if name_index == 0 {
            block.push(u8::try_from(name.len()).unwrap());
            block.extend_from_slice(name.as_bytes());
        }
        block.push(u8::try_from(value.len()).unwrap());
        block.extend_from_slice(value.as_bytes());
    };
    literal(0x04, "", path);
    literal(0x01, "", "127.0.0.1");
    literal(0, "content-type", "application/grpc");
    literal(0, "te", "trailers");
    if let Some(token) = token {
        literal(0, "authorization", &format!("Bearer {token}"));
    }
    block
}

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;
const REFUSED_STREAM: u32 = 0x7;
const MAX_CONCURRENT_STREAMS: u16 = 0x3;

#[test]
fn calls_over_the_per_connection_cap_are_refused_and_the_host_serves_on() {
    let host = Host::new("");
    let _corral = host.serve(["", ""]);
    let mut conn = TcpStream::connect(("127.0.0.1", host.admin())).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    conn.write_all(&frame(SETTINGS, 0, 0, &[])).unwrap();
    // The host's settings name its cap; they bind once acknowledged.
    let cap = loop {
        let (kind, flags, _, payload) = read_frame(&mut conn).unwrap();
        if kind == SETTINGS && flags & ACK == 0 {
            let cap = payload.chunks_exact(6).find_map(|s| {
                (u16::from_be_bytes([s[0], s[1]]) == MAX_CONCURRENT_STREAMS)
                    .then(|| u32::from_be_bytes([s[2], s[3], s[4], s[5]]))
            });
            break cap.expect("the host announces a stream cap");
        }
    };
    assert_eq!(cap, 16);
    conn.write_all(&frame(SETTINGS, ACK, 0, &[])).unwrap();
    // Twice the cap of calls whose request never ends, in one write.
    let block = status_call_headers();
    let calls: Vec<u32> = (0..2 * cap).map(|i| 2 * i + 1).collect();
    let mut burst = Vec::new();
    for &id in &calls {
        burst.extend(frame(HEADERS, END_HEADERS, id, &block));
    }
    conn.write_all(&burst).unwrap();
    // Every call over the cap is refused as it arrives.
    let mut refused = Vec::new();
    while refused.len() < cap as usize {
        match read_frame(&mut conn) {
            Ok((RST_STREAM, _, id, payload))
                if u32::from_be_bytes(payload[..4].try_into().unwrap()) == REFUSED_STREAM =>
            {
                refused.push(id);
            }
            Ok((GOAWAY, ..)) => break,
            Ok(_) => {}
            Err(e) => panic!("reading the host's frames: {e}; refused so far {refused:?}"),
        }
    }
    refused.sort_unstable();
    assert_eq!(refused, calls[cap as usize..].to_vec());
    drop(conn);
    let out = host.cli(&host.tokens[0].token, &["status", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
}

/// The length prefix of an HPACK string (7-bit prefix, no Huffman).
fn hpack_len(len: usize, out: &mut Vec<u8>) {
    if len < 127 {
        out.push(u8::try_from(len).unwrap());
        return;
    }
    out.push(0x7f);
    let mut rest = len - 127;
    while rest >= 128 {
        out.push(u8::try_from(rest % 128).unwrap() | 0x80);
        rest /= 128;
    }
    out.push(u8::try_from(rest).unwrap());
}

/// A call whose headers are 20 KiB, over the host's 16 KiB, sent before
/// it could authenticate (its token is valid, and last): refused on its
/// headers (431, or the stream reset), never served, and the connection's
/// next call and the host serve on.
#[test]
fn a_call_whose_headers_are_over_the_bound_is_refused_before_it_is_served() {
    let host = Host::new("");
    let _corral = host.serve(["", ""]);
    let mut conn = TcpStream::connect(("127.0.0.1", host.admin())).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    conn.write_all(&frame(SETTINGS, 0, 0, &[])).unwrap();
    let mut block = call_headers("/corral.v1.Admin/Status", None);
    // A literal header of 20 KiB, then the operator's token.
    block.push(0);
    hpack_len(8, &mut block);
    block.extend_from_slice(b"x-filler");
    hpack_len(20 << 10, &mut block);
    block.extend(std::iter::repeat_n(b'f', 20 << 10));
    block.push(0);
    let auth = format!("Bearer {}", host.operator.token);
    hpack_len(13, &mut block);
    block.extend_from_slice(b"authorization");
    hpack_len(auth.len(), &mut block);
    block.extend_from_slice(auth.as_bytes());
    // In frames of at most the default 16 KiB: HEADERS, then CONTINUATION.
    let (first, rest) = block.split_at(16 << 10);
    let mut burst = frame(HEADERS, 0, 1, first);
    burst.extend(frame(CONTINUATION, END_HEADERS, 1, rest));
    conn.write_all(&burst).unwrap();
    let answer = loop {
        match read_frame(&mut conn) {
            Ok((SETTINGS, flags, ..)) if flags & ACK == 0 => {
                conn.write_all(&frame(SETTINGS, ACK, 0, &[])).unwrap();
            }
            Ok((HEADERS, _, 1, payload)) => break format!("headers {payload:02x?}"),
            Ok((RST_STREAM, _, 1, _)) => break "reset".to_owned(),
            Ok((GOAWAY, ..)) => break "goaway".to_owned(),
            Ok((DATA, _, 1, _)) => panic!("the call was served"),
            Ok(_) => {}
            Err(e) => panic!("reading the host's frames: {e}"),
        }
    };
    // Served, its answer would be `:status 200` (indexed: 0x88) with a
    // gRPC status; refused, it is 431 (a literal) or a reset.
    assert!(
        !answer.starts_with("headers [88"),
        "the call was served: {answer}"
    );
    drop(conn);
    let out = host.cli(&host.operator.token, &["status", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
}

/// A tenant's call that never ends (an upload whose stream it holds open,
/// answering the host's keepalives as a real client does) does not hold
/// corral past its stop: once every task is reported, the endpoints' last
/// calls get a few seconds and are then closed, and corral exits 0.
#[test]
fn a_call_held_open_does_not_hold_the_host_past_its_stop() {
    let host = Host::new("");
    let mut corral = host.serve(["", ""]);
    let mut conn = TcpStream::connect(("127.0.0.1", host.admin())).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    conn.write_all(&frame(SETTINGS, 0, 0, &[])).unwrap();
    conn.write_all(&frame(SETTINGS, ACK, 0, &[])).unwrap();
    let upload = call_headers("/corral.v1.Admin/Upload", Some(&host.tokens[0].token));
    conn.write_all(&frame(HEADERS, END_HEADERS, 1, &upload))
        .unwrap();
    // The start of a gRPC message (its 5-byte prefix, promising more), and
    // a PING: its answer says the host has read the call.
    conn.write_all(&frame(DATA, 0, 1, &[0, 0, 0, 0, 64]))
        .unwrap();
    conn.write_all(&frame(PING, 0, 0, b"uploads!")).unwrap();
    // Until the host closes the connection: keepalives answered, and
    // anything on the call (an answer would mean it was refused, not held).
    let (pinged, pinged_rx) = std::sync::mpsc::channel();
    let client = std::thread::spawn(move || {
        let mut on_the_call = Vec::new();
        while let Ok((kind, flags, id, payload)) = read_frame(&mut conn) {
            if kind == PING && flags & ACK != 0 {
                let _ = pinged.send(());
            } else if kind == PING {
                let _ = conn.write_all(&frame(PING, ACK, 0, &payload));
            } else if id == 1 && kind != DATA {
                on_the_call.push(kind);
            }
        }
        on_the_call
    });
    pinged_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the host answers a PING");
    let pid = corral.pid();
    let stopping = Instant::now();
    let code = corral.terminate(Duration::from_secs(60));
    let took = stopping.elapsed();
    if code.is_none() {
        // Gone, so that the client's reads end.
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .stderr(std::process::Stdio::null())
            .status();
    }
    let on_the_call = client.join().unwrap();
    assert_eq!(
        on_the_call,
        Vec::<u8>::new(),
        "the host answered the call: it was not held open"
    );
    assert_eq!(
        code,
        Some(0),
        "corral did not exit 0 within 60 s of SIGTERM"
    );
    // It was the bound that let it go, not the call ending another way.
    corral.await_logged("calls still open on the admin API 5s after the drain", 1);
    corral.await_logged("every accepted task was reported", 1);
    // The drain of an idle host, the endpoints' few seconds, and a loaded
    // machine's slack.
    assert!(
        took < Duration::from_secs(5) + SLACK,
        "corral took {took:?} to stop"
    );
}
