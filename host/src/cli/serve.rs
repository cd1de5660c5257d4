//! `corral serve --config FILE`: a Temporal activity worker for every
//! configured tenant, until SIGINT or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use corral::config::Config;
use corral::connectors::temporal::TemporalConnector;
use corral::sandbox::{Sandbox, SandboxConfig};
use corral::session::{Connector, Permits, Registry, Session};

use super::{default_cache_dir, usage_error};

#[derive(clap::Args)]
pub struct Args {
    /// The configuration file (TOML).
    #[arg(long, short)]
    config: PathBuf,
}

pub async fn serve(args: Args) -> ExitCode {
    let config = match Config::load(&args.config) {
        Ok(config) => config,
        Err(e) => return usage_error(e),
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(signal_shutdown(shutdown.clone()));
    match run(config, shutdown, |_| {}).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => usage_error(format!("{e:#}")),
    }
}

/// Loads every tenant's components, connects their workers, calls `ready`
/// and serves until `shutdown` fires and everything accepted is reported.
pub async fn run(
    config: Config,
    shutdown: CancellationToken,
    ready: impl FnOnce(&Registry),
) -> anyhow::Result<()> {
    let sandbox = Sandbox::new(SandboxConfig {
        max_instances: u32::try_from(config.host.max_concurrent)?.saturating_add(16),
        max_memory: config.host.max_memory,
        cache_dir: config.host.cache_dir.clone().or_else(default_cache_dir),
        ..SandboxConfig::default()
    })?;
    let mut registry = Registry::default();
    for t in &config.tenants {
        sandbox.check_tenant(&t.tenant)?;
        let mut components = Vec::new();
        for path in &t.components {
            let component = sandbox.load_file(path).map_err(|e| {
                anyhow::anyhow!(
                    "tenant `{}`: cannot load `{}`: {e}",
                    t.tenant.name,
                    path.display()
                )
            })?;
            tracing::info!(
                tenant = %t.tenant.name,
                digest = %component.digest,
                from_cache = component.from_cache,
                "loaded {}",
                path.display()
            );
            components.push(component);
        }
        let aliases: Vec<(String, String)> = t.aliases.clone().into_iter().collect();
        registry
            .add_tenant(t.tenant.clone(), &components, &aliases)
            .map_err(anyhow::Error::msg)?;
    }
    let registry = Arc::new(registry);
    let permits = Permits::new(
        config.host.max_concurrent,
        config
            .tenants
            .iter()
            .map(|t| (t.tenant.name.clone(), t.max_concurrent)),
    );
    let runtime = temporalio_sdk_core::CoreRuntime::new_assume_tokio(Default::default())?;
    let session = Session::new(sandbox, registry.clone());
    let mut connectors: Vec<Arc<dyn Connector>> = Vec::new();
    for t in &config.tenants {
        let connector = TemporalConnector::connect(
            &runtime,
            &t.tenant.name,
            &t.temporal,
            permits.clone(),
            config.host.shutdown_grace,
            config.host.connect_timeout,
        )
        .await?;
        eprintln!(
            "corral: tenant `{}` serves task queue `{}` (namespace `{}`) at {}: {}",
            t.tenant.name,
            t.temporal.task_queue,
            t.temporal.namespace,
            t.temporal.address,
            registry.activity_types(&t.tenant.name).join(", ")
        );
        connectors.push(Arc::new(connector));
    }
    ready(&registry);
    eprintln!(
        "corral: ready ({} tenant(s)); Ctrl-C or SIGTERM to stop",
        connectors.len()
    );
    let mut serving = tokio::task::JoinSet::new();
    for connector in connectors {
        let session = session.clone();
        let shutdown = shutdown.clone();
        let grace = config.host.shutdown_grace;
        serving.spawn(async move { session.serve(connector, shutdown, grace).await });
    }
    while let Some(done) = serving.join_next().await {
        done?;
    }
    eprintln!("corral: stopped; every accepted task was reported");
    Ok(())
}

/// SIGINT or SIGTERM starts a graceful shutdown.
pub async fn signal_shutdown(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop corral with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => eprintln!("corral: SIGTERM, shutting down"),
        _ = int.recv() => eprintln!("corral: SIGINT, shutting down"),
    }
    shutdown.cancel();
}
