//! `demo:hostile`: the attack suite's guests. Each function attacks one
//! bound of the host; the tests in `host/core/tests/hostile*.rs` assert the bound
//! holds and the host keeps serving.

use std::hint::black_box;
use std::io::Write;

corral_guest::generate!("demo:hostile/hostile");

use exports::demo::hostile::api::Guest;

struct Hostile;

thread_local! {
    /// What `keep-handle` holds on to between tasks.
    static KEPT: std::cell::RefCell<Vec<wasip2::io::poll::Pollable>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

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

    fn heartbeat_values(bytes: u32, ms: u32) {
        let values = (bytes.saturating_sub(1) / 2).max(1) as usize;
        let mut details = String::with_capacity(2 * values + 1);
        details.push('[');
        for i in 0..values {
            details.push_str(if i == 0 { "0" } else { ",0" });
        }
        details.push(']');
        corral_guest::context::heartbeat(Some(&details));
        corral_guest::log::info("heartbeated");
        wasip2::clocks::monotonic_clock::subscribe_duration(u64::from(ms) * 1_000_000).block();
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

    fn keep_handle() -> u32 {
        let pollable = wasip2::clocks::monotonic_clock::subscribe_duration(1_000_000_000);
        KEPT.with_borrow_mut(|kept| {
            kept.push(pollable);
            kept.len() as u32
        })
    }

    fn monotonic(rounds: u64) -> u64 {
        black_box(Self::burn(rounds));
        wasip2::clocks::monotonic_clock::now()
    }

    fn burn(rounds: u64) -> u64 {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in 0..rounds {
            // xorshift: the compiler cannot fold it away.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x = black_box(x.wrapping_add(i));
        }
        x
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

    fn misuse(how: String, dir: String) -> String {
        const OVER: u64 = 2 << 20;
        match how.as_str() {
            "random" => {
                black_box(wasip2::random::random::get_random_bytes(OVER));
            }
            "insecure-random" => {
                black_box(wasip2::random::insecure::get_insecure_random_bytes(OVER));
            }
            "poll-empty" => {
                black_box(wasip2::io::poll::poll(&[]));
            }
            "bad-handle" => {
                // SAFETY (of the guest's own memory): a handle number the
                // host never gave out; only the host's check is at stake.
                let stream = unsafe { wasip2::io::streams::OutputStream::from_handle(0x00ff_fff0) };
                let _ = black_box(stream.check_write());
                std::mem::forget(stream);
            }
            "write-over-permit" => return write_over_permit(&dir),
            "blocking-write-over-4096" => {
                let out = wasip2::cli::stdout::get_stdout();
                let _ = out.blocking_write_and_flush(&[b'x'; 8192]);
            }
            other => return format!("unknown misuse `{other}`"),
        }
        format!("the host let `{how}` pass")
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

/// Writes far more to a file's stream than `check-write` permits.
fn write_over_permit(dir: &str) -> String {
    use wasip2::filesystem::types::{DescriptorFlags, OpenFlags, PathFlags};
    let Some((root, _)) = wasip2::filesystem::preopens::get_directories()
        .into_iter()
        .find(|(_, path)| path == dir)
    else {
        return format!("no directory is granted at `{dir}`");
    };
    let file = match root.open_at(
        PathFlags::empty(),
        "over-permit",
        OpenFlags::CREATE,
        DescriptorFlags::WRITE,
    ) {
        Ok(file) => file,
        Err(e) => return format!("opening: {e}"),
    };
    let stream = match file.write_via_stream(0) {
        Ok(stream) => stream,
        Err(e) => return format!("streaming: {e}"),
    };
    let _ = stream.write(&vec![b'x'; 16 << 20]);
    "the host let `write-over-permit` pass".to_owned()
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
