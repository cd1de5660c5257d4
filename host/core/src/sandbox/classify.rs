//! Turning the way a guest call ended into exactly one failure class.

use serde_json::{Value, json};
use wasmtime::component::ResourceTableError;
use wasmtime::{Trap, WasmBacktrace};
use wasmtime_wasi::I32Exit;

use super::context::ContractViolation;
use super::failure::{Failure, FailureClass, RetryPolicy};
use super::limits::{Breach, LimitExceeded, format_bytes};
use crate::shown::shown;

/// Most backtrace frames named in a message.
const MAX_FRAMES: usize = 12;
/// Longest function name kept in a message: the guest chooses its names.
pub(crate) const MAX_NAME: usize = 200;

/// What the task knew when the guest call failed.
pub(crate) struct Evidence<'a> {
    pub breach: Option<&'a Breach>,
    pub fuel: Option<u64>,
    /// The tenant's output limit, which bounds what one host call may carry.
    pub max_output: usize,
    /// The tenant's limit of handles a task may hold.
    pub max_handles: usize,
    /// The end of the guest's stderr (a panic message, typically).
    pub stderr_tail: String,
    /// Whether the error came from the guest's call after its code ran
    /// there: an error then with no trap and no guest frame is wasmtime
    /// refusing what the guest handed across the boundary.
    pub handed: bool,
}

/// Classifies an error returned by instantiation or by a guest call.
pub(crate) fn classify(
    error: &wasmtime::Error,
    evidence: &Evidence<'_>,
    policy: &RetryPolicy,
) -> Failure {
    let frames = backtrace(error);
    // Whether wasm was on the stack when the error arose, named frames or
    // not: a stripped guest's frames have no names, and it misuses the host
    // as surely as one with names.
    let in_guest = error
        .downcast_ref::<WasmBacktrace>()
        .is_some_and(|trace| !trace.frames().is_empty());
    let trap = error.downcast_ref::<Trap>().copied();
    let with_trace = |mut details: Value| {
        if !frames.is_empty() {
            details["backtrace"] = json!(frames);
        }
        details
    };

    // A limit breach wins over whatever the guest did next (a Rust guest
    // aborts with `unreachable` when an allocation fails).
    if let Some(breach) = evidence
        .breach
        .or_else(|| error.downcast_ref::<LimitExceeded>().map(|l| &l.0))
    {
        let (limit, value) = match breach {
            Breach::Memory { limit, .. } => ("memory", format_bytes(*limit)),
            Breach::Table { limit, .. } => ("table_elements", limit.to_string()),
        };
        return Failure::new(FailureClass::ResourceExhausted, policy, breach.to_string())
            .with_details(with_trace(json!({ "limit": limit, "value": value })));
    }
    if let Some(ResourceTableError::Full) = error.downcast_ref::<ResourceTableError>() {
        return Failure::new(
            FailureClass::ResourceExhausted,
            policy,
            format!(
                "the guest holds its limit of {} handles (open files, streams, requests) and asked for another",
                evidence.max_handles
            ),
        )
        .with_details(with_trace(
            json!({ "limit": "max_handles", "value": evidence.max_handles }),
        ));
    }
    if is_hostcall_fuel_exhausted(error) {
        return Failure::new(
            FailureClass::InvalidOutput,
            policy,
            format!(
                "the guest passed the host more data in one call than its output limit of {} allows",
                format_bytes(evidence.max_output as u64)
            ),
        )
        .with_details(with_trace(
            json!({ "limit": "max_output", "value": format_bytes(evidence.max_output as u64) }),
        ));
    }
    if let Some(violation) = error.downcast_ref::<ContractViolation>() {
        return Failure::new(FailureClass::InvalidOutput, policy, violation.to_string());
    }
    if let Some(exit) = error.downcast_ref::<I32Exit>() {
        return Failure::new(
            FailureClass::Trap,
            policy,
            format!(
                "the guest called exit (status {}) instead of returning",
                exit.0
            ),
        )
        .with_details(json!({ "exit_code": exit.0 }));
    }
    let location = match frames
        .iter()
        .find(|f| !is_runtime_frame(f))
        .or(frames.first())
    {
        Some(function) => format!(" in `{function}`"),
        None => String::new(),
    };
    match trap {
        Some(Trap::OutOfFuel) => {
            let budget = evidence
                .fuel
                .map_or("its".to_owned(), |f| format!("the {f}"));
            Failure::new(
                FailureClass::ResourceExhausted,
                policy,
                format!("the guest used up {budget} fuel budget (CPU limit){location}"),
            )
            .with_details(with_trace(
                json!({ "limit": "fuel", "value": evidence.fuel }),
            ))
        }
        Some(Trap::UnreachableCodeReached) => {
            let said = if evidence.stderr_tail.is_empty() {
                String::new()
            } else {
                format!(": {}", last_lines(&evidence.stderr_tail, 3))
            };
            Failure::new(
                FailureClass::Panic,
                policy,
                format!("the guest panicked (wasm `unreachable`){location}{said}"),
            )
            .with_details(with_trace(json!({ "trap": "UnreachableCodeReached" })))
        }
        Some(trap) => {
            let what = match trap {
                Trap::StackOverflow => "the guest overflowed its stack".to_owned(),
                other => format!("the guest trapped: {other}"),
            };
            let what = match recursion(&frames) {
                Some(function) => format!("{what} (runaway recursion in `{function}`?)"),
                None => what,
            };
            Failure::new(FailureClass::Trap, policy, format!("{what}{location}"))
                .with_details(with_trace(json!({ "trap": format!("{trap:?}") })))
        }
        // The guest was running (wasm frames exist) when a host function
        // raised an error: the guest misused the host. Its own fault, never
        // the host's, and not retried.
        None if in_guest => Failure::new(
            FailureClass::Trap,
            policy,
            format!(
                "the guest called the host incorrectly: {}{location}",
                host_message(error)
            ),
        )
        .with_details(with_trace(json!({}))),
        // No trap and no guest frame, in the call after the guest's code
        // ran: wasmtime refused what the guest handed across the component
        // boundary outside its code (a result's pointer or length past its
        // memory, an invalid discriminant or UTF-8, a `realloc` answering
        // out of bounds). The guest's own fault, as the same value handed
        // to a host function is (above): retrying would fail the same way.
        // The host's own shortages stay `Host`, retryable.
        None if evidence.handed && !host_shortage(error) => Failure::new(
            FailureClass::InvalidOutput,
            policy,
            format!(
                "the guest handed the host a value the component model cannot read: {}",
                host_message(error)
            ),
        ),
        None => Failure::new(
            FailureClass::Host,
            policy,
            shown(&format!("{error:#}"), MAX_HOST_MESSAGE),
        ),
    }
}

