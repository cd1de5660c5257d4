//! What a replay found: per activity type, how many recorded attempts the
//! candidate ended as recorded, how the others differed, and what each
//! version cost per attempt.

use corral_core::shown::shown;

use super::Shadow;

/// A candidate's replay of its tenant's sample.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    pub types: Vec<TypeReplay>,
    /// The replay stopped at its time budget before every attempt ran.
    pub cut_short: bool,
}

/// One activity type's replay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypeReplay {
    pub name: String,
    /// Attempts compared: the active version ended them as recorded.
    pub replayed: u32,
    /// Of those, ended as recorded by the candidate too.
    pub agreed: u32,
    /// Attempts the active version did not repeat: not compared.
    pub unsteady: u32,
    /// Attempts that succeeded (or failed the guest's own way) when
    /// recorded and failed otherwise on the candidate.
    pub new_failures: u32,
    /// The first few differences.
    pub differences: Vec<String>,
    /// Mean fuel and wall time per attempt of each version.
    pub fuel_active: u64,
    pub fuel_candidate: u64,
    pub micros_active: u64,
    pub micros_candidate: u64,
}

/// Differences a report keeps per type.
pub const KEPT_DIFFERENCES: usize = 5;

impl TypeReplay {
    /// The percent of its compared attempts the candidate agreed on
    /// (100 with none compared).
    pub fn agreement(&self) -> u32 {
        (u64::from(self.agreed) * 100)
            .checked_div(u64::from(self.replayed))
            .map_or(100, |p| u32::try_from(p).unwrap_or(100))
    }
}

/// Types a reason names, at most; the rest are counted.
const MAX_NAMED: usize = 5;

impl Shadow {
    /// Why `report` holds its candidate, under a `min_agreement`: a type
    /// whose agreement is under it, a type with recorded attempts none of
    /// which could be compared (a replay proves nothing of it), or a replay
    /// cut short at its budget.
    pub fn holds(&self, report: &ReplayReport) -> Option<String> {
        let min = self.min_agreement()?;
        let mut under: Vec<String> = report
            .types
            .iter()
            .filter(|t| t.replayed == 0 || t.agreement() < min)
            .map(|t| {
                let name = shown(&t.name, 128);
                if t.replayed == 0 {
                    return format!(
                        "{name}: no recorded attempt could be compared ({} not compared: unsteady on the active version, failed by the host or cut off by the budget)",
                        t.unsteady
                    );
                }
                let first = t
                    .differences
                    .first()
                    .map(|d| format!("; {}", shown(d, 300)))
                    .unwrap_or_default();
                format!(
                    "{name} agreed on {} of {} recorded attempts ({}%){first}",
                    t.agreed,
                    t.replayed,
                    t.agreement()
                )
            })
            .collect();
        let more = under.len().saturating_sub(MAX_NAMED);
        under.truncate(MAX_NAMED);
        if more > 0 {
            under.push(format!("and {more} more type(s)"));
        }
        if report.cut_short {
            under.push("the replay stopped at its time budget".to_owned());
        }
        if under.is_empty() {
            return None;
        }
        Some(format!(
            "shadow replay under {min}% agreement: {}",
            under.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_type_under_the_minimum_holds_and_names_its_first_difference() {
        let policy = |min| {
            Shadow::new(
                &["*"],
                10,
                super::super::DEFAULT_EXPIRE,
                super::super::DEFAULT_MAX_BYTES,
                min,
            )
            .unwrap()
        };
        let report = ReplayReport {
            types: vec![
                TypeReplay {
                    name: "hold".into(),
                    replayed: 4,
                    agreed: 3,
                    differences: vec!["attempt 2: completed, now trap".into()],
                    ..TypeReplay::default()
                },
                TypeReplay {
                    name: "idle".into(),
                    ..TypeReplay::default()
                },
            ],
            cut_short: false,
        };
        assert_eq!(report.types[0].agreement(), 75);
        assert_eq!(policy(None).holds(&report), None);
        // A type whose attempts were all unsteady proves nothing: held.
        assert_eq!(
            policy(Some(75)).holds(&report).unwrap(),
            "shadow replay under 75% agreement: idle: no recorded attempt could be compared (0 not compared: unsteady on the active version, failed by the host or cut off by the budget)"
        );
        let compared = ReplayReport {
            types: report.types[..1].to_vec(),
            cut_short: false,
        };
        assert_eq!(policy(Some(75)).holds(&compared), None);
        assert_eq!(
            policy(Some(76)).holds(&compared).unwrap(),
            "shadow replay under 76% agreement: hold agreed on 3 of 4 recorded attempts (75%); attempt 2: completed, now trap"
        );
        let short = ReplayReport {
            cut_short: true,
            ..compared.clone()
        };
        assert_eq!(
            policy(Some(75)).holds(&short).unwrap(),
            "shadow replay under 75% agreement: the replay stopped at its time budget"
        );
        let many = ReplayReport {
            types: vec![report.types[0].clone(); 7],
            cut_short: false,
        };
        assert!(
            policy(Some(100))
                .holds(&many)
                .unwrap()
                .ends_with("(75%); attempt 2: completed, now trap, and 2 more type(s)")
        );
    }
}
