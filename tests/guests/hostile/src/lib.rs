//! `demo:hostile`: the attack suite's guests. Each function attacks one
//! bound of the host; the tests in `host/tests/hostile*.rs` assert the bound
//! holds and the host keeps serving.

use std::hint::black_box;
use std::io::Write;

corral_guest::generate!("demo:hostile/hostile");

use exports::demo::hostile::api::Guest;

struct Hostile;

impl Guest for Hostile {
    fn random_forever(bytes: u64) {
        loop {
            black_box(wasip2::random::random::get_random_bytes(bytes));
        }
    }

    fn heartbeat_forever(bytes: u32) {
        let details = format!("\"{}\"", "x".repeat(bytes.saturating_sub(2) as usize));
        loop {
            corral_guest::context::heartbeat(Some(&details));
        }
    }

    fn refused_requests(authority: String, path: Option<String>, count: u32) -> u32 {
        use wasip2::http::outgoing_handler;
        use wasip2::http::types::{Fields, OutgoingRequest, Scheme};
        let mut refused = 0;
        for _ in 0..count {
            let request = OutgoingRequest::new(Fields::new());
            let _ = request.set_scheme(Some(&Scheme::Http));
            let _ = request.set_authority(Some(&authority));
            if let Some(path) = &path {
                let _ = request.set_path_with_query(Some(path));
            }
            match outgoing_handler::handle(request, None) {
                Err(_) => refused += 1,
                Ok(response) => {
                    response.subscribe().block();
                    if let Some(Ok(Err(_))) = response.get() {
                        refused += 1;
                    }
                }
            }
        }
        refused
    }

    fn random_once(bytes: u64) -> u64 {
        wasip2::random::random::get_random_bytes(bytes).len() as u64
    }

    fn blank_lines(count: u32) {
        let mut out = std::io::stdout().lock();
        let chunk = vec![b'\n'; 4096];
        let mut left = count as usize;
        while left > 0 {
            let n = left.min(chunk.len());
            let _ = out.write_all(&chunk[..n]);
            left -= n;
        }
        let _ = out.flush();
    }

    fn empty_logs(count: u32) {
        for _ in 0..count {
            corral_guest::log::info("");
        }
    }

    fn log_forever(bytes: u32) {
        let message = "x".repeat(bytes as usize);
        loop {
            corral_guest::log::info(&message);
        }
    }

    fn big_list(n: u32) -> Vec<u32> {
        (0..n).collect()
    }

    fn deep_until(depth: u32, release: String) -> u32 {
        let reached = descend(u64::from(depth));
        while std::fs::metadata(&release).is_err() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        reached as u32
    }

    fn hold_files(path: String, count: u32) -> Result<u32, String> {
        let mut held = Vec::new();
        for opened in 0..count {
            match std::fs::File::open(&path) {
                Ok(file) => held.push(file),
                Err(e) => return Err(format!("{opened}: {e}")),
            }
        }
        black_box(&held);
        Ok(held.len() as u32)
    }
}

/// One frame of `deep_until`: eight values live across the call, which
/// the host keeps on the native stack (wasm locals, not linear memory).
fn descend(depth: u64) -> u64 {
    if depth == 0 {
        return 0;
    }
    let (a, b, c, d) = (
        depth ^ 1,
        depth.rotate_left(2),
        depth.rotate_left(3),
        !depth,
    );
    let (e, f, g, h) = (depth * 5, depth * 7, depth.rotate_left(5), depth ^ 0xff);
    let below = descend(depth - 1);
    let mixed = a
        ^ b.rotate_right(1)
        ^ c.rotate_right(2)
        ^ d.rotate_right(3)
        ^ e.rotate_right(4)
        ^ f.rotate_right(5)
        ^ g.rotate_right(6)
        ^ h.rotate_right(7);
    // Opaque to the optimiser, so the values and the frame stay.
    below + u64::from(black_box(mixed) != u64::MAX)
}

export!(Hostile);
