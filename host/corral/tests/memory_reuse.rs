//! A task never sees a previous task's memory, also on a host with swap.
//!
//! The pool keeps a slot's linear memory resident for the next instance and
//! resets only the pages the last one wrote (`pagemap_scan`). wasmtime 48
//! missed written pages that had been swapped out: they were neither reset
//! nor decommitted, so the next instance in the slot — possibly another
//! tenant's — read them back (wasmtime PR 14357, released in 50; 50.0.2
//! also stopped taking never-touched pages for written ones). This test
//! writes a marker into an instance's memory, pushes those pages out to swap
//! (`MADV_PAGEOUT`), frees the instance, and scans the next instance in the
//! same slot for the marker, with corral's own engine settings.
//!
//! Pages are pushed to swap the way a loaded host's are: the attack runs in
//! a child process in a memory cgroup a few MiB wide, which fills memory
//! after the marker so the kernel swaps the marker's pages out. It needs
//! swap and a memory cgroup: without swap, and as root, it adds a swap file
//! of its own for its run; where neither can be had, it says so and asserts
//! nothing (a page cannot be pushed out without swap).

use std::process::Command;

mod common;

use corral_core::sandbox::{Sandbox, SandboxConfig};
use wasmtime::{Instance, Module, Store};

const MARKER: &[u8] = b"another tenant's secret, page after page";
/// The memory written: inside what the pool keeps resident (1 MiB).
const PAGES: u64 = 8;

