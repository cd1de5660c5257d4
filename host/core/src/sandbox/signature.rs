//! Activity types: every function a component exports, named by its
//! fully-qualified WIT name, with its signature kept for JSON conversion and
//! for `corral inspect`.

use std::fmt::Write as _;
use std::sync::Arc;

use serde::Serialize;
use wasmtime::Engine;
use wasmtime::component::types::{ComponentFunc, ComponentItem, Type};
use wasmtime::component::{Component, ComponentExportIndex};

/// One exported function that can run as an activity.
#[derive(Debug, Clone)]
pub struct ActivityType {
    /// `demo:greeter/api.greet`, or `greet` for a world-level export:
    /// shared, not copied, by every task's log labels.
    pub name: Arc<str>,
    pub params: Vec<(String, Type)>,
    /// `None` for a function without a result.
    pub result: Option<Type>,
    pub(crate) export: ComponentExportIndex,
}

impl ActivityType {
    /// The WIT signature: `func(name: string) -> string`.
    pub fn signature(&self) -> String {
        let params: Vec<String> = self
            .params
            .iter()
            .map(|(name, ty)| format!("{name}: {}", render(ty)))
            .collect();
        let mut out = format!("func({})", params.join(", "));
        if let Some(result) = &self.result {
            let _ = write!(out, " -> {}", render(result));
        }
        out
    }

    /// The `corral inspect --json` shape of this activity type.
    pub fn describe(&self) -> ActivityDescription {
        ActivityDescription {
            name: self.name.to_string(),
            params: self
                .params
                .iter()
                .map(|(name, ty)| ParamDescription {
                    name: name.clone(),
                    ty: render(ty),
                })
                .collect(),
            result: self.result.as_ref().map(render),
        }
    }
}

/// A serializable description of an activity type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActivityDescription {
    pub name: String,
    pub params: Vec<ParamDescription>,
    pub result: Option<String>,
}