/// Whether wasmtime failed for want of something the host provides
/// (memory, a fiber stack or other pool slot), whatever the guest did.
fn host_shortage(error: &wasmtime::Error) -> bool {
    error.downcast_ref::<wasmtime::OutOfMemory>().is_some()
        || error
            .downcast_ref::<wasmtime::PoolConcurrencyLimitError>()
            .is_some()
}

/// What the host said when it refused a guest's call: the error's causes
/// without wasmtime's backtrace context (which lists every guest-chosen
/// frame name), bounded.
fn host_message(error: &wasmtime::Error) -> String {
    // wasmtime attaches the backtrace as the outermost context.
    let skip = usize::from(error.downcast_ref::<WasmBacktrace>().is_some());
    let causes: Vec<String> = error.chain().skip(skip).map(ToString::to_string).collect();
    shown(&causes.join(": "), MAX_HOST_MESSAGE)
}

/// Longest host message kept in a failure.
const MAX_HOST_MESSAGE: usize = 500;

/// Whether wasmtime refused to lift what the guest passed the host because
/// it exceeded the store's hostcall fuel (`Store::set_hostcall_fuel`). Its
/// error type is private, so it is known by its message; the hostile suite's
/// large-result test fails if a wasmtime upgrade changes it.
fn is_hostcall_fuel_exhausted(error: &wasmtime::Error) -> bool {
    error
        .chain()
        .any(|cause| cause.to_string().contains("fuel allocated for hostcalls"))
}

fn backtrace(error: &wasmtime::Error) -> Vec<String> {
    let Some(trace) = error.downcast_ref::<WasmBacktrace>() else {
        return Vec::new();
    };
    trace
        .frames()
        .iter()
        .filter_map(|frame| frame.func_name())
        .take(MAX_FRAMES)
        .map(|name| shown(&format!("{:#}", rustc_demangle::demangle(name)), MAX_NAME))
        .collect()
}

