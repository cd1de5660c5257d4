//! `corral serve --config FILE`: a Temporal or Aion activity worker for
//! every configured tenant, until SIGINT or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use tokio_util::sync::CancellationToken;

use corral::config::{Config, Engine};
use corral::connectors::aion::AionConnector;
use corral::connectors::local::Local;
use corral::connectors::temporal::{self, Connections, TemporalConnector};
use corral::control::follow::Follower;
use corral::control::store::Index;
use corral::control::{AdminService, Auth, Catalog, Store, TenantSpec, api, server};
use corral::health::Health;
use corral_core::metrics::Metrics;
use corral_core::sandbox::{CompileLimits, Sandbox, SandboxConfig, Secrets, listed_names};
use corral_core::session::{Connector, Permits, Registry, Session};

use super::{
    ExtraLayer, SERVER_LOG, default_cache_dir, error_exit, init_tracing, init_tracing_with,
    last_words,
};
use corral::telemetry::Telemetry;

/// How long the admin API's calls still open after the drain get before
/// corral exits without them (they end with the process): a client holding
/// a call open (an upload it never finishes) must not hold the host past
/// its stop. `/metrics` stops at once; each of its connections lives at
/// most 10 s.
const ENDPOINTS_CLOSE: Duration = Duration::from_secs(5);

/// How long the start waits for every followed tag's first check.
const FIRST_FOLLOW_CHECKS: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(clap::Args)]
pub struct Args {
    /// The configuration file (TOML).
    #[arg(long, short)]
    config: PathBuf,
}

pub async fn serve(args: Args) -> ExitCode {
    let config = match Config::load(&args.config) {
        Ok(config) => config,
        Err(e) => {
            init_tracing(SERVER_LOG, false);
            return error_exit(&e);
        }
    };
    let json = config.host.log_json;
    let (telemetry, export) = match &config.host.tracing {
        None => (None, None),
        Some(tracing) => match Telemetry::start::<tracing_subscriber::Registry>(tracing) {
            Ok((telemetry, layer)) => (Some(telemetry), Some(Box::new(layer) as ExtraLayer)),
            Err(e) => {
                init_tracing(SERVER_LOG, false);
                return error_exit(&e);
            }
        },
    };
    init_tracing_with(SERVER_LOG, json, export);
    let shutdown = CancellationToken::new();
    tokio::spawn(signal_shutdown(shutdown.clone(), json));
    let served = run(config, shutdown, |_| {}).await;
    if let Some(telemetry) = telemetry {
        telemetry.shutdown().await;
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => last_words(&e, json),
    }
}

/// Runs `work` every `period` until `shutdown`.
async fn every(period: Duration, shutdown: CancellationToken, mut work: impl FnMut()) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        work();
    }
}

/// Hands the pool's resident memory back to the kernel once no task has
/// started for `idle` (checked a few times per `idle`).
fn release_idle_memory(sandbox: &Sandbox, idle: Duration) {
    if let Some(bytes) = sandbox.release_idle_memory(idle)
        && bytes > 0
    {
        tracing::info!(
            bytes,
            "idle for {idle:?}: released the pool's resident memory"
        );
    }
}

/// Retires warm instances unused past their tenant's `reuse.idle` (run
/// every second: within a second of it).
fn retire_idle_instances(sandbox: &Sandbox) {
    let retired = sandbox.retire_idle_instances(std::time::Instant::now());
    if retired > 0 {
        tracing::debug!(retired, "retired warm instances left idle");
    }
}

/// A line about the host itself (`corral: ready`, …): plain text on stderr,
/// or with `log_format = "json"` a log event like every other line, so a
/// collector reading JSON lines reads them all.
pub fn announce(json: bool, message: std::fmt::Arguments<'_>) {
    if json {
        tracing::info!(target: "corral", "corral: {message}");
    } else {
        eprintln!("corral: {message}");
    }
}

