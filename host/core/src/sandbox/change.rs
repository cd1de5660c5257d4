//! What a new version of a component changes for the workflows that call
//! it: activity types added, removed and changed, and which changes break a
//! caller written against the old one, with where and why. A caller sends
//! JSON arguments and reads a JSON result (`convert`), so a change breaks it
//! when the new version refuses an input the old one took (a new required
//! field, a removed field or case, another type) or returns what the old one
//! never did (a new case, a removed field, another type). Also the imports
//! added and removed.

use std::collections::BTreeSet;

use wasmtime::component::types::Type;

use super::component::LoadedComponent;
use super::signature::{ActivityDescription, ActivityType, render};

/// The changes from one version of a component to another.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeReport {
    pub added: Vec<ActivityDescription>,
    /// Breaks every caller of it.
    pub removed: Vec<String>,
    pub changed: Vec<Changed>,
    pub imports_added: Vec<String>,
    pub imports_removed: Vec<String>,
}

/// An activity type whose signature changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    pub name: String,
    pub old: String,
    pub new: String,
    /// Why a caller of the old signature breaks; empty when none does
    /// (e.g. a new optional field in a parameter).
    pub breaking: Vec<String>,
}

impl ChangeReport {
    /// What `new` changes from `old`.
    pub fn between(old: &LoadedComponent, new: &LoadedComponent) -> ChangeReport {
        let mut report = ChangeReport::default();
        for activity in &new.activities {
            let Some(before) = old.activity(&activity.name) else {
                report.added.push(activity.describe());
                continue;
            };
            let (was, is) = (before.signature(), activity.signature());
            if was != is {
                report.changed.push(Changed {
                    name: activity.name.to_string(),
                    old: was,
                    new: is,
                    breaking: breaking(before, activity),
                });
            }
        }
        report.removed = old
            .activities
            .iter()
            .filter(|a| new.activity(&a.name).is_none())
            .map(|a| a.name.to_string())
            .collect();
        let (was, is): (BTreeSet<&String>, BTreeSet<&String>) =
            (old.imports.iter().collect(), new.imports.iter().collect());
        report.imports_added = is.difference(&was).map(|s| (*s).clone()).collect();
        report.imports_removed = was.difference(&is).map(|s| (*s).clone()).collect();
        report
    }

    /// Whether a caller of the old version breaks.
    pub fn breaks_callers(&self) -> bool {
        !self.removed.is_empty() || self.changed.iter().any(|c| !c.breaking.is_empty())
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        *self == ChangeReport::default()
    }
}

/// Which way a value flows: into the guest (a caller's argument) or out
/// of it (the result a caller reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    In,
    Out,
}

/// Why a caller of `old` breaks calling `new`.
pub fn breaking(old: &ActivityType, new: &ActivityType) -> Vec<String> {
    let mut why = Vec::new();
    if old.params.len() != new.params.len() {
        why.push(format!(
            "takes {} argument(s), was {}",
            new.params.len(),
            old.params.len()
        ));
    } else {
        for ((name, was), (_, is)) in old.params.iter().zip(&new.params) {
            compare(was, is, Flow::In, &format!("parameter `{name}`"), &mut why);
        }
    }
    match (&old.result, &new.result) {
        (Some(was), Some(is)) => compare(was, is, Flow::Out, "the result", &mut why),
        (None, None) => {}
        (Some(_), None) => why.push("returns nothing now".into()),
        (None, Some(is)) => why.push(format!("returns {} now", render(is))),
    }
    why
}

/// Why a value of type `old` flowing `flow` breaks as `new` (`at` names
/// where it is, e.g. `parameter \`who\``).
pub fn type_changes(old: &Type, new: &Type, flow: Flow, at: &str) -> Vec<String> {
    let mut why = Vec::new();
    compare(old, new, flow, at, &mut why);
    why
}

