//! Running one task: a fresh store and instance per task (or, for a tenant
//! that reuses them, a warm one with the task's own fresh state: see
//! `warm`), limits applied, the call raced against its deadline and
//! cancellation, and however it ends classified into an [`Outcome`].
//!
//! [`Sandbox::execute`] reads as its steps: check the arguments, prepare the
//! task's state (each capability's part built by its own module: output
//! capture in `stdio`, WASI in `tenant`, HTTP with its policy in `http`, the
//! limiter in `limits`, the activity context with its watchdog in
//! `context`), configure the store, race the call against the deadline and
//! cancellation, classify the ending (`outcome`), and finish.

use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use smallvec::SmallVec;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use wasmtime::component::types::Type;
use wasmtime::component::{Instance, ResourceTable, Val};
use wasmtime::{AsContext as _, CallHook, Store, UpdateDeadline};
use wasmtime_wasi::p2::DynOutputStream;
use wasmtime_wasi_http::WasiHttpCtx;

use super::classify::{listed_names, shown_name};
use super::component::LoadedComponent;
use super::context::{TaskInfo, TaskState};
use super::convert::from_json;
use super::engine::Sandbox;
use super::failure::{Failure, FailureClass, Outcome};
use super::http::HttpPolicy;
use super::limits::{Limiter, Limits};
use super::observer::{Stream, TaskObserver, Unobserved};
use super::outcome::{Ended, Ending, classify_ending, finish, json_len};
use super::shadow::Tape;
use super::signature::ActivityType;
use super::stdio::{Capture, GuestOutput};
use super::task_id::TaskLabels;
use super::tenant::{PolicyError, PreparedTenant};
use super::warm::Warm;
use super::watchdog::{Verdict, Watchdog};
use crate::sync::lock;
use crate::trace::PHASES;

/// One attempt of an activity to run.
pub struct Task {
    /// The activity type's full name (aliases already resolved).
    pub activity_type: String,
    /// One JSON value per WIT parameter.
    pub args: Vec<Value>,
    pub info: TaskInfo,
    /// The engine's deadline for this attempt; the tighter of it and the
    /// tenant's timeout applies.
    pub deadline: Option<Duration>,
    /// Cancelling makes `is-cancelled` true at once; after the tenant's
    /// grace period the instance is interrupted.
    pub cancel: CancellationToken,
    pub observer: Arc<dyn TaskObserver>,
    /// Shadow replay's tape: the task's outbound HTTP recorded, or
    /// answered from a recording. A task with one runs in a fresh
    /// instance, whatever its tenant's reuse.
    pub tape: Option<Arc<Tape>>,
}

impl Task {
    /// A first attempt with no engine deadline and nobody observing.
    pub fn new(activity_type: impl Into<String>, args: Vec<Value>) -> Self {
        Task {
            activity_type: activity_type.into(),
            args,
            info: TaskInfo {
                attempt: 1,
                ..TaskInfo::default()
            },
            deadline: None,
            cancel: CancellationToken::new(),
            observer: UNOBSERVED.clone(),
            tape: None,
        }
    }
}

/// One observer for every unobserved task, not one allocation per task.
static UNOBSERVED: LazyLock<Arc<dyn TaskObserver>> = LazyLock::new(|| Arc::new(Unobserved));

