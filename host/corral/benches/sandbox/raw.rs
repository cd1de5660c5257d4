//! The raw floor: a fresh store, an instance from an `InstancePre` and a
//! typed call of a guest's function, on the sandbox's own engine, with WASI
//! and `wasi:http` linked and nothing of corral's.

use anyhow::{Context, Result};
use corral_core::sandbox::{LoadedComponent, Sandbox};
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, ComponentExportIndex, InstancePre, Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::Guest;

pub struct Raw {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    table: ResourceTable,
}

impl Raw {
    fn new() -> Self {
        Raw {
            wasi: WasiCtx::builder().build(),
            http: WasiHttpCtx::new(),
            table: ResourceTable::new(),
        }
    }
}

impl WasiHttpView for Raw {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: wasmtime_wasi_http::default_hooks(),
        }
    }
}

impl WasiView for Raw {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// A failure record (`corral:activity/types.failure`), for typed calls of
/// functions that return `result<_, failure>`.
#[derive(wasmtime::component::ComponentType, wasmtime::component::Lift)]
#[component(record)]
#[allow(dead_code)] // `retryable` and `details` are only lifted
pub struct Failure {
    message: String,
    kind: String,
    retryable: bool,
    details: Option<String>,
}

/// Defines every function of the component's imports beyond WASI
/// (`corral:activity`, `wasi:config`) as one that traps: the
/// measured functions call none of them. (`define_unknown_imports_as_traps`
/// would also shadow WASI interfaces imported at a newer patch version
/// than wasmtime's, which the linker otherwise matches by semver.)
fn stub_other_imports(linker: &mut Linker<Raw>, component: &Component) -> Result<()> {
    let engine = component.engine();
    for (name, item) in component.component_type().imports(engine) {
        let other = ["corral:", "wasi:config/"]
            .iter()
            .any(|prefix| name.starts_with(prefix));
        let ComponentItem::ComponentInstance(instance) = item.ty else {
            continue;
        };
        if !other {
            continue;
        }
        let mut stubs = linker.instance(name)?;
        for (function, item) in instance.exports(engine) {
            if let ComponentItem::ComponentFunc(_) = item.ty {
                let what = format!("{name}#{function}");
                stubs.func_new(function, move |_, _, _, _| {
                    Err(wasmtime::Error::msg(format!(
                        "{what} is not linked in the raw floor"
                    )))
                })?;
            }
        }
    }
    Ok(())
}

/// One guest's function, ready to run raw.
pub struct RawFloor {
    pre: InstancePre<Raw>,
    func: ComponentExportIndex,
    fallible: bool,
    expected: &'static str,
    yield_every: u64,
}

impl RawFloor {
    pub fn new(sandbox: &Sandbox, component: &LoadedComponent, guest: &Guest) -> Result<Self> {
        let mut linker: Linker<Raw> = Linker::new(sandbox.engine());
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        stub_other_imports(&mut linker, component.component())?;
        let pre = linker.instantiate_pre(component.component())?;
        let interface = match guest.interface {
            Some(name) => Some(
                component
                    .component()
                    .get_export_index(None, name)
                    .context("interface")?,
            ),
            None => None,
        };
        let func = component
            .component()
            .get_export_index(interface.as_ref(), guest.function)
            .context("function")?;
        Ok(RawFloor {
            pre,
            func,
            fallible: guest.fallible,
            expected: guest.expected,
            yield_every: sandbox.config().yield_every_fuel,
        })
    }

    /// One task: store, instance, call with "hello", the result checked.
    pub async fn task(&self, engine: &Engine) -> Result<()> {
        let mut store = Store::new(engine, Raw::new());
        store.set_fuel(u64::MAX)?;
        store.fuel_async_yield_interval(Some(self.yield_every))?;
        // The engine checks epochs (corral's watchdog uses them): a store
        // must set a deadline it never reaches, or it traps at once.
        store.set_epoch_deadline(1 << 62);
        let instance = self.pre.instantiate_async(&mut store).await?;
        let func = self.func;
        let out = if self.fallible {
            let f =
                instance.get_typed_func::<(&str,), (Result<String, Failure>,)>(&mut store, func)?;
            let (out,) = f.call_async(&mut store, ("hello",)).await?;
            out.map_err(|f| anyhow::anyhow!("{}: {}", f.kind, f.message))?
        } else {
            let f = instance.get_typed_func::<(&str,), (String,)>(&mut store, func)?;
            f.call_async(&mut store, ("hello",)).await?.0
        };
        anyhow::ensure!(out == self.expected, "{out}");
        Ok(())
    }
}
