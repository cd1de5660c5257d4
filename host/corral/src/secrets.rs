//! Keeping tenants' secrets current: every value is re-read from its source
//! every `host.secret_refresh`, and at once on SIGHUP, without a restart.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use corral_core::sandbox::Secrets;

/// Re-reads every tenant's secrets every `interval`, and at once on
/// SIGHUP. A secret that cannot be read keeps its last value and is named
/// (never its value) in a warning.
pub async fn refresh(
    tenants: Vec<(String, Arc<Secrets>)>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = signal(SignalKind::hangup()).ok();
    if hangup.is_none() {
        tracing::warn!("cannot listen for SIGHUP; secrets are re-read every {interval:?} only");
    }
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    loop {
        let why = tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => "interval",
            Some(()) = async {
                match hangup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => "SIGHUP",
        };
        for (tenant, secrets) in &tenants {
            let (changed, errors) = secrets.reload();
            for error in &errors {
                tracing::warn!(%tenant, "secret not re-read, the last value stays: {error}");
            }
            // Every interval for every tenant: said only when it matters.
            if why == "SIGHUP" || changed > 0 {
                tracing::info!(%tenant, changed, failed = errors.len(), "secrets re-read ({why})");
            } else {
                tracing::debug!(%tenant, failed = errors.len(), "secrets re-read ({why})");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_core::sandbox::{SecretSource, SecretSpec};

    #[tokio::test(start_paused = true)]
    async fn a_rotated_value_is_read_at_the_next_interval() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        std::fs::write(&file, "first-value").unwrap();
        let secrets = Arc::new(
            Secrets::load(vec![SecretSpec {
                name: "K".into(),
                source: SecretSource::File(file.clone()),
                hosts: vec!["a.example".parse().unwrap()],
                in_query: false,
            }])
            .unwrap(),
        );
        let stop = CancellationToken::new();
        let task = tokio::spawn(refresh(
            vec![("t".into(), secrets.clone())],
            Duration::from_secs(60),
            stop.clone(),
        ));
        std::fs::write(&file, "second-value").unwrap();
        // Not yet read: the new value is not known, so not redacted.
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert_eq!(secrets.redact("second-value"), "second-value");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(secrets.redact("second-value"), "[secret K]");
        stop.cancel();
        task.await.unwrap();
    }
}