impl Sandbox {
    /// Runs one task to its classified outcome. Never panics on anything a
    /// guest or its input can do; the instance is gone when this returns.
    pub async fn execute(
        &self,
        component: &LoadedComponent,
        tenant: &PreparedTenant,
        mut task: Task,
    ) -> Outcome {
        let policy = &tenant.retry;
        let limits = &tenant.limits;
        let (activity, params) = arguments(component, tenant, &mut task)?;
        let timeout = match (task.deadline, limits.timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // A warm instance of this component, if the tenant reuses them and
        // one is idle: its output capture carries on (the streams its guest
        // kept write to it), under this task's labels and budget.
        // A recorded or replayed task starts from the component's own
        // state, as a replay of it will.
        let warm = match task.tape {
            Some(_) => None,
            None => tenant.warm.take(component.id),
        };
        let carried = warm.as_ref().map(|w| Carried {
            capture: w.store.data().capture.clone(),
            born: w.born,
        });
        let Prepared {
            state,
            capture,
            started,
            born,
        } = prepare(
            tenant,
            activity,
            std::mem::take(&mut task.info),
            &task,
            timeout,
            carried,
        )
        .map_err(|e| Failure::new(FailureClass::Host, policy, e.to_string()))?;
        // Counted in: idle pool memory is never released under a task.
        let _running = self.activity.enter(started).await;
        let _ticking = self.ticker.enter();
        let (mut store, instance, tasks) = match warm {
            Some(warm) => {
                let Warm {
                    mut store,
                    instance,
                    tasks,
                    ..
                } = warm;
                self.renew(&mut store, state, limits)
                    .map_err(|e| Failure::new(FailureClass::Host, policy, e.to_string()))?;
                (store, Some(instance), tasks)
            }
            None => {
                let store = self
                    .store(state, limits)
                    .map_err(|e| Failure::new(FailureClass::Host, policy, e.to_string()))?;
                (store, None, 0)
            }
        };
        let mut result = [Val::Bool(false)];
        let results = &mut result[..usize::from(activity.result.is_some())];
        let race = Race {
            component,
            activity,
            params: &params,
            timeout,
            started,
            cancel: &task.cancel,
            grace: limits.cancel_grace,
            observer: &task.observer,
        };
        let (ended, instance) = race.run(&mut store, instance, tasks, results).await;
        let returned = matches!(ended, Ended::Returned);
        lock(&capture).finish();
        let secrets = &tenant.capabilities.secrets;
        let data = store.data();
        let outcome = classify_ending(
            ended,
            Ending {
                result_type: activity.result.as_ref(),
                // The returned value moves into the outcome: a result's
                // strings are not copied.
                returned: results
                    .first_mut()
                    .map(|val| std::mem::replace(val, Val::Bool(false))),
                limits,
                policy,
                secrets,
                cancelled: task.cancel.is_cancelled(),
                fired: data.watchdog.fired,
                entered: data.entered,
                breach: data.limiter.breach.as_ref(),
                capture: &capture,
            },
        );
        let refusals = data.http_policy.refusals();
        if let Some(tape) = &task.tape {
            let budget = limits.fuel.unwrap_or(u64::MAX);
            tape.set_fuel(budget.saturating_sub(store.get_fuel().unwrap_or(budget)));
        }
        if let Some(instance) = instance
            && task.tape.is_none()
            && tenant.warm.would_keep(tasks + 1)
            && returned
            && refusals.is_empty()
            && !task.cancel.is_cancelled()
            && clean(&outcome)
            && keeps_only_its_output(&mut store)
        {
            idle(store.data_mut());
            tenant
                .warm
                .put(Warm::new(store, instance, tasks + 1, born, component.id));
        }
        finish(outcome, secrets, &refusals)
    }

    /// Readies a warm instance's store for the next task: the task's own
    /// state in place of the last one's, but for the resource table (it
    /// holds only the output streams the guest kept, see
    /// [`keeps_only_its_output`]) and the memory the instance holds, which
    /// the limit still covers; fuel and the deadline as for a new store.
    fn renew(
        &self,
        store: &mut Store<TaskState>,
        mut state: TaskState,
        limits: &Limits,
    ) -> Result<(), StoreError> {
        let last = store.data_mut();
        state.table = std::mem::take(&mut last.table);
        state.table.set_max_capacity(limits.max_handles);
        state.limiter.carry(&last.limiter);
        *last = state;
        arm(store, limits)
    }

    /// A store for the task's state, configured: its limiter, the hostcall
    /// bound, the watchdog's hooks, fuel and the yield interval.
    fn store(&self, state: TaskState, limits: &Limits) -> Result<Store<TaskState>, StoreError> {
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.limiter);
        // What the guest may hand the host in one call (a result, heartbeat
        // details, a log line, a write) is bounded before the host lifts it:
        // one lifted value per byte of the output limit, so no output that
        // fits `max_output` is refused here.
        store.set_hostcall_fuel(hostcall_fuel(limits.max_output));
        // Deadlines and cancels hold inside host calls too, and a guest
        // living in host calls still yields: see `watchdog`.
        store.call_hook(|mut store, hook| {
            let state = store.data_mut();
            match hook {
                CallHook::CallingHost => {}
                CallHook::CallingWasm => {
                    state.entered = true;
                    return Ok(());
                }
                CallHook::ReturningFromHost | CallHook::ReturningFromWasm => return Ok(()),
            }
            let cancelled = state.cancel.is_cancelled();
            match state.watchdog.on_host_call(Instant::now(), cancelled) {
                Verdict::Continue => Ok(()),
                Verdict::Yield => {
                    // A hook may not touch the store's own deadline: move
                    // the engine's epoch past every running store's, and
                    // this store's callback (below) yields.
                    store.as_context().engine().increment_epoch();
                    Ok(())
                }
                Verdict::Stop(interrupt) => Err(wasmtime::Error::new(interrupt)),
            }
        });
        // The epoch advances at a watchdog's yield, and every `TICK` while
        // tasks run (`ticker`): a store's deadline of one tick is reached
        // then. Reaching it is a call into the host, which the hook above
        // sees: a guest whose slice has run the watchdog's 1 ms yields here
        // (a guest that never yields by fuel, at the next tick at most),
        // any other goes on (a flag read). The callback captures nothing:
        // no allocation.
        store.epoch_deadline_callback(|mut store| {
            Ok(if store.data_mut().watchdog.take_yield() {
                UpdateDeadline::Yield(1)
            } else {
                UpdateDeadline::Continue(1)
            })
        });
        // A yield to the runtime every so much fuel: this is what lets the
        // deadline and cancellation end a guest that never returns, and
        // keeps one busy guest from starving everything else.
        store
            .fuel_async_yield_interval(Some(self.config.yield_every_fuel))
            .map_err(StoreError::Fuel)?;
        arm(&mut store, limits)?;
        Ok(store)
    }
}

