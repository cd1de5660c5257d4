//! A tenant's CPU share, validated: what it is guaranteed when tenants
//! compete (its weight against theirs) and what it may never exceed (a cap
//! in cores), and what a task used. A leaf: the tenant's policy
//! (`sandbox::tenant`), the scheduler (`session::cpu`) and the metrics all
//! read it.

use std::time::Duration;

/// A tenant's weight: when several tenants want more CPU than the host
/// has, each gets the cores in proportion to its weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuWeight(u32);

impl CpuWeight {
    /// Every tenant's weight unless configured: equal shares.
    pub const DEFAULT: CpuWeight = CpuWeight(100);
    pub const MIN: u32 = 1;
    pub const MAX: u32 = 10_000;

    pub fn new(weight: i64) -> Result<CpuWeight, CpuPolicyError> {
        match u32::try_from(weight) {
            Ok(w) if (Self::MIN..=Self::MAX).contains(&w) => Ok(CpuWeight(w)),
            _ => Err(CpuPolicyError::Weight(weight)),
        }
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

impl Default for CpuWeight {
    fn default() -> Self {
        CpuWeight::DEFAULT
    }
}

/// A hard cap: at most this many cores' worth of CPU time in every window
/// (as cgroups' `cpu.max`), held in thousandths of a core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuMax(u32);

impl CpuMax {
    /// The smallest cap: a hundredth of a core.
    pub const MIN_CORES: f64 = 0.01;
    /// The largest cap, far beyond any host.
    pub const MAX_CORES: f64 = 1024.0;

    pub fn from_cores(cores: f64) -> Result<CpuMax, CpuPolicyError> {
        if !(Self::MIN_CORES..=Self::MAX_CORES).contains(&cores) {
            return Err(CpuPolicyError::Max(cores));
        }
        // In range: at most 1,024,000, and at least 10.
        Ok(CpuMax((cores * 1000.0).round() as u32))
    }

    /// Thousandths of a core.
    pub fn millicores(self) -> u32 {
        self.0
    }

    pub fn cores(self) -> f64 {
        f64::from(self.0) / 1000.0
    }
}

/// How a tenant shares the host's cores with the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuShare {
    pub weight: CpuWeight,
    /// None: no cap beyond what its weight and the others leave it.
    pub max: Option<CpuMax>,
}

/// What one task's execution cost in CPU, and waited for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuUse {
    pub cpu: Duration,
    /// Runnable, but waiting for a slot (or for its cap's next window).
    pub waited: Duration,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CpuPolicyError {
    #[error("must be a whole number from {min} to {max}, got {0}", min = CpuWeight::MIN, max = CpuWeight::MAX)]
    Weight(i64),
    #[error("must be from {min} to {max} cores, got {0}", min = CpuMax::MIN_CORES, max = CpuMax::MAX_CORES)]
    Max(f64),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_and_caps_are_checked_and_kept_exactly() {
        assert_eq!(CpuWeight::new(1).unwrap().get(), 1);
        assert_eq!(CpuWeight::new(10_000).unwrap().get(), 10_000);
        for bad in [0, -1, 10_001, i64::MAX] {
            assert_eq!(CpuWeight::new(bad), Err(CpuPolicyError::Weight(bad)));
        }
        assert_eq!(CpuMax::from_cores(0.5).unwrap().millicores(), 500);
        assert_eq!(CpuMax::from_cores(2.0).unwrap().cores(), 2.0);
        for bad in [0.0, 0.001, -1.0, 1025.0, f64::NAN, f64::INFINITY] {
            assert!(CpuMax::from_cores(bad).is_err(), "{bad}");
        }
        assert!(
            CpuMax::from_cores(0.0)
                .unwrap_err()
                .to_string()
                .contains("must be from 0.01 to 1024 cores, got 0")
        );
    }
}
