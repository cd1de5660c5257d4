//! Per-task limits and the store's resource limiter that enforces the
//! memory, table and instance limits and remembers which one was hit, so the
//! failure names the limit and its value.

use std::fmt;
use std::time::Duration;

use wasmtime::ResourceLimiter;

/// Limits applied to every task of a tenant (overridable per task type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Linear memory per instance, in bytes.
    pub memory: u64,
    /// Elements per table.
    pub table_elements: u64,
    /// Core and component instances one task may create.
    pub instances: usize,
    /// Wall-clock time per attempt. `None`: no host deadline.
    pub timeout: Option<Duration>,
    /// CPU budget per attempt, in wasmtime fuel units. `None`: unmetered.
    pub fuel: Option<u64>,
    /// Total size of the JSON arguments, in bytes.
    pub max_input: usize,
    /// Size of the JSON result (and of each heartbeat's details), in bytes.
    pub max_output: usize,
    /// Guest stdout + stderr captured per task; the excess is dropped and
    /// counted.
    pub max_stdio: usize,
    /// How long a cancelled guest may take to stop on its own before it is
    /// interrupted.
    pub cancel_grace: Duration,
    /// Handles a task may hold at once (open files and directories, streams,
    /// HTTP requests and responses, pollables): each may pin a host file
    /// descriptor or buffer. One more fails in the guest.
    pub max_handles: usize,
    /// Outbound HTTP requests one task may send; more fail in the guest
    /// (`connection-limit-reached`).
    pub max_http_requests: u32,
    /// Bytes of outbound HTTP bodies one task may send and receive, both
    /// directions together; a body that would pass it fails in the guest
    /// (`HTTP-request-body-size` / `HTTP-response-body-size`).
    pub max_http_bytes: u64,
}

/// A tenant's wall-clock time per attempt unless it says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// The defaults of a tenant's limits, stated once: `corral serve`'s
/// configuration, `corral test` files, `corral run`, `corral dev` and the
/// test harness all start from these (`docs/operating-safely.md` lists them;
/// a test holds the two together).
impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory: 128 << 20,
            table_elements: 100_000,
            instances: 256,
            timeout: Some(DEFAULT_TIMEOUT),
            fuel: None,
            max_input: 4 << 20,
            max_output: 4 << 20,
            max_stdio: 1 << 20,
            cancel_grace: Duration::from_secs(5),
            max_handles: 1024,
            max_http_requests: 100,
            max_http_bytes: 64 << 20,
        }
    }
}

/// Why a byte size or a duration written by an operator was refused; the
/// text is quoted back as it was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("`{0}` is not a byte size (examples: 64MiB, 512KiB, 4096)")]
    NotBytes(String),
    #[error("`{text}`: unknown unit `{unit}` (use B, KiB, MiB, GiB, KB, MB or GB)")]
    ByteUnit { text: String, unit: String },
    #[error("`{0}` is too large")]
    TooLarge(String),
    #[error("`{0}` is not a duration (examples: 250ms, 5s, 2m, 1h)")]
    NotDuration(String),
    #[error("`{0}` needs a unit: ms, s, m or h")]
    NoTimeUnit(String),
    #[error("`{text}`: unknown unit `{unit}` (use ms, s, m or h)")]
    TimeUnit { text: String, unit: String },
}

/// Parses a byte size such as `64MiB`, `512KiB`, `1GiB`, `1MB` or `4096`.
pub fn parse_bytes(text: &str) -> Result<u64, QuantityError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '_')
        .unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let number: u64 = digits
        .replace('_', "")
        .parse()
        .map_err(|_| QuantityError::NotBytes(text.to_owned()))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(QuantityError::ByteUnit {
                text: text.to_owned(),
                unit: other.to_owned(),
            });
        }
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| QuantityError::TooLarge(text.to_owned()))
}

/// Parses a duration such as `250ms`, `5s`, `2m` or `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, QuantityError> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| QuantityError::NotDuration(text.to_owned()))?;
    let duration = match unit {
        "ms" => Duration::from_millis(number),
        "s" => Duration::from_secs(number),
        "m" => Duration::from_secs(number.saturating_mul(60)),
        "h" => Duration::from_secs(number.saturating_mul(3600)),
        "" => return Err(QuantityError::NoTimeUnit(text.to_owned())),
        other => {
            return Err(QuantityError::TimeUnit {
                text: text.to_owned(),
                unit: other.to_owned(),
            });
        }
    };
    Ok(duration)
}

/// Renders a byte count the way an operator wrote it: `64 MiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, scale) in UNITS {
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{} {unit}", bytes / scale);
        }
    }
    format!("{bytes} bytes")
}