/// Opens the store, loads every tenant's components, connects their
/// workers, starts the admin API and metrics endpoints, calls `ready` (which
/// may add components through the catalog while the host serves) and serves
/// until `shutdown` fires and everything accepted is reported.
pub async fn run(
    config: Config,
    shutdown: CancellationToken,
    ready: impl FnOnce(&Arc<Catalog>),
) -> anyhow::Result<()> {
    let json = config.host.log_json;
    corral::descriptors::prepare(&config);
    // The probes answer from the start: not ready while the host loads
    // and connects, not ready at once when it is told to stop.
    let health = Health::new(config.tenants.iter().map(|t| t.tenant.name.as_str()));
    tokio::spawn(health.clone().tick_forever());
    tokio::spawn({
        let (health, shutdown) = (health.clone(), shutdown.clone());
        async move {
            shutdown.cancelled().await;
            health.draining();
        }
    });
    // The endpoints stop only after the workers have drained.
    let endpoints = CancellationToken::new();
    let mut listeners = Vec::new();
    let page = server::Page::default();
    if let Some(address) = config.host.metrics_listen {
        let (bound, handle) = server::metrics(
            address,
            page.clone(),
            health.clone(),
            config.host.metrics_token_sha256,
            endpoints.clone(),
        )
        .await?;
        announce(
            json,
            format_args!("metrics on http://{bound}/metrics (probes: /livez, /readyz)"),
        );
        listeners.push(handle);
    }
    health.starting("opening the store");
    let (store, index) = match &config.host.data_dir {
        Some(dir) => Store::open(dir)?,
        None => (Store::in_memory(), Index::default()),
    };
    let sandbox = Sandbox::new(SandboxConfig {
        // Exactly the host's slots: every instance is made by a task holding
        // one (a smoke-test `Run` too, through the session), and freed
        // before the slot is; so a task with a slot always instantiates.
        max_instances: u32::try_from(config.host.max_concurrent)?,
        // Idle warm instances have slots of their own beyond those, if a
        // tenant may keep them: its config says so, or a deployment may
        // (`corral deploy --reuse`, through the admin API).
        max_warm: if config.host.admin_listen.is_some()
            || config.tenants.iter().any(|t| t.tenant.reuse.is_some())
        {
            config.host.max_warm_instances
        } else {
            0
        },
        max_memory: config.host.max_memory,
        cache_dir: config
            .host
            .cache_dir
            .clone()
            .or_else(|| store.compiled_dir())
            .or_else(default_cache_dir),
        // Tenants' components compile in a worker process under limits.
        compile: Some(CompileLimits {
            worker: std::env::current_exe().context("finding the corral binary to compile with")?,
            time: config.host.compile_timeout,
            memory: config.host.compile_memory,
        }),
        ..SandboxConfig::default()
    })?;
    let mut specs = Vec::with_capacity(config.tenants.len());
    for t in &config.tenants {
        specs.push(TenantSpec {
            // Its message names its cause already: no chain to print.
            tenant: sandbox
                .prepare(t.tenant.clone())
                .map_err(|e| anyhow::anyhow!("{e}"))?,
            aliases: t.aliases.clone().into_iter().collect(),
            quota: t.quota,
            registries: t.registries.clone(),
            credentials: t.registry_credentials.clone(),
            rollout: t.rollout.clone(),
            trust: t.trust.clone(),
        });
    }
    let registry = Arc::new(Registry::default());
    let metrics = Arc::new(Metrics::default());
    health.starting("loading and compiling the configured components");
    let catalog = Catalog::open(
        sandbox.clone(),
        registry.clone(),
        metrics.clone(),
        store,
        index,
        specs,
        config.host.max_compiles,
    )
    .await?;
    // Configured oci:// components: plain HTTP only for the listed
    // registries, credentials from the host's environment, at most
    // max_upload bytes, as an upload.
    let mut registries = corral::oci::Registries::from_env(
        config.host.insecure_registries.clone(),
        config.host.max_upload,
    )
    .with_credentials(&config.host.registry_credentials);
    registries.deadline = config.host.registry_deadline;
    for t in &config.tenants {
        catalog
            .seed(&t.tenant.name, &t.components, &registries)
            .await?;
    }
    let catalog = Arc::new(catalog);
    // Followed tags: checked once before the host says it is ready (a host
    // on an empty disk serves them at once; a slow registry delays the
    // start by FIRST_FOLLOW_CHECKS at most), then every follow_interval.
    let follower = Arc::new(Follower::new(
        catalog.clone(),
        config.host.follow_interval,
        config
            .tenants
            .iter()
            .flat_map(|t| {
                // Every byte from a host the tenant's rules name (or the
                // followed reference's own registry).
                let registries = registries
                    .with_credentials(&t.registry_credentials)
                    .within(&t.registries);
                t.follow
                    .iter()
                    .map(move |r| (t.tenant.name.clone(), r.clone(), registries.clone()))
            })
            .collect(),
    ));
    if !follower.is_empty() {
        health.starting("checking the followed tags");
        follower
            .clone()
            .start(shutdown.clone(), FIRST_FOLLOW_CHECKS)
            .await;
    }
    tokio::spawn(catalog.clone().run_canaries(shutdown.clone()));
    let idle = config.host.idle_memory_release;
    tokio::spawn(every(
        (idle / 4).max(Duration::from_millis(100)),
        shutdown.clone(),
        {
            let sandbox = sandbox.clone();
            move || release_idle_memory(&sandbox, idle)
        },
    ));
    tokio::spawn(every(Duration::from_secs(1), shutdown.clone(), {
        let sandbox = sandbox.clone();
        move || retire_idle_instances(&sandbox)
    }));
    let secrets: Vec<(String, Arc<Secrets>)> = config
        .tenants
        .iter()
        .filter(|t| !t.tenant.capabilities.secrets.is_empty())
        .map(|t| (t.tenant.name.clone(), t.tenant.capabilities.secrets.clone()))
        .collect();
    if !secrets.is_empty() {
        tokio::spawn(corral::secrets::refresh(
            secrets,
            config.host.secret_refresh,
            shutdown.clone(),
        ));
    }
    let permits = config.tenants.iter().fold(
        Permits::new(
            config.host.max_concurrent,
            config
                .tenants
                .iter()
                .map(|t| (t.tenant.name.clone(), t.max_concurrent)),
        ),
        |permits, t| permits.with_type_limits(&t.tenant.name, t.type_limits.clone()),
    );
    let session = Session::new(sandbox, registry.clone(), metrics.clone(), permits.clone());
    // Shadow replays run guests on the session's threads, under each
    // tenant's share, like its tasks.
    catalog.run_guests_on(session.cpu.clone(), permits.clone());
    let mut runtime = None;
    let mut connections = Connections::default();
    let mut connectors: Vec<Arc<dyn Connector>> = Vec::new();
    for t in &config.tenants {
        let name = &t.tenant.name;
        health.starting(format!("connecting tenant `{name}` to its engine"));
        let link = health.link(name);
        let connector: Arc<dyn Connector> = match &t.engine {
            Engine::Temporal(binding) => {
                let runtime = match &runtime {
                    Some(runtime) => runtime,
                    None => runtime.insert(temporal::core_runtime()?),
                };
                Arc::new(
                    TemporalConnector::connect(
                        runtime,
                        &mut connections,
                        name,
                        binding,
                        &permits,
                        config.host.shutdown_grace,
                        config.host.connect_timeout,
                        link,
                    )
                    .await?,
                )
            }
            Engine::Aion(binding) => Arc::new(
                AionConnector::connect(
                    name,
                    binding,
                    registry.clone(),
                    permits.clone(),
                    config.host.connect_timeout,
                    link,
                )
                .await?,
            ),
        };
        let types = registry.activity_types(name);
        announce(
            json,
            format_args!(
                "tenant `{name}` serves {}: {}",
                t.engine.describe(),
                // A tenant's component may export thousands: a few named,
                // the rest counted (`corral ls` lists them all).
                match types.is_empty() {
                    true => "no activity types yet".to_owned(),
                    false => listed_names(types.iter().map(String::as_str)),
                }
            ),
        );
        connectors.push(connector);
    }
    // Each Temporal server is asked now and then whether it answers: its
    // tenants are ready only while it does.
    connections.watch(endpoints.clone());
    if let Some(address) = config.host.admin_listen {
        // The admin API's `Run` is one more engine of the session.
        let local = Local::new(session.clone());
        connectors.push(local.clone());
        let service = AdminService {
            catalog: catalog.clone(),
            auth: Auth::new(
                config.host.operator_token_sha256,
                config
                    .tenants
                    .iter()
                    .map(|t| (t.tenant.name.as_str(), t.token_sha256)),
            ),
            session: session.clone(),
            local,
            max_upload: config.host.max_upload,
            registries: registries.clone(),
            follower: follower.clone(),
            runs: Arc::new(tokio::sync::Semaphore::new(api::RUN_SLOTS)),
            uploads: api::Uploads::default(),
        };
        let tls = config.host.admin_tls.as_ref();
        // One decoded message: an upload chunk, or a `Run`'s arguments.
        let max_input = config.largest(|limits| limits.max_input);
        let max_message = api::UPLOAD_CHUNK.max(max_input) + (64 << 10);
        let (bound, handle) =
            server::admin(address, tls, service, max_message, endpoints.clone()).await?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        announce(json, format_args!("admin API on {scheme}://{bound}"));
        listeners.push(handle);
    }
    // What /metrics shows, now that it exists.
    let tenants: Vec<String> = config
        .tenants
        .iter()
        .map(|t| t.tenant.name.clone())
        .collect();
    let _ = page.set(Box::new({
        let (follower, catalog, permits) = (follower.clone(), catalog.clone(), permits.clone());
        move || {
            // The control plane's lines: followed tags and canaries.
            metrics.render(&server::gauges(&permits, &tenants))
                + &follower.render()
                + &catalog.render_canaries()
        }
    }));
    ready(&catalog);
    health.serving();
    announce(
        json,
        format_args!(
            "ready ({} tenant(s)); Ctrl-C or SIGTERM to stop",
            config.tenants.len()
        ),
    );
    let mut serving = tokio::task::JoinSet::new();
    for connector in connectors {
        let session = session.clone();
        let shutdown = shutdown.clone();
        let grace = config.host.shutdown_grace;
        serving.spawn(async move { session.serve(connector, shutdown, grace).await });
    }
    let mut left = 0;
    while let Some(done) = serving.join_next().await {
        left += done?;
    }
    endpoints.cancel();
    let closing = tokio::time::Instant::now() + ENDPOINTS_CLOSE;
    for mut listener in listeners {
        if tokio::time::timeout_at(closing, &mut listener)
            .await
            .is_err()
        {
            listener.abort();
            tracing::warn!(
                "calls still open on the admin API {ENDPOINTS_CLOSE:?} after the drain: exiting without them"
            );
        }
    }
    // Every task has ended, and every admin call (an invoke's task, a
    // deploy): what they recorded is written before the host goes.
    catalog.samples().flush();
    match left {
        0 => announce(
            json,
            format_args!("stopped; every accepted task was reported"),
        ),
        left => announce(
            json,
            format_args!(
                "stopped; {left} task(s) left running or unreported (the engine runs them again after its timeouts)"
            ),
        ),
    }
    Ok(())
}

/// SIGINT or SIGTERM starts a graceful shutdown.
pub async fn signal_shutdown(shutdown: CancellationToken, json: bool) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop corral with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => announce(json, format_args!("SIGTERM, shutting down")),
        _ = int.recv() => announce(json, format_args!("SIGINT, shutting down")),
    }
    shutdown.cancel();
}
