//! Traces over OTLP (`[host.tracing] otlp_endpoint = "http://…:4317"`,
//! gRPC): the harness's `task` span and its children (`permits`,
//! `instantiate`, `guest`, one `http` per outbound request, guest log lines
//! as events) go to an OpenTelemetry collector, each task a child of the
//! span its caller's SDK carried in the activity's headers, each outbound
//! request carrying a `traceparent` of its own span.

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer as _;

use corral_core::trace::Propagation;

/// Where spans go, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracingConfig {
    /// `http://host:port` of an OTLP/gRPC receiver.
    pub otlp_endpoint: String,
    pub service_name: String,
}

/// The exporter could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("host.tracing: cannot export to `{endpoint}`: {source}")]
pub struct TelemetryError {
    endpoint: String,
    source: opentelemetry_otlp::ExporterBuildError,
}

/// Spans being exported; [`Telemetry::shutdown`] sends what is left.
pub struct Telemetry {
    provider: SdkTracerProvider,
}

/// The OTLP exporter, driven on corral's runtime: the batch processor
/// exports from a thread of its own, where tonic finds no runtime.
#[derive(Debug)]
struct OnRuntime {
    inner: opentelemetry_otlp::SpanExporter,
    runtime: tokio::runtime::Handle,
}

impl opentelemetry_sdk::trace::SpanExporter for OnRuntime {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        match tokio::runtime::Handle::try_current() {
            Ok(_) => self.inner.export(batch).await,
            Err(_) => self.runtime.block_on(self.inner.export(batch)),
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

impl Telemetry {
    /// Builds the exporter and the layer that feeds it; must run on
    /// corral's runtime. Installs the W3C propagation the harness uses.
    pub fn start<S>(
        config: &TracingConfig,
    ) -> Result<(Telemetry, impl tracing_subscriber::Layer<S>), TelemetryError>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let inner = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(&config.otlp_endpoint)
            .with_timeout(Duration::from_secs(10))
            .build()
            .map_err(|source| TelemetryError {
                endpoint: config.otlp_endpoint.clone(),
                source,
            })?;
        let exporter = OnRuntime {
            inner,
            runtime: tokio::runtime::Handle::current(),
        };
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("corral");
        corral_core::trace::install(Box::new(W3c));
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(exported());
        Ok((Telemetry { provider }, layer))
    }

    /// Exports what is left (off the runtime's workers, which the export
    /// itself needs).
    pub async fn shutdown(self) {
        let provider = self.provider;
        let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(e)) = done {
            tracing::warn!("exporting the last spans: {e}");
        }
    }
}

/// What the export takes: corral's own spans and events (the guest's log
/// lines among them), whether or not `CORRAL_LOG` lets them into the log,
/// and each task's phase spans, which the log leaves out.
pub fn exported() -> tracing_subscriber::filter::Targets {
    tracing_subscriber::filter::Targets::new()
        .with_target("corral", tracing::Level::INFO)
        .with_target("corral_core", tracing::Level::INFO)
        .with_target(corral_core::trace::PHASES, tracing::Level::DEBUG)
}

/// W3C trace context, through the spans' OpenTelemetry context.
struct W3c;

impl Propagation for W3c {
    fn adopt(&self, span: &Span, traceparent: &str) {
        let carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
        let parent = TraceContextPropagator::new().extract(&carrier);
        if parent.span().span_context().is_valid() {
            // Fails only for a span no layer records: nothing to join then.
            let _ = span.set_parent(parent);
        }
    }

    fn traceparent(&self, span: &Span) -> Option<String> {
        let mut carrier = HashMap::new();
        TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
        carrier.remove("traceparent")
    }
}
