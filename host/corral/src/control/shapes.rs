//! The admin API's shapes of what the catalog and the sandbox hold: a
//! stored version, a change report, a failure.

use serde_json::Value;

use super::catalog::VersionView;
use super::metadata::Pulled;
use super::proto;
use corral_core::sandbox::{ChangeReport, Failure};

/// A version as the API shows it.
pub fn to_proto(view: &VersionView) -> proto::Component {
    let (activity_types, imports, unsupported) = match &view.component {
        Some(c) => (
            c.activities
                .iter()
                .map(|a| proto::ActivityType {
                    name: a.name.to_string(),
                    signature: a.signature(),
                })
                .collect(),
            c.imports.clone(),
            c.unsupported
                .iter()
                .map(|u| format!("{}: {}", u.name, u.reason))
                .collect(),
        ),
        None => (Vec::new(), Vec::new(), Vec::new()),
    };
    let outbound_http = outbound_http(&imports, &view.http_hosts);
    let v = &view.version;
    proto::Component {
        tenant: view.tenant.clone(),
        name: v.name.clone(),
        digest: v.digest.clone(),
        size: v.size,
        uploaded_at_ms: v.uploaded_at_ms,
        active: view.active,
        activity_types,
        imports,
        aliases: v.aliases.clone().into_iter().collect(),
        labels: v
            .labels
            .clone()
            .into_iter()
            .chain(v.pulled.iter().flat_map(Pulled::labels))
            .collect(),
        unsupported,
        outbound_http,
        config: v.config.clone().into_iter().collect(),
        reuse: v.reuse.map(|r| proto::Reuse {
            max_tasks: r.max_tasks,
            idle_ms: r.idle_ms,
        }),
        held: v.held.clone(),
        canary_percent: view.canary.unwrap_or(0),
        signer: view.version.signer.clone().unwrap_or_default(),
    }
}

/// The API's shape of a change report against version `against`.
pub fn changes_to_proto(against: String, report: &ChangeReport) -> proto::ChangeReport {
    proto::ChangeReport {
        against,
        added: report
            .added
            .iter()
            .map(|a| proto::ActivityType {
                name: a.name.clone(),
                signature: a.signature(),
            })
            .collect(),
        removed: report.removed.clone(),
        changed: report
            .changed
            .iter()
            .map(|c| proto::ChangedType {
                name: c.name.clone(),
                old: c.old.clone(),
                new: c.new.clone(),
                breaking: c.breaking.clone(),
            })
            .collect(),
        imports_added: report.imports_added.clone(),
        imports_removed: report.imports_removed.clone(),
        breaks_callers: report.breaks_callers(),
        // The tenant's grants and its replay are the catalog's to say (the
        // upload's).
        beyond_grants: Vec::new(),
        replayed: Vec::new(),
        replay_cut_short: false,
    }
}

pub fn replay_to_proto(report: &crate::control::shadow::ReplayReport) -> Vec<proto::TypeReplay> {
    report
        .types
        .iter()
        .map(|t| proto::TypeReplay {
            name: t.name.clone(),
            replayed: t.replayed,
            agreed: t.agreed,
            unsteady: t.unsteady,
            new_failures: t.new_failures,
            differences: t.differences.clone(),
            fuel_active: t.fuel_active,
            fuel_candidate: t.fuel_candidate,
            micros_active: t.micros_active,
            micros_candidate: t.micros_candidate,
        })
        .collect()
}

/// What outbound HTTP a component with these imports gets from a tenant
/// with these grants; empty when it does not import `wasi:http`.
pub fn outbound_http(imports: &[String], http_hosts: &[String]) -> String {
    if !imports.iter().any(|i| i.starts_with("wasi:http/")) {
        return String::new();
    }
    if http_hosts.is_empty() {
        "none granted: every request will be denied".to_owned()
    } else {
        format!("granted: {}", http_hosts.join(", "))
    }
}

pub(super) fn failure_to_proto(f: &Failure) -> proto::Failure {
    proto::Failure {
        class: f.class.as_str().to_owned(),
        kind: f.kind.clone(),
        message: f.message.clone(),
        retryable: f.retryable,
        details_json: f.details.as_ref().map(Value::to_string).unwrap_or_default(),
    }
}