/// What a store needs afresh for each task, new or warm: the epoch
/// deadline of one tick (see `store`), and the tenant's CPU budget.
fn arm(store: &mut Store<TaskState>, limits: &Limits) -> Result<(), StoreError> {
    store.set_epoch_deadline(1);
    store
        .set_fuel(limits.fuel.unwrap_or(u64::MAX))
        .map_err(StoreError::Fuel)
}

/// Why a task's store or state could not be made: the host's fault, never
/// the guest's (the task fails as `Host`).
#[derive(Debug, thiserror::Error)]
enum StoreError {
    #[error("setting fuel: {0:#}")]
    Fuel(#[source] wasmtime::Error),
    #[error("the task's WASI context: {0}")]
    Wasi(#[source] PolicyError),
}

/// The activity the task names and its arguments as WIT values, or why
/// they cannot be.
fn arguments<'c>(
    component: &'c LoadedComponent,
    tenant: &PreparedTenant,
    task: &mut Task,
) -> Result<(&'c ActivityType, SmallVec<[Val; 4]>), Failure> {
    let policy = &tenant.retry;
    let Some(activity) = component.activity(&task.activity_type) else {
        // The names are the guest's: bounded in number and length.
        let known = listed_names(component.activities.iter().map(|a| &*a.name));
        return Err(Failure::new(
            FailureClass::UnknownActivity,
            policy,
            format!(
                "no activity type `{}` in component {} (it has: {known})",
                shown_name(&task.activity_type),
                component.digest,
            ),
        ));
    };
    let invalid_input = |message: String| Failure::new(FailureClass::InvalidInput, policy, message);
    if task.args.len() != activity.params.len() {
        return Err(invalid_input(format!(
            "`{}` takes {} argument(s), {}, but got {}",
            activity.name,
            activity.params.len(),
            activity.signature(),
            task.args.len()
        )));
    }
    let input_size: usize = task.args.iter().map(json_len).sum();
    if input_size > tenant.limits.max_input {
        return Err(invalid_input(format!(
            "the input is {input_size} bytes, over the limit of {} bytes",
            tenant.limits.max_input
        )));
    }
    // On the stack for the usual few parameters; a string, the commonest,
    // moves into its value instead of being copied.
    let mut params = SmallVec::<[Val; 4]>::with_capacity(task.args.len());
    for ((name, ty), arg) in activity.params.iter().zip(task.args.drain(..)) {
        let val = match (ty, arg) {
            (Type::String, Value::String(text)) => Ok(Val::String(text)),
            (ty, arg) => from_json(ty, &arg),
        };
        match val {
            Ok(val) => params.push(val),
            Err(e) => return Err(invalid_input(format!("parameter `{name}`: {e}"))),
        }
    }
    Ok((activity, params))
}

/// A task's state, built from the prepared tenant and the task.
struct Prepared {
    state: TaskState,
    /// The task's output capture, also held by the state's streams.
    capture: Arc<Mutex<Capture>>,
    /// When the attempt started: its deadline counts from here.
    started: Instant,
    /// When its instance was made (see [`Warm::born`]).
    born: Instant,
}

/// What a warm instance's next task takes over from its last.
struct Carried {
    /// The output capture the streams its guest kept write to.
    capture: Arc<Mutex<Capture>>,
    born: Instant,
}

/// Builds the task's state, each capability's part by its own module.
fn prepare(
    tenant: &PreparedTenant,
    activity: &ActivityType,
    info: TaskInfo,
    task: &Task,
    timeout: Option<Duration>,
    carried: Option<Carried>,
) -> Result<Prepared, StoreError> {
    let Task {
        observer,
        cancel,
        tape,
        ..
    } = task;
    let limits = &tenant.limits;
    // Shared by the output capture, the HTTP policy and the store.
    let labels = Arc::new(TaskLabels {
        tenant: tenant.label.clone(),
        activity_type: activity.name.clone(),
        // Chosen by whoever started the activity: escaped and bounded.
        activity_id: crate::shown::shown(&info.activity_id, crate::shown::MAX_NAME),
    });
    let secrets = &tenant.capabilities.secrets;
    let (capture, born) = match carried {
        Some(Carried { capture, born }) => {
            lock(&capture).restart(labels.clone(), observer.clone(), limits.max_stdio);
            (capture, born)
        }
        None => (
            Capture::new(
                labels.clone(),
                observer.clone(),
                secrets.clone(),
                limits.max_stdio,
            ),
            Instant::now(),
        ),
    };
    let wasi = tenant
        .wasi_ctx(
            GuestOutput::new(Stream::Stdout, &capture),
            GuestOutput::new(Stream::Stderr, &capture),
            born,
        )
        .map_err(StoreError::Wasi)?;
    let started = Instant::now();
    let http_policy = HttpPolicy::new(
        tenant.capabilities.http_hosts.clone(),
        secrets.clone(),
        limits.max_http_requests,
        limits.max_http_bytes,
        labels.clone(),
        tape.clone(),
    );
    let mut table = ResourceTable::new();
    table.set_max_capacity(limits.max_handles);
    let state = TaskState {
        wasi,
        table,
        http: WasiHttpCtx::new(),
        http_policy,
        config: tenant.config_vars(),
        secrets: secrets.clone(),
        limiter: Limiter::new(limits),
        capture: capture.clone(),
        info,
        cancel: cancel.clone(),
        observer: observer.clone(),
        heartbeats: 0,
        max_details: limits.max_output,
        labels,
        watchdog: Watchdog::new(started, timeout, limits.cancel_grace),
        entered: false,
    };
    Ok(Prepared {
        state,
        capture,
        started,
        born,
    })
}

/// The call, raced against the deadline and cancellation.
struct Race<'a> {
    component: &'a LoadedComponent,
    activity: &'a ActivityType,
    params: &'a [Val],
    timeout: Option<Duration>,
    started: Instant,
    cancel: &'a CancellationToken,
    grace: Duration,
    observer: &'a Arc<dyn TaskObserver>,
}