impl ActivityDescription {
    /// The WIT signature: `func(name: string) -> string`.
    pub fn signature(&self) -> String {
        let params: Vec<String> = self
            .params
            .iter()
            .map(|p| format!("{}: {}", p.name, p.ty))
            .collect();
        let result = self
            .result
            .as_ref()
            .map(|r| format!(" -> {r}"))
            .unwrap_or_default();
        format!("func({}){result}", params.join(", "))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParamDescription {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
}

/// An exported function that cannot run as an activity, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnsupportedExport {
    pub name: String,
    pub reason: String,
}

/// Finds every exported function of `component`.
pub(crate) fn exported_functions(
    engine: &Engine,
    component: &Component,
) -> (Vec<ActivityType>, Vec<UnsupportedExport>) {
    let mut found = Vec::new();
    let mut unsupported = Vec::new();
    let ty = component.component_type();
    for (export_name, item) in ty.exports(engine) {
        match item.ty {
            ComponentItem::ComponentFunc(func) => {
                let index = component.get_export_index(None, export_name);
                classify(
                    export_name.to_owned(),
                    &func,
                    index,
                    &mut found,
                    &mut unsupported,
                );
            }
            ComponentItem::ComponentInstance(instance) => {
                let Some(instance_index) = component.get_export_index(None, export_name) else {
                    continue;
                };
                let interface = strip_version(export_name);
                for (func_name, item) in instance.exports(engine) {
                    if let ComponentItem::ComponentFunc(func) = item.ty {
                        let index = component.get_export_index(Some(&instance_index), func_name);
                        let name = format!("{interface}.{func_name}");
                        classify(name, &func, index, &mut found, &mut unsupported);
                    }
                }
            }
            _ => {}
        }
    }
    (found, unsupported)
}

/// Exports that toolchains leave in every component they build, which are
/// not the author's activities: listed as unsupported so they can never be
/// invoked as an activity type.
const TOOLCHAIN_EXPORTS: &[(&str, &str)] = &[(
    "exports.init",
    "componentize-py's build-time initializer, not an activity",
)];

fn classify(
    name: String,
    func: &ComponentFunc,
    export: Option<ComponentExportIndex>,
    found: &mut Vec<ActivityType>,
    unsupported: &mut Vec<UnsupportedExport>,
) {
    let params: Vec<(String, Type)> = func
        .params()
        .map(|(name, ty)| (name.to_owned(), ty))
        .collect();
    let results: Vec<Type> = func.results().collect();
    let toolchain = TOOLCHAIN_EXPORTS.iter().find(|(n, _)| *n == name);
    let reason = if let Some((_, why)) = toolchain {
        Some((*why).to_owned())
    } else if func.async_() {
        Some("async functions are not supported yet".to_owned())
    } else if results.len() > 1 {
        Some("functions with more than one result are not supported".to_owned())
    } else {
        params
            .iter()
            .map(|(_, ty)| ty)
            .chain(&results)
            .find_map(|ty| unrepresentable(ty).map(|bad| format!("`{bad}` cannot travel as JSON")))
    };
    match (reason, export) {
        (Some(reason), _) => unsupported.push(UnsupportedExport { name, reason }),
        (None, None) => unsupported.push(UnsupportedExport {
            name,
            reason: "the export cannot be looked up".to_owned(),
        }),
        (None, Some(export)) => {
            if found.iter().any(|a: &ActivityType| *a.name == name) {
                unsupported.push(UnsupportedExport {
                    name,
                    reason: "another export already has this name (two versions of one interface?)"
                        .to_owned(),
                });
            } else {
                found.push(ActivityType {
                    name: name.into(),
                    params,
                    result: results.into_iter().next(),
                    export,
                });
            }
        }
    }
}

/// The first part of `ty` that has no JSON form (resources, futures,
/// streams, error contexts), rendered as WIT.
fn unrepresentable(ty: &Type) -> Option<String> {
    match ty {
        Type::Own(_) | Type::Borrow(_) | Type::Future(_) | Type::Stream(_) | Type::ErrorContext => {
            Some(render(ty))
        }
        Type::List(l) => unrepresentable(&l.ty()),
        Type::FixedLengthList(l) => unrepresentable(&l.ty()),
        Type::Map(m) => unrepresentable(&m.key()).or_else(|| unrepresentable(&m.value())),
        Type::Record(r) => r.fields().find_map(|f| unrepresentable(&f.ty)),
        Type::Tuple(t) => t.types().find_map(|t| unrepresentable(&t)),
        Type::Variant(v) => v
            .cases()
            .find_map(|c| c.ty.as_ref().and_then(unrepresentable)),
        Type::Option(o) => unrepresentable(&o.ty()),
        Type::Result(r) => r
            .ok()
            .as_ref()
            .and_then(unrepresentable)
            .or_else(|| r.err().as_ref().and_then(unrepresentable)),
        _ => None,
    }
}

/// `demo:greeter/api@1.0.0` → `demo:greeter/api`.
fn strip_version(name: &str) -> &str {
    name.split_once('@').map_or(name, |(base, _)| base)
}

/// Renders a component type as WIT. Named types (records, variants, …) are
/// anonymous in the component's type information, so they are written out
/// structurally: `record { name: string, age: u32 }`.
pub fn render(ty: &Type) -> String {
    match ty {
        Type::Bool => "bool".into(),
        Type::S8 => "s8".into(),
        Type::U8 => "u8".into(),
        Type::S16 => "s16".into(),
        Type::U16 => "u16".into(),
        Type::S32 => "s32".into(),
        Type::U32 => "u32".into(),
        Type::S64 => "s64".into(),
        Type::U64 => "u64".into(),
        Type::Float32 => "f32".into(),
        Type::Float64 => "f64".into(),
        Type::Char => "char".into(),
        Type::String => "string".into(),
        Type::List(l) => format!("list<{}>", render(&l.ty())),
        Type::FixedLengthList(l) => format!("list<{}, {}>", render(&l.ty()), l.len()),
        Type::Map(m) => format!("map<{}, {}>", render(&m.key()), render(&m.value())),
        Type::Record(r) => {
            let fields: Vec<String> = r
                .fields()
                .map(|f| format!("{}: {}", f.name, render(&f.ty)))
                .collect();
            format!("record {{ {} }}", fields.join(", "))
        }
        Type::Tuple(t) => {
            let types: Vec<String> = t.types().map(|t| render(&t)).collect();
            format!("tuple<{}>", types.join(", "))
        }
        Type::Variant(v) => {
            let cases: Vec<String> = v
                .cases()
                .map(|c| match &c.ty {
                    Some(ty) => format!("{}({})", c.name, render(ty)),
                    None => c.name.to_owned(),
                })
                .collect();
            format!("variant {{ {} }}", cases.join(", "))
        }
        Type::Enum(e) => format!("enum {{ {} }}", e.names().collect::<Vec<_>>().join(", ")),
        Type::Option(o) => format!("option<{}>", render(&o.ty())),
        Type::Result(r) => match (r.ok(), r.err()) {
            (None, None) => "result".into(),
            (Some(ok), None) => format!("result<{}>", render(&ok)),
            (None, Some(err)) => format!("result<_, {}>", render(&err)),
            (Some(ok), Some(err)) => format!("result<{}, {}>", render(&ok), render(&err)),
        },
        Type::Flags(f) => format!("flags {{ {} }}", f.names().collect::<Vec<_>>().join(", ")),
        Type::Own(_) => "own<resource>".into(),
        Type::Borrow(_) => "borrow<resource>".into(),
        Type::Future(f) => match f.ty() {
            Some(ty) => format!("future<{}>", render(&ty)),
            None => "future".into(),
        },
        Type::Stream(s) => match s.ty() {
            Some(ty) => format!("stream<{}>", render(&ty)),
            None => "stream".into(),
        },
        Type::ErrorContext => "error-context".into(),
    }
}