/// Adds to `why` each way a value of `old` flowing `flow` breaks as `new`.
fn compare(old: &Type, new: &Type, flow: Flow, at: &str, why: &mut Vec<String>) {
    let other = || format!("{at}: {} became {}", render(old), render(new));
    match (old, new) {
        (Type::List(a), Type::List(b)) => compare(&a.ty(), &b.ty(), flow, &format!("{at}[]"), why),
        (Type::Option(a), Type::Option(b)) => compare(&a.ty(), &b.ty(), flow, at, why),
        (Type::Record(a), Type::Record(b)) => {
            let was: Vec<(&str, Type)> = a.fields().map(|f| (f.name, f.ty)).collect();
            let is: Vec<(&str, Type)> = b.fields().map(|f| (f.name, f.ty)).collect();
            for (name, ty) in &is {
                match was.iter().find(|(n, _)| n == name) {
                    Some((_, before)) => {
                        compare(before, ty, flow, &format!("{at}.{name}"), why);
                    }
                    None if flow == Flow::In && !matches!(ty, Type::Option(_)) => {
                        why.push(format!("{at}: new required field `{name}`"));
                    }
                    None => {}
                }
            }
            for (name, _) in was.iter().filter(|(n, _)| !is.iter().any(|(m, _)| m == n)) {
                why.push(match flow {
                    Flow::In => {
                        format!("{at}: field `{name}` removed (a caller sending it is refused)")
                    }
                    Flow::Out => format!("{at}: field `{name}` removed"),
                });
            }
        }
        (Type::Variant(a), Type::Variant(b)) => {
            let was: Vec<(&str, Option<Type>)> = a.cases().map(|c| (c.name, c.ty)).collect();
            let is: Vec<(&str, Option<Type>)> = b.cases().map(|c| (c.name, c.ty)).collect();
            cases(&was, &is, flow, at, why);
        }
        (Type::Enum(a), Type::Enum(b)) => {
            let was: Vec<(&str, Option<Type>)> = a.names().map(|n| (n, None)).collect();
            let is: Vec<(&str, Option<Type>)> = b.names().map(|n| (n, None)).collect();
            cases(&was, &is, flow, at, why);
        }
        (Type::Flags(a), Type::Flags(b)) => {
            let was: Vec<(&str, Option<Type>)> = a.names().map(|n| (n, None)).collect();
            let is: Vec<(&str, Option<Type>)> = b.names().map(|n| (n, None)).collect();
            cases(&was, &is, flow, at, why);
        }
        (Type::Tuple(a), Type::Tuple(b)) => {
            let (was, is): (Vec<Type>, Vec<Type>) = (a.types().collect(), b.types().collect());
            if was.len() == is.len() {
                for (i, (x, y)) in was.iter().zip(&is).enumerate() {
                    compare(x, y, flow, &format!("{at}.{i}"), why);
                }
            } else {
                why.push(other());
            }
        }
        (Type::Result(a), Type::Result(b)) => {
            for (part, x, y) in [("ok", a.ok(), b.ok()), ("err", a.err(), b.err())] {
                match (x, y) {
                    (Some(x), Some(y)) => compare(&x, &y, flow, &format!("{at}.{part}"), why),
                    (None, None) => {}
                    _ => {
                        why.push(other());
                        return;
                    }
                }
            }
        }
        _ if render(old) == render(new) => {}
        _ => why.push(other()),
    }
}

/// A variant's, enum's or flags' cases: one a caller sends must still be
/// there; one the guest returns must be one the caller knows.
fn cases(
    was: &[(&str, Option<Type>)],
    is: &[(&str, Option<Type>)],
    flow: Flow,
    at: &str,
    why: &mut Vec<String>,
) {
    for (name, ty) in is {
        match was.iter().find(|(n, _)| n == name) {
            Some((_, before)) => match (before, ty) {
                (Some(x), Some(y)) => compare(x, y, flow, &format!("{at}.{name}"), why),
                (None, None) => {}
                _ => why.push(format!("{at}: case `{name}` changed its payload")),
            },
            None if flow == Flow::Out => {
                why.push(format!(
                    "{at}: new case `{name}` (a caller may not know it)"
                ));
            }
            None => {}
        }
    }
    if flow == Flow::In {
        for (name, _) in was.iter().filter(|(n, _)| !is.iter().any(|(m, _)| m == n)) {
            why.push(format!(
                "{at}: case `{name}` removed (a caller sending it is refused)"
            ));
        }
    }
}
