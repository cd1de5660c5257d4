//! `corral diff <old> <new> [--json]`: what a new version of a component
//! changes for the workflows that call it (see `corral_core::sandbox::ChangeReport`).

use std::process::ExitCode;

use corral::control::api::changes_to_proto;
use corral::control::proto;
use corral_core::sandbox::{ChangeReport, LoadedComponent, Sandbox};
use serde_json::{Value, json};

use super::{CacheArgs, RegistryArgs, error_exit, read_component, usage_error};

#[derive(clap::Args)]
pub struct Args {
    /// The version callers were written against: a file, or oci://….
    old: String,
    /// The candidate: a file, or oci://….
    new: String,
    /// Print `{"added":[{"name","signature"}],"removed":[…],"changed":[{"name","old","new","breaking":[…]}],
    /// "imports_added":[…],"imports_removed":[…],"breaks_callers":…}`.
    #[arg(long)]
    json: bool,
    /// Exit 1 when the change breaks a caller of the old version.
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    cache: CacheArgs,
    #[command(flatten)]
    registry: RegistryArgs,
}

pub async fn diff(args: Args) -> ExitCode {
    let sandbox = match Sandbox::new(args.cache.sandbox_config()) {
        Ok(sandbox) => sandbox,
        Err(e) => return usage_error(format!("{e:#}")),
    };
    let mut loaded = Vec::new();
    for source in [&args.old, &args.new] {
        match load(&sandbox, source, &args.registry).await {
            Ok(component) => loaded.push(component),
            Err(exit) => return exit,
        }
    }
    let report = ChangeReport::between(&loaded[0], &loaded[1]);
    let shown = changes_to_proto(String::new(), &report);
    if args.json {
        println!("{}", changes_json(&shown));
    } else {
        print(&shown);
    }
    if args.check && report.breaks_callers() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

async fn load(
    sandbox: &Sandbox,
    source: &str,
    registry: &RegistryArgs,
) -> Result<std::sync::Arc<LoadedComponent>, ExitCode> {
    let bytes = read_component(source, registry)
        .await
        .map_err(|e| error_exit(&e))?;
    sandbox
        .load(&bytes)
        .map_err(|e| usage_error(format!("cannot load `{source}`: {e}")))
}

/// A change report for people (`diff`, and `deploy` against the version it
/// replaces).
pub(super) fn print(report: &proto::ChangeReport) {
    let nothing = report.added.is_empty()
        && report.removed.is_empty()
        && report.changed.is_empty()
        && report.imports_added.is_empty()
        && report.imports_removed.is_empty()
        && report.beyond_grants.is_empty();
    if nothing {
        println!("no change to activity types or imports");
        print_replay(report);
        return;
    }
    for a in &report.added {
        println!("added:   {}: {}", a.name, a.signature);
    }
    for name in &report.removed {
        println!("removed: {name} (breaks its callers)");
    }
    for c in &report.changed {
        println!("changed: {}", c.name);
        println!("  was: {}", c.old);
        println!("  now: {}", c.new);
        if c.breaking.is_empty() {
            println!("  compatible with its callers");
        }
        for why in &c.breaking {
            println!("  breaks callers: {why}");
        }
    }
    for import in &report.imports_added {
        println!("import added:   {import}");
    }
    for import in &report.imports_removed {
        println!("import removed: {import}");
    }
    for what in &report.beyond_grants {
        println!("not granted: {what}");
    }
    print_replay(report);
    println!(
        "{}",
        if report.breaks_callers {
            "breaks callers of the old version"
        } else {
            "compatible with callers of the old version"
        }
    );
}

/// What a deploy's shadow replay found, for people.
fn print_replay(report: &proto::ChangeReport) {
    for t in &report.replayed {
        println!(
            "replayed: {}: {} of {} recorded attempts agreed ({} not compared); fuel per attempt {} -> {}",
            t.name, t.agreed, t.replayed, t.unsteady, t.fuel_active, t.fuel_candidate
        );
        for difference in &t.differences {
            println!("  {difference}");
        }
    }
    if report.replay_cut_short {
        println!("replay: stopped at its time budget before every recorded attempt ran");
    }
}

/// A change report for scripts (`diff --json`, and `deploy --json` under
/// `"changes"`, with the digest it is `"against"`).
pub(super) fn changes_json(c: &proto::ChangeReport) -> Value {
    let mut doc = json!({
        "added": c.added.iter().map(|a| json!({"name": a.name, "signature": a.signature})).collect::<Vec<_>>(),
        "removed": c.removed,
        "changed": c.changed.iter().map(|t| json!({"name": t.name, "old": t.old, "new": t.new, "breaking": t.breaking})).collect::<Vec<_>>(),
        "imports_added": c.imports_added,
        "imports_removed": c.imports_removed,
        "breaks_callers": c.breaks_callers,
    });
    if !c.beyond_grants.is_empty() {
        doc["beyond_grants"] = json!(c.beyond_grants);
    }
    if !c.replayed.is_empty() {
        doc["replayed"] = c
            .replayed
            .iter()
            .map(|t| {
                json!({
                    "name": t.name, "replayed": t.replayed, "agreed": t.agreed,
                    "unsteady": t.unsteady, "new_failures": t.new_failures,
                    "differences": t.differences,
                    "fuel_active": t.fuel_active, "fuel_candidate": t.fuel_candidate,
                    "micros_active": t.micros_active, "micros_candidate": t.micros_candidate,
                })
            })
            .collect();
        doc["replay_cut_short"] = c.replay_cut_short.into();
    }
    if !c.against.is_empty() {
        doc["against"] = c.against.clone().into();
    }
    doc
}