/// Which limit a guest ran into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Breach {
    Memory { limit: u64, desired: u64 },
    Table { limit: u64, desired: u64 },
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Breach::Memory { limit, desired } => write!(
                f,
                "linear memory limit of {} exceeded: the guest tried to grow its memory to {} in all",
                format_bytes(*limit),
                format_bytes(*desired)
            ),
            Breach::Table { limit, desired } => write!(
                f,
                "table limit of {limit} elements exceeded: the guest tried to grow a table to {desired}"
            ),
        }
    }
}

/// The error a limiter raises to stop the guest at the breach; the limiter
/// also keeps the breach so classification does not depend on how the guest
/// reacts to it.
#[derive(Debug)]
pub struct LimitExceeded(pub Breach);

impl fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for LimitExceeded {}

/// The store's [`ResourceLimiter`].
#[derive(Debug)]
pub struct Limiter {
    memory: u64,
    /// Bytes of linear memory all of the task's memories hold together: the
    /// memory limit covers them all (a component may define several).
    memory_in_use: u64,
    table_elements: u64,
    instances: usize,
    /// The first limit the guest ran into, if any.
    pub breach: Option<Breach>,
}

impl Limiter {
    pub fn new(limits: &Limits) -> Self {
        Limiter {
            memory: limits.memory,
            memory_in_use: 0,
            table_elements: limits.table_elements,
            instances: limits.instances,
            breach: None,
        }
    }

    /// Carries over what a warm instance's memories hold: they keep it
    /// into the next task, and the limit covers it there too.
    pub(crate) fn carry(&mut self, previous: &Limiter) {
        self.memory_in_use = previous.memory_in_use;
    }

    fn breached(&mut self, breach: Breach) -> wasmtime::Result<bool> {
        self.breach.get_or_insert(breach.clone());
        Err(wasmtime::Error::new(LimitExceeded(breach)))
    }
}

impl ResourceLimiter for Limiter {
    /// Called when a memory is created (from 0) and whenever it grows.
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let growth = (desired as u64).saturating_sub(current as u64);
        let total = self.memory_in_use.saturating_add(growth);
        if total > self.memory {
            return self.breached(Breach::Memory {
                limit: self.memory,
                desired: total,
            });
        }
        self.memory_in_use = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let desired = desired as u64;
        if desired > self.table_elements {
            return self.breached(Breach::Table {
                limit: self.table_elements,
                desired,
            });
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        self.instances
    }

    fn tables(&self) -> usize {
        self.instances
    }

    fn memories(&self) -> usize {
        self.instances
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("512KiB"), Ok(512 << 10));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("2MB"), Ok(2_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        let err = parse_bytes("64mb").unwrap_err().to_string();
        assert!(err.contains("unknown unit `mb`"), "{err}");
        assert_eq!(
            parse_bytes("lots"),
            Err(QuantityError::NotBytes("lots".into()))
        );
        assert_eq!(
            parse_bytes("99999999999GiB"),
            Err(QuantityError::TooLarge("99999999999GiB".into()))
        );
    }

    #[test]
    fn durations_parse_and_require_a_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        let err = parse_duration("5").unwrap_err().to_string();
        assert!(err.contains("needs a unit"), "{err}");
        let err = parse_duration("5d").unwrap_err().to_string();
        assert!(err.contains("unknown unit `d`"), "{err}");
    }

    #[test]
    fn the_memory_limit_covers_all_memories_together() {
        let limits = Limits {
            memory: 4 << 20,
            ..Limits::default()
        };
        let mut limiter = Limiter::new(&limits);
        // Two memories of 2 MiB each fit; a third MiB in either does not.
        assert!(limiter.memory_growing(0, 2 << 20, None).unwrap());
        assert!(limiter.memory_growing(0, 2 << 20, None).unwrap());
        let err = limiter.memory_growing(2 << 20, 3 << 20, None).unwrap_err();
        assert!(err.to_string().contains("to 5 MiB in all"), "{err}");
    }

    #[test]
    fn the_limiter_remembers_the_first_breach_and_names_it() {
        let limits = Limits {
            memory: 1 << 20,
            ..Limits::default()
        };
        let mut limiter = Limiter::new(&limits);
        assert!(limiter.memory_growing(0, 1 << 20, None).unwrap());
        let err = limiter.memory_growing(1 << 20, 2 << 20, None).unwrap_err();
        assert!(err.to_string().contains("limit of 1 MiB exceeded"), "{err}");
        assert!(err.to_string().contains("to 2 MiB"), "{err}");
        assert!(limiter.table_growing(0, 200_000, None).is_err());
        assert_eq!(
            limiter.breach,
            Some(Breach::Memory {
                limit: 1 << 20,
                desired: 2 << 20
            })
        );
    }
}