impl Race<'_> {
    /// The call's ending, and the instance it ran in (a warm one, or the
    /// one it made) if it got one.
    async fn run(
        self,
        store: &mut Store<TaskState>,
        warm: Option<Instance>,
        tasks: u32,
        results: &mut [Val],
    ) -> (Ended, Option<Instance>) {
        let mut made = None;
        let call = async {
            let instance = match warm {
                Some(instance) => {
                    self.observer.reused(tasks);
                    instance
                }
                None => {
                    let instantiated = self
                        .component
                        .pre
                        .instantiate_async(&mut *store)
                        .instrument(tracing::debug_span!(target: PHASES, "instantiate"))
                        .await;
                    // What instantiation ran (start functions) is not the
                    // guest's call, failed or not.
                    store.data_mut().entered = false;
                    let instance = instantiated?;
                    self.observer.instantiated(self.started.elapsed());
                    instance
                }
            };
            made = Some(instance);
            let func = instance
                .get_func(&mut *store, self.activity.export)
                .ok_or_else(|| {
                    wasmtime::Error::msg(format!("export `{}` vanished", self.activity.name))
                })?;
            func.call_async(&mut *store, self.params, results)
                .instrument(tracing::debug_span!(target: PHASES, "guest"))
                .await
        };
        let deadline = async {
            match self.timeout {
                Some(t) => tokio::time::sleep_until((self.started + t).into()).await,
                None => std::future::pending().await,
            }
        };
        let interrupt = async {
            self.cancel.cancelled().await;
            tokio::time::sleep(self.grace).await;
        };
        let ended = tokio::select! {
            biased;
            returned = call => match returned {
                Ok(()) => Ended::Returned,
                Err(error) => Ended::Failed(error),
            },
            () = deadline => Ended::DeadlineReached(self.timeout.unwrap_or_default()),
            () = interrupt => Ended::Interrupted,
        };
        (ended, made)
    }
}

