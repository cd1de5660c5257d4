//! `demo:misbehave`: hostile and broken guests. Every function here must end
//! in a precise classification, and leave the host healthy.

use std::hint::black_box;
use std::io::Write;
use std::net::ToSocketAddrs;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use corral_guest::Failure;

corral_guest::generate!("demo:misbehave/misbehave");

use exports::demo::misbehave::api::Guest;

static COUNTER: AtomicU32 = AtomicU32::new(0);
/// What `remember` keeps: texts, and their ballast.
static HELD: Mutex<(Vec<String>, Vec<Vec<u8>>)> = Mutex::new((Vec::new(), Vec::new()));
const BALLAST: usize = 4 << 20;

struct Misbehave;

#[inline(never)]
fn descend(depth: u64) -> u64 {
    if depth == 0 {
        return 0;
    }
    let frame = black_box([depth; 16]);
    1 + descend(black_box(depth - 1)) + frame[3] - depth
}

impl Guest for Misbehave {
    fn spin() {
        let mut x: u64 = 0;
        loop {
            x = black_box(x.wrapping_add(1));
        }
    }

    fn allocate(mib: u32) -> u32 {
        let mut blocks: Vec<Vec<u8>> = Vec::new();
        for i in 0..mib {
            blocks.push(vec![i as u8 | 1; 1 << 20]);
        }
        black_box(&blocks);
        blocks.len() as u32
    }

    fn recurse(depth: u64) -> u64 {
        descend(depth)
    }

    fn panic(message: String) {
        panic!("{message}");
    }

    fn wild_read() -> u64 {
        let address = black_box(0xFFFF_FFF0_usize) as *const u64;
        // SAFETY: not safe at all: this guest exists to fault.
        unsafe { std::ptr::read_volatile(address) }
    }

    fn exit(code: u8) {
        std::process::exit(i32::from(code));
    }

    fn memory_size() -> u64 {
        core::arch::wasm32::memory_size(0) as u64 * 65536
    }

    fn counter() -> u32 {
        COUNTER.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn remember(text: String, times: u32) -> Vec<String> {
        // Fresh pages are zero, so the allocator hands this out without
        // clearing it: a byte that is not zero was written by another task.
        let fresh = black_box(vec![0u8; BALLAST]);
        let stale = fresh.iter().filter(|&&b| b != 0).count();
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        if stale > 0 {
            held.0.push(format!("stale bytes: {stale}"));
        }
        for _ in 0..times {
            held.1
                .push(text.bytes().chain(*b" ").cycle().take(BALLAST).collect());
            held.0.push(text.clone());
        }
        held.0.clone()
    }

    fn big_output(bytes: u32) -> String {
        "x".repeat(bytes as usize)
    }

    fn flood(lines: u32) {
        let mut out = std::io::stdout().lock();
        for i in 0..lines {
            let _ = writeln!(
                out,
                "flood line {i} .............................................."
            );
            corral_guest::log::info(&format!("flood log {i}"));
        }
    }

    fn print(text: String) {
        println!("{text}");
        eprintln!("{text}");
    }

    fn bad_heartbeat() {
        corral_guest::context::heartbeat(Some("{not json"));
    }

    fn sleep(ms: u32) {
        std::thread::sleep(Duration::from_millis(u64::from(ms)));
    }

    fn fail(kind: String, retryable: bool) -> Result<(), Failure> {
        Err(
            Failure::new(kind.clone(), format!("failed on purpose: {kind}"))
                .retryable(retryable)
                .with_details(&serde_json::json!({ "why": "asked to" })),
        )
    }

    fn plain_error(code: u32) -> Result<String, (u32, String)> {
        Err((code, "plain error".into()))
    }

    fn read_file(path: String) -> Result<String, String> {
        std::fs::read_to_string(&path).map_err(|e| e.to_string())
    }

    fn environment() -> Vec<(String, String)> {
        std::env::vars().collect()
    }

    fn connect(address: String) -> Result<(), String> {
        std::net::TcpStream::connect(&address)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn resolve(name: String) -> Result<Vec<String>, String> {
        (name.as_str(), 80)
            .to_socket_addrs()
            .map(|addrs| addrs.map(|a| a.ip().to_string()).collect())
            .map_err(|e| e.to_string())
    }
}

export!(Misbehave);
