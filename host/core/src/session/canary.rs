//! A canary: a candidate version of a deployment takes a share of its
//! tasks while the active version takes the rest, and each side's outcomes
//! are counted by class, so the control plane can ramp the share up or
//! roll the candidate back. Each activity type takes its share on its own
//! (a workflow calling A then B at 50 % runs both on both sides). A task takes its side when it is routed, so a
//! change of share or a roll-back never moves a task that is running.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::sandbox::{FailureClass, Outcome};

/// The most a share can be: parts per thousand.
pub const WHOLE: u32 = 1000;

/// Which version of a canary's deployment a task ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Active,
    Candidate,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Active => "active",
            Side::Candidate => "candidate",
        }
    }
}

/// Finished tasks of one side: completed, and failed by class.
#[derive(Debug, Default)]
pub struct Tally {
    completed: AtomicU64,
    failed: [AtomicU64; FailureClass::ALL.len()],
}

/// A [`Tally`] read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub completed: u64,
    /// By class, in [`FailureClass::ALL`]'s order.
    pub failed: [u64; FailureClass::ALL.len()],
}

impl Counts {
    /// Every finished task.
    pub fn tasks(&self) -> u64 {
        self.completed + self.failed.iter().sum::<u64>()
    }

    /// The failures of `class`.
    pub fn of(&self, class: FailureClass) -> u64 {
        self.failed[index(class)]
    }
}

fn index(class: FailureClass) -> usize {
    FailureClass::ALL
        .iter()
        .position(|c| *c == class)
        .unwrap_or(FailureClass::ALL.len() - 1)
}

impl Tally {
    fn record(&self, outcome: &Outcome) {
        match outcome {
            Ok(_) => &self.completed,
            Err(f) => &self.failed[index(f.class)],
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    pub fn counts(&self) -> Counts {
        Counts {
            completed: self.completed.load(Ordering::Relaxed),
            failed: std::array::from_fn(|i| self.failed[i].load(Ordering::Relaxed)),
        }
    }
}

/// How a deployment's tasks are split between its active version and a
/// candidate, and what each side's tasks came to.
#[derive(Debug)]
pub struct Split {
    /// Parts per thousand to the candidate.
    share: AtomicU32,
    active: Tally,
    candidate: Tally,
}

/// One activity type's tasks routed so far under a split: the split is
/// exact over any run of a type's tasks, not drawn at random.
#[derive(Debug, Default)]
pub struct Routed(AtomicU64);

impl Split {
    /// A split sending `share` parts per thousand (at most [`WHOLE`]) of
    /// the tasks to the candidate.
    pub fn new(share: u32) -> Split {
        Split {
            share: AtomicU32::new(share.min(WHOLE)),
            active: Tally::default(),
            candidate: Tally::default(),
        }
    }

    pub fn share(&self) -> u32 {
        self.share.load(Ordering::Relaxed)
    }

    /// The next tasks go to the candidate at this share.
    pub fn set_share(&self, share: u32) {
        self.share.store(share.min(WHOLE), Ordering::Relaxed);
    }

    /// The side the next task of a type runs on: the candidate whenever
    /// its share of that type's tasks routed so far, rounded down, grows by
    /// this one.
    pub fn take(&self, routed: &Routed) -> Side {
        let n = routed.0.fetch_add(1, Ordering::Relaxed);
        let share = u64::from(self.share());
        if (n + 1) * share / u64::from(WHOLE) > n * share / u64::from(WHOLE) {
            Side::Candidate
        } else {
            Side::Active
        }
    }

    /// Counts a finished task of `side`.
    pub fn record(&self, side: Side, outcome: &Outcome) {
        match side {
            Side::Active => &self.active,
            Side::Candidate => &self.candidate,
        }
        .record(outcome);
    }

    /// Each side's finished tasks: (active, candidate).
    pub fn counts(&self) -> (Counts, Counts) {
        (self.active.counts(), self.candidate.counts())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{Failure, RetryPolicy};

    #[test]
    fn a_split_sends_exactly_its_share_over_any_run_of_tasks() {
        for share in [0, 1, 100, 250, 500, 999, WHOLE] {
            let (split, routed) = (Split::new(share), Routed::default());
            let candidate = (0..4000)
                .filter(|_| split.take(&routed) == Side::Candidate)
                .count();
            assert_eq!(candidate as u32, share * 4, "share {share}");
        }
        let (half, a, b) = (Split::new(500), Routed::default(), Routed::default());
        // Types alternating (A, B, A, B): each still splits on its own.
        let sides: Vec<(Side, Side)> = (0..2).map(|_| (half.take(&a), half.take(&b))).collect();
        assert_eq!(
            sides,
            [
                (Side::Active, Side::Active),
                (Side::Candidate, Side::Candidate)
            ]
        );
        // A new share holds for the tasks after it.
        half.set_share(WHOLE);
        assert!((0..10).all(|_| half.take(&a) == Side::Candidate));
        half.set_share(0);
        assert!((0..10).all(|_| half.take(&a) == Side::Active));
    }

    #[test]
    fn each_side_counts_its_own_outcomes_by_class() {
        let split = Split::new(500);
        let panic = Err(Failure::new(
            FailureClass::Panic,
            &RetryPolicy::default(),
            "boom".to_owned(),
        ));
        split.record(Side::Candidate, &panic);
        split.record(Side::Candidate, &Ok(serde_json::json!("v3")));
        split.record(Side::Active, &Ok(serde_json::json!("v1")));
        let (active, candidate) = split.counts();
        assert_eq!((active.tasks(), active.completed), (1, 1));
        assert_eq!(candidate.tasks(), 2);
        assert_eq!(candidate.of(FailureClass::Panic), 1);
        assert_eq!(candidate.of(FailureClass::Trap), 0);
    }
}