/// Lets go of what the finished task's state holds that the instance does
/// not need while it waits (up to `reuse.idle`): the attempt's ids, its
/// observer (and through it the engine's connector), its cancellation, and
/// its WASI context with the tenant's open directories. The next task
/// replaces all of it.
fn idle(state: &mut TaskState) {
    state.info = TaskInfo::default();
    state.observer = UNOBSERVED.clone();
    state.cancel = CancellationToken::new();
    state.wasi = wasmtime_wasi::WasiCtx::builder().build();
    let labels = state.labels.clone();
    lock(&state.capture).restart(labels, UNOBSERVED.clone(), 0);
}

/// Whether a task ended as a guest's task should: a result, or its own
/// `err(...)`. Any other ending (a trap, a limit, invalid output, a host
/// fault) retires its instance.
fn clean(outcome: &Outcome) -> bool {
    match outcome {
        Ok(_) => true,
        Err(failure) => failure.class == FailureClass::Application,
    }
}

/// Whether the instance holds nothing of the host's but the output streams
/// its guest kept (a libc keeps `stdout` and `stderr` once it has them),
/// and wrote within its output budget: then the next task's state can
/// replace this one's whole. Every other handle (a file, a directory, a
/// request, a pollable, stdin) would carry this task's state into the
/// next, so an instance holding one is not kept.
fn keeps_only_its_output(store: &mut Store<TaskState>) -> bool {
    let state = store.data_mut();
    let (overflowed, open_streams) = {
        let capture = lock(&state.capture);
        (capture.overflowed(), capture.open_streams())
    };
    if overflowed {
        return false;
    }
    let mut outputs = 0;
    for (_, entry) in state.table.iter_mut() {
        if entry.downcast_ref::<DynOutputStream>().is_none() {
            return false;
        }
        outputs += 1;
    }
    // Every stream of the capture is in the table: any other output
    // stream there (a file's, a request body's) makes one more.
    outputs == open_streams
}

/// Hostcall fuel for an output limit: wasmtime charges the lifted size of
/// what a guest passes the host (a `Val` per element, a byte per byte of a
/// string), and every element of a JSON output is at least a byte of it.
fn hostcall_fuel(max_output: usize) -> usize {
    max_output.saturating_mul(size_of::<Val>())
}