fn swap_total_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("SwapTotal:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Swap for the length of the test: the machine's, or a file of its own.
struct Swap(Option<std::path::PathBuf>);

impl Swap {
    fn get() -> Option<Swap> {
        if swap_total_kib() > 0 {
            return Some(Swap(None));
        }
        let file = std::env::temp_dir().join(format!("corral-test-swap-{}", std::process::id()));
        let run = |program: &str, args: &[&str]| {
            Command::new(program)
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        let path = file.display().to_string();
        let made = run(
            "dd",
            &[
                "if=/dev/zero",
                &format!("of={path}"),
                "bs=1M",
                // Room for all the attack's filler past the cgroup's 48 MiB
                // (48 × 4 MiB at most): with 64 MiB, the kernel swapping
                // filler before the marker's pages could fill it, and the
                // child was killed in the cgroup (seen once in CI).
                "count=256",
                "status=none",
            ],
        ) && run("chmod", &["600", &path])
            && run("mkswap", &[&path])
            && run("swapon", &[&path]);
        if made {
            Some(Swap(Some(file)))
        } else {
            let _ = std::fs::remove_file(&file);
            None
        }
    }
}

impl Drop for Swap {
    fn drop(&mut self) {
        if let Some(file) = &self.0 {
            let _ = Command::new("swapoff").arg(file).output();
            let _ = std::fs::remove_file(file);
        }
    }
}

/// A memory cgroup (v1 or v2) that holds `limit` bytes, for the run.
struct Cgroup(std::path::PathBuf);

impl Cgroup {
    fn new(limit: u64) -> Option<Cgroup> {
        let name = format!("corral-test-{}", std::process::id());
        for (root, file) in [
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes"),
            ("/sys/fs/cgroup", "memory.max"),
        ] {
            let dir = std::path::Path::new(root).join(&name);
            if std::fs::create_dir(&dir).is_ok() {
                if std::fs::write(dir.join(file), limit.to_string()).is_ok() {
                    return Some(Cgroup(dir));
                }
                let _ = std::fs::remove_dir(&dir);
            }
        }
        None
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// How many of `len` bytes at `at` are resident (`mincore`).
fn resident_pages(at: *mut u8, len: usize) -> usize {
    let page = 4096;
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `at..at+len` is a mapping of this process (an instance's
    // linear memory, alive), and `vec` has a byte per page of it.
    let rc = unsafe { libc::mincore(at.cast(), len, vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().filter(|&&b| b & 1 == 1).count()
}

/// Set in the child that runs the attack inside the cgroup.
const CHILD: &str = "CORRAL_MEMORY_REUSE_CHILD";

#[test]
fn a_task_never_reads_a_previous_tasks_memory_even_from_swap() {
    if std::env::var_os(CHILD).is_some() {
        return attack();
    }
    let Some(_swap) = Swap::get() else {
        eprintln!(
            "no swap here, and none could be added (not root?): pages cannot be pushed out, so the attack cannot run"
        );
        return;
    };
    let Some(cgroup) = Cgroup::new(48 << 20) else {
        eprintln!("no memory cgroup could be made (not root?): the attack cannot run");
        return;
    };
    let procs = cgroup.0.join("cgroup.procs");
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            "a_task_never_reads_a_previous_tasks_memory_even_from_swap",
            "--nocapture",
        ])
        .env(CHILD, "1");
    // SAFETY: between fork and exec the child only opens and writes a file
    // (moving itself, "0", into the cgroup) with raw system calls.
    unsafe {
        use std::os::unix::process::CommandExt as _;
        let path = std::ffi::CString::new(procs.display().to_string()).unwrap();
        child.pre_exec(move || {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let written = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
            if written != 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = child.output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{said}");
    assert!(out.status.success(), "the attack failed: {said}");
    assert!(said.contains("pages swapped out"), "{said}");
}

/// In the child, in the cgroup: marker, swap, free, next instance, scan.
fn attack() {
    // One instance at a time: the second instance takes the first's slot.
    let sandbox = Sandbox::new(SandboxConfig {
        max_instances: 1,
        ..SandboxConfig::default()
    })
    .unwrap();
    let engine = sandbox.engine();
    let wat = format!(r#"(module (memory (export "memory") {PAGES}))"#);
    let module = Module::new(engine, wat::parse_str(&wat).unwrap()).unwrap();
    let instantiate = || {
        let mut store = Store::new(engine, ());
        store.set_fuel(u64::MAX).unwrap();
        store.set_epoch_deadline(u64::MAX / 2);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let instance = runtime
            .block_on(Instance::new_async(&mut store, &module, &[]))
            .unwrap();
        (store, instance)
    };

    let (mut store, instance) = instantiate();
    let memory = instance.get_memory(&mut store, "memory").unwrap();
    let len = memory.data_size(&store);
    for page in memory.data_mut(&mut store).chunks_mut(4096) {
        page[..MARKER.len()].copy_from_slice(MARKER);
    }
    let base = memory.data_ptr(&store);
    // Fill the cgroup several times over: the marker's pages, written
    // first, are swapped out to make room.
    let mut filler: Vec<Vec<u8>> = Vec::new();
    for _ in 0..48 {
        filler.push(vec![1u8; 4 << 20]);
        if resident_pages(base, len) == 0 {
            break;
        }
    }
    let resident = resident_pages(base, len);
    println!(
        "{} of {} written pages swapped out",
        len / 4096 - resident,
        len / 4096
    );
    assert!(
        resident < len / 4096,
        "no page went to swap: the attack did not run"
    );
    drop(filler);
    drop(store);

    let (mut store, instance) = instantiate();
    let memory = instance.get_memory(&mut store, "memory").unwrap();
    assert_eq!(
        memory.data_ptr(&store),
        base,
        "the next instance is not in the same slot: the attack did not run"
    );
    let seen = memory
        .data(&store)
        .windows(MARKER.len())
        .filter(|w| *w == MARKER)
        .count();
    assert_eq!(
        seen, 0,
        "the next instance read {seen} pages of the last one's memory"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_host_gives_the_pools_memory_back_and_serves_on() {
    let host = common::host().build().unwrap();
    let misbehave = common::load(&host, "misbehave");
    let touch = || {
        misbehave
            .call("demo:misbehave/api.allocate")
            .arg(serde_json::json!(8))
            .run()
    };
    assert_eq!(touch().await.expect_ok(), &serde_json::json!(8));
    // Not idle yet: a task started just now.
    let sandbox = host.sandbox();
    assert_eq!(
        sandbox.release_idle_memory(std::time::Duration::from_secs(3600)),
        None
    );
    // Idle: the slot's kept memory goes back.
    let released = sandbox.release_idle_memory(std::time::Duration::ZERO);
    assert!(released.is_some_and(|b| b > 0), "released {released:?}");
    // The next task gets a slot as ever.
    assert_eq!(touch().await.expect_ok(), &serde_json::json!(8));
}

#[test]
fn corral_serve_releases_idle_pool_memory_after_its_idle_time() {
    let host = common::admin::Host::new("idle_memory_release = \"1s\"");
    let corral = host.serve(["", ""]);
    let out = host.run(
        0,
        "demo:greeter/api.greet",
        &[r#"{"name":"Ada","language":"english"}"#, r#""casual""#],
    );
    assert_eq!(out["result"]["message"], "Hi, Ada!", "{out}");
    corral.await_logged("released the pool's resident memory", 1);
}