/// Most names a message lists (activity types a task could have named).
const MAX_LISTED: usize = 20;

/// A guest- or caller-chosen name as a message shows it: escaped, at most
/// [`MAX_NAME`] bytes.
pub fn shown_name(name: &str) -> String {
    shown(name, MAX_NAME)
}

/// Names as a message lists them: each [`shown_name`], at most 20, then
/// how many more there are.
pub fn listed_names<'a>(names: impl ExactSizeIterator<Item = &'a str>) -> String {
    let more = names.len().saturating_sub(MAX_LISTED);
    let mut listed: Vec<String> = names.take(MAX_LISTED).map(shown_name).collect();
    if more > 0 {
        listed.push(format!("and {more} more"));
    }
    listed.join(", ")
}

/// The function filling the whole backtrace, when every recorded frame is
/// the same one: the signature of unbounded recursion (a Rust guest's shadow
/// stack runs out as an out-of-bounds access, not a stack overflow).
fn recursion(frames: &[String]) -> Option<&str> {
    let first = frames.first()?;
    (frames.len() >= MAX_FRAMES && frames.iter().all(|f| f == first)).then_some(first.as_str())
}

/// Frames of the language runtime (panic and abort machinery), skipped when
/// naming where a guest failed.
fn is_runtime_frame(name: &str) -> bool {
    const RUNTIME: &[&str] = &[
        "std::",
        "core::",
        "alloc::",
        "__rust",
        "rust_panic",
        "abort",
        "panic_abort::",
        "__rdl_",
        "__rg_",
        "<&T as core::",
        "wit_bindgen",
    ];
    RUNTIME.iter().any(|prefix| name.starts_with(prefix))
}

/// The last `n` meaningful lines of a guest's stderr, joined. Rust's
/// "note: run with `RUST_BACKTRACE=1`" hint is dropped: it cannot apply.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"))
        .map(|l| match l.strip_prefix("thread '") {
            Some(rest) => rest.split_once(") ").map_or(l, |(_, msg)| msg),
            None => l,
        })
        .collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(handed: bool) -> Evidence<'static> {
        Evidence {
            breach: None,
            fuel: None,
            max_output: 1 << 20,
            max_handles: 16,
            stderr_tail: String::new(),
            handed,
        }
    }

    #[test]
    fn what_the_guest_handed_is_its_own_output_and_the_hosts_shortages_stay_the_hosts() {
        let policy = RetryPolicy::default();
        let unreadable = || wasmtime::format_err!("string pointer/length out of bounds of memory");
        // After the guest's code ran in its call: its value.
        let failure = classify(&unreadable(), &evidence(true), &policy);
        assert_eq!(failure.class, FailureClass::InvalidOutput, "{failure}");
        assert!(!failure.retryable);
        assert!(failure.message.contains("out of bounds"), "{failure}");
        // Before it ran (lowering the host's own arguments, instantiating):
        // the host's.
        let failure = classify(&unreadable(), &evidence(false), &policy);
        assert_eq!(failure.class, FailureClass::Host, "{failure}");
        // Memory the host could not find is the host's, whenever.
        let oom = wasmtime::Error::new(wasmtime::OutOfMemory::new(4096));
        let failure = classify(&oom, &evidence(true), &policy);
        assert_eq!(failure.class, FailureClass::Host, "{failure}");
        assert!(failure.retryable);
    }

    #[test]
    fn a_list_of_names_names_twenty_each_cut_and_counts_the_rest() {
        let long = "n".repeat(1000);
        let names: Vec<String> = (0..500).map(|i| format!("{long}{i}")).collect();
        let listed = listed_names(names.iter().map(String::as_str));
        assert!(
            listed.ends_with(", and 480 more"),
            "{}",
            &listed[listed.len() - 40..]
        );
        assert_eq!(listed.matches(", ").count(), MAX_LISTED);
        // Each name cut to the bound: the list is a few KiB, not 500 KB.
        assert!(listed.len() < MAX_LISTED * 256, "{} bytes", listed.len());
        let few = listed_names(["a", "b\nc"].into_iter());
        assert_eq!(few, "a, b\\nc");
    }
}
