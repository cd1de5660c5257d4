//! The admin API (`corral.v1.Admin`) over the catalog, the session's
//! counters and the permits.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_stream::StreamExt as _;
use tonic::{Code, Request, Response, Status, Streaming};

use super::auth::{Auth, Principal};
use super::catalog::canary::outcomes;
use super::catalog::{Catalog, ControlError, NewVersion, Refusal};
use super::follow::{FollowState, Follower};
use super::proto::{self, admin_server::Admin, run_response, upload_request};
use super::rollout::Ramp;
use super::shapes::failure_to_proto;
pub use super::shapes::{changes_to_proto, outbound_http, replay_to_proto, to_proto};
use super::store::StoredReuse;
pub use super::uploads::{UPLOADS_PER_HOST, UPLOADS_PER_TENANT, Uploads};
use crate::connectors::local::{Local, Submission};
use crate::oci::Registries;
use crate::staging::{StageError, StagedComponent};
use corral_core::sandbox::{DeploymentReuse, Reuse, TaskInfo, format_bytes};
use corral_core::session::{Args, Session};
use corral_core::shown::Escaped;
use corral_core::shown::{MAX_NAME, Shown};

pub struct AdminService {
    pub catalog: Arc<Catalog>,
    pub auth: Auth,
    pub session: Arc<Session>,
    /// Runs `Run` calls through the session loop.
    pub local: Arc<Local>,
    /// Uploads in flight: each tenant's, and the host's.
    pub uploads: Uploads,
    /// The largest component an upload may carry.
    pub max_upload: u64,
    /// How the host pulls a tenant's `oci://` deploys.
    pub registries: Registries,
    /// The tags the host follows, for `Status`.
    pub follower: Arc<Follower>,
    /// `Run` is a smoke test outside any engine: it does not take engine
    /// permits (pollers may hold them all while they wait for work), but has
    /// a small host-wide budget of its own; while it executes it holds a
    /// host slot like any task.
    pub runs: Arc<Semaphore>,
}

/// The bytes of an upload travel in chunks of at most this size.
pub const UPLOAD_CHUNK: usize = 1 << 20;
/// The longest signature an upload's header may carry: the largest
/// signature file read.
pub use crate::trust::file::MAX_SIGNATURE;

/// How many `Run` calls may execute at once, host-wide.
pub const RUN_SLOTS: usize = 4;

impl AdminService {
    fn tenant<T>(&self, request: &Request<T>, requested: &str) -> Result<String, Status> {
        let principal = self.principal(request)?;
        self.auth.tenant(&principal, requested)
    }

    /// The caller, as the server's interceptor authenticated it before the
    /// request's body was read (or from its token, when called directly).
    fn principal<T>(&self, request: &Request<T>) -> Result<Principal, Status> {
        match request.extensions().get::<Principal>() {
            Some(principal) => Ok(principal.clone()),
            None => self.auth.principal(request.metadata()),
        }
    }

    /// Reads an upload's header.
    async fn header(
        &self,
        stream: &mut Streaming<proto::UploadRequest>,
    ) -> Result<proto::UploadHeader, Status> {
        let header = match stream.next().await {
            Some(Ok(proto::UploadRequest {
                part: Some(upload_request::Part::Header(header)),
            })) => header,
            Some(Ok(_)) => {
                return Err(Status::invalid_argument(
                    "an upload starts with its header, then the bytes",
                ));
            }
            Some(Err(e)) => return Err(cut_off(0, 0, &e)),
            None => return Err(Status::invalid_argument("the upload is empty")),
        };
        if header.signature.len() > MAX_SIGNATURE {
            return Err(Status::invalid_argument(format!(
                "the header's signature is {} bytes: a cosign signature is about 100, at most {MAX_SIGNATURE}",
                header.signature.len()
            )));
        }
        // The host pulls the bytes itself, once it knows the tenant.
        if !header.oci_reference.is_empty() {
            if !header.signature.is_empty() {
                return Err(Status::invalid_argument(
                    "an upload by oci_reference carries no signature: the registry's are read",
                ));
            }
            if header.size != 0 {
                return Err(Status::invalid_argument(
                    "an upload by oci_reference carries no bytes (size 0, no chunks)",
                ));
            }
            return Ok(header);
        }
        if header.size == 0 {
            return Err(Status::invalid_argument(
                "the header's size (the component's length in bytes) is required",
            ));
        }
        if header.size > self.max_upload {
            return Err(too_large(header.size, self.max_upload));
        }
        Ok(header)
    }

    /// Writes an upload's bytes to a staged file as they arrive, checking
    /// them against the size its header announced.
    async fn receive(
        &self,
        expected: u64,
        stream: &mut Streaming<proto::UploadRequest>,
    ) -> Result<StagedComponent, Status> {
        let mut staged = self
            .catalog
            .staging()
            .stage(expected)
            .map_err(|e| Status::internal(format!("staging the upload: {e}")))?;
        while let Some(message) = stream.next().await {
            match message {
                Ok(proto::UploadRequest {
                    part: Some(upload_request::Part::Chunk(chunk)),
                }) => staged.write(&chunk).map_err(|e| match e {
                    StageError::Longer { .. } => Status::invalid_argument(format!(
                        "the upload carries more than the {expected} bytes its header announced"
                    )),
                    StageError::Io(e) => Status::internal(format!("staging the upload: {e}")),
                })?,
                Ok(_) => return Err(Status::invalid_argument("an upload has one header")),
                Err(e) => return Err(cut_off(staged.size(), expected, &e)),
            }
        }
        if staged.size() < expected {
            return Err(Status::invalid_argument(format!(
                "the upload was cut off: {} of {expected} bytes arrived; nothing was stored",
                staged.size()
            )));
        }
        staged
            .finish()
            .map_err(|e| Status::internal(format!("staging the upload: {e}")))
    }
}

fn cut_off(received: u64, expected: u64, e: &Status) -> Status {
    Status::aborted(format!(
        "the upload stream broke after {received} of {expected} bytes ({}); nothing was stored",
        e.message()
    ))
}

fn too_large(size: u64, max: u64) -> Status {
    Status::resource_exhausted(format!(
        "the component is {} but this host accepts at most {} (host.max_upload)",
        format_bytes(size),
        format_bytes(max)
    ))
}

/// The API's edge: a refusal becomes a gRPC status with its whole story.
fn status(e: ControlError) -> Status {
    let message = crate::error_chain(&e);
    let code = match e.code() {
        Refusal::InvalidArgument => Code::InvalidArgument,
        Refusal::NotFound => Code::NotFound,
        Refusal::FailedPrecondition => Code::FailedPrecondition,
        Refusal::ResourceExhausted => Code::ResourceExhausted,
        Refusal::PermissionDenied => Code::PermissionDenied,
        Refusal::Unavailable => Code::Unavailable,
        Refusal::Internal => Code::Internal,
    };
    Status::new(code, message)
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn upload(
        &self,
        request: Request<Streaming<proto::UploadRequest>>,
    ) -> Result<Response<proto::UploadResponse>, Status> {
        let principal = self.principal(&request)?;
        let mut stream = request.into_inner();
        // Every refused upload is counted, under the tenant it was for (or
        // the caller's, when the header never arrived).
        let mut tenant = match &principal {
            Principal::Tenant(own) => own.clone(),
            Principal::Operator => "<operator>".to_owned(),
        };
        let result = async {
            let header = self.header(&mut stream).await?;
            tenant = self.auth.tenant(&principal, &header.tenant)?;
            let _slots = self.uploads.admit(&tenant)?;
            let (component, pulled, signer) = if header.oci_reference.is_empty() {
                tracing::info!(
                    tenant,
                    name = %Shown(&header.name, MAX_NAME),
                    size = header.size,
                    "receiving an upload"
                );
                let component = self.receive(header.size, &mut stream).await?;
                let what = format!("the upload of `{}`", Shown(&header.name, MAX_NAME));
                let signature =
                    (!header.signature.is_empty()).then_some(header.signature.as_bytes());
                let signer = self
                    .catalog
                    .file_signer(&tenant, &what, component.path(), signature)
                    .await
                    .map_err(status)?;
                (component, None, signer)
            } else {
                if stream.next().await.is_some() {
                    return Err(Status::invalid_argument(
                        "an upload by oci_reference carries no bytes (size 0, no chunks)",
                    ));
                }
                let pulled = self
                    .catalog
                    .pull(&tenant, &header.oci_reference, &self.registries)
                    .await
                    .map_err(status)?;
                (pulled.component, Some(pulled.pulled), pulled.signer)
            };
            let new = NewVersion {
                name: header.name,
                aliases: header.aliases.into_iter().collect(),
                labels: header.labels.into_iter().collect(),
                config: header.config.into_iter().collect(),
                reuse: match header.reuse {
                    None => DeploymentReuse::Tenant,
                    Some(r) => StoredReuse {
                        max_tasks: r.max_tasks,
                        idle_ms: r.idle_ms,
                    }
                    .get()
                    .map_err(|e| status(e.into()))?,
                },
                inactive: header.inactive,
                canary: header
                    .canary
                    .map(|c| {
                        Ramp::new(
                            c.steps_percent,
                            Duration::from_millis(c.every_ms),
                            c.margin_percent,
                            c.min_tasks,
                        )
                    })
                    .transpose()
                    .map_err(|e| status(e.into()))?,
                pulled,
                signer,
            };
            let (view, uploaded) = self
                .catalog
                .upload(&tenant, new, component)
                .await
                .map_err(status)?;
            let beyond_grants = uploaded.beyond_grants;
            let replay = uploaded.replay.unwrap_or_default();
            // A replay with nothing of the deployment active (compared with
            // the recording alone) is reported too, under no `against`.
            let changes = match uploaded.changes {
                Some((against, report)) => Some(changes_to_proto(against, &report)),
                None if !replay.types.is_empty() => Some(proto::ChangeReport::default()),
                None => None,
            };
            Ok::<_, Status>(proto::UploadResponse {
                component: Some(to_proto(&view)),
                already_stored: uploaded.already_stored,
                changes: changes.map(|changes| proto::ChangeReport {
                    beyond_grants,
                    replayed: replay_to_proto(&replay),
                    replay_cut_short: replay.cut_short,
                    ..changes
                }),
            })
        }
        .await;
        self.session.metrics.upload(&tenant, result.is_ok());
        if let Err(e) = &result {
            // A refusal may quote what the caller sent.
            tracing::info!(tenant, "upload refused: {}", Escaped(e.message()));
        }
        result.map(Response::new)
    }

    async fn list(
        &self,
        request: Request<proto::ListRequest>,
    ) -> Result<Response<proto::ListResponse>, Status> {
        let tenant = self.tenant(&request, &request.get_ref().tenant)?;
        let views = self.catalog.list(&tenant).await.map_err(status)?;
        Ok(Response::new(proto::ListResponse {
            components: views.iter().map(to_proto).collect(),
        }))
    }

    async fn describe(
        &self,
        request: Request<proto::DescribeRequest>,
    ) -> Result<Response<proto::Component>, Status> {
        let tenant = self.tenant(&request, &request.get_ref().tenant)?;
        let view = self
            .catalog
            .describe(&tenant, &request.get_ref().digest)
            .await
            .map_err(status)?;
        Ok(Response::new(to_proto(&view)))
    }

    async fn remove(
        &self,
        request: Request<proto::RemoveRequest>,
    ) -> Result<Response<proto::Component>, Status> {
        let tenant = self.tenant(&request, &request.get_ref().tenant)?;
        let r = request.get_ref();
        let view = self
            .catalog
            .remove(&tenant, &r.digest, r.force)
            .await
            .map_err(status)?;
        Ok(Response::new(to_proto(&view)))
    }

    async fn activate(
        &self,
        request: Request<proto::ActivateRequest>,
    ) -> Result<Response<proto::ActivateResponse>, Status> {
        let tenant = self.tenant(&request, &request.get_ref().tenant)?;
        let activated = self
            .catalog
            .activate(&tenant, &request.get_ref().digest)
            .await;
        activated.map(activate_response).map_err(status)
    }

    async fn approve(
        &self,
        request: Request<proto::ActivateRequest>,
    ) -> Result<Response<proto::ActivateResponse>, Status> {
        if self.principal(&request)? != Principal::Operator {
            return Err(Status::permission_denied(
                "only the operator's token approves a version: a tenant's rollout is the operator's policy",
            ));
        }
        let tenant = self.tenant(&request, &request.get_ref().tenant)?;
        let approved = self
            .catalog
            .approve(&tenant, &request.get_ref().digest)
            .await;
        approved.map(activate_response).map_err(status)
    }

    async fn status(
        &self,
        request: Request<proto::StatusRequest>,
    ) -> Result<Response<proto::StatusResponse>, Status> {
        let principal = self.principal(&request)?;
        let tenants = self.auth.scope(&principal, &request.get_ref().tenant)?;
        let host = self.session.permits.host_usage();
        let metrics = &self.session.metrics;
        let mut stored = Vec::with_capacity(tenants.len());
        for name in &tenants {
            let views = self.catalog.list(name).await.map_err(status)?;
            let held: Vec<proto::HeldVersion> = views
                .iter()
                .filter(|v| !v.version.held.is_empty())
                .map(|v| proto::HeldVersion {
                    deployment: v.version.name.clone(),
                    digest: v.version.digest.clone(),
                    reasons: v.version.held.clone(),
                })
                .collect();
            let (active, active_signers) = views
                .into_iter()
                .filter(|v| v.active)
                .map(|v| {
                    let signer = v.version.signer.unwrap_or_default();
                    let name = v.version.name;
                    ((name.clone(), v.version.digest), (name, signer))
                })
                .unzip();
            stored.push((active, active_signers, held));
        }
        let tenants = tenants
            .into_iter()
            .zip(stored)
            .map(|(name, (active, active_signers, held))| {
                let usage = self.session.permits.tenant_usage(&name);
                let spec = self.catalog.spec(&name);
                let share = spec
                    .as_ref()
                    .map(|spec| spec.tenant.cpu)
                    .unwrap_or_default();
                let reuse = spec.ok().and_then(|spec| spec.tenant.reuse);
                let cpu = metrics.cpu(&name);
                let canaries = self
                    .catalog
                    .canaries(&name)
                    .into_iter()
                    .map(|c| {
                        let (active, candidate) = c.split.counts();
                        let by_outcome = |counts| {
                            outcomes(&counts)
                                .into_iter()
                                .map(|(o, n)| (o.to_owned(), n))
                                .collect()
                        };
                        proto::CanaryStatus {
                            deployment: c.deployment,
                            percent: c.canary.percent(),
                            step: saturate(c.canary.step),
                            steps: saturate(c.canary.ramp.steps().len()),
                            candidate: c.canary.candidate,
                            active_outcomes: by_outcome(active),
                            candidate_outcomes: by_outcome(candidate),
                        }
                    })
                    .collect();
                let following = self
                    .follower
                    .states(&name)
                    .into_iter()
                    .map(|s| following(s, &active, &held))
                    .collect();
                let recorded = self
                    .catalog
                    .samples()
                    .summary(&name)
                    .into_iter()
                    .map(|s| proto::RecordedType {
                        name: s.activity_type,
                        attempts: saturate(s.attempts),
                        bytes: s.bytes,
                    })
                    .collect();
                proto::TenantStatus {
                    active,
                    active_signers,
                    held,
                    canaries,
                    recorded,
                    cpu_weight: share.weight.get(),
                    cpu_max: share.max.map_or(0.0, |max| max.cores()),
                    cpu_seconds: cpu.used.as_secs_f64(),
                    cpu_wait_seconds: cpu.waited.as_secs_f64(),
                    cpu_throttled_seconds: cpu.throttled.as_secs_f64(),
                    reuse_max_tasks: reuse.map_or(0, Reuse::max_tasks),
                    reuse_idle_ms: reuse.map_or(0, |r| {
                        u64::try_from(r.idle().as_millis()).unwrap_or(u64::MAX)
                    }),
                    reused_tasks: metrics.reused_tasks(&name),
                    max_concurrent: usage.map_or(0, |u| saturate(u.limit)),
                    in_use: usage.map_or(0, |u| saturate(u.in_use)),
                    in_flight: u32::try_from(metrics.in_flight(&name)).unwrap_or(u32::MAX),
                    outcomes: metrics.outcomes(&name).into_iter().collect(),
                    activity_types: self.catalog.registry().activity_types(&name),
                    following,
                    name,
                }
            })
            .collect();
        Ok(Response::new(proto::StatusResponse {
            host_max_concurrent: saturate(host.limit),
            host_in_use: saturate(host.in_use),
            tenants,
        }))
    }

    async fn run(
        &self,
        request: Request<proto::RunRequest>,
    ) -> Result<Response<proto::RunResponse>, Status> {
        let tenant = self.tenant(&request, &request.get_ref().tenant)?;
        let r = request.into_inner();
        let mut args = Vec::with_capacity(r.args_json.len());
        for (i, text) in r.args_json.iter().enumerate() {
            let value: Value = serde_json::from_str(text).map_err(|e| {
                Status::invalid_argument(format!("argument {}: not JSON: {e}", i + 1))
            })?;
            args.push(value);
        }
        let Ok(_slot) = self.runs.clone().try_acquire_owned() else {
            return Err(Status::resource_exhausted(format!(
                "{RUN_SLOTS} smoke-test runs are already running on this host; try again"
            )));
        };
        // Through the session loop, as an engine's task: routed by alias,
        // limited by the type's and the host's slots, counted, and
        // cancelled when the client goes away (tonic drops this call).
        let pending = self
            .local
            .submit(Submission {
                tenant,
                activity_type: r.activity_type,
                args: Args::Positional(args),
                info: TaskInfo {
                    attempt: 1,
                    ..TaskInfo::default()
                },
                deadline: None,
                observer: None,
            })
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let outcome = match pending.outcome().await {
            Ok(value) => run_response::Outcome::ResultJson(value.to_string()),
            Err(f) => run_response::Outcome::Failure(failure_to_proto(&f)),
        };
        Ok(Response::new(proto::RunResponse {
            outcome: Some(outcome),
        }))
    }
}

/// What `activate` and `approve` answer: the version, and the one it
/// replaced.
fn activate_response(
    (view, previous): (super::catalog::VersionView, Option<String>),
) -> Response<proto::ActivateResponse> {
    Response::new(proto::ActivateResponse {
        component: Some(to_proto(&view)),
        previous_digest: previous.unwrap_or_default(),
    })
}

/// A followed tag as `status` shows it. The follower knows what it pulled;
/// the catalog knows what became of it since: a held version the operator
/// approved is the active one, a removed one is held no more.
fn following(
    s: FollowState,
    active: &std::collections::HashMap<String, String>,
    held: &[proto::HeldVersion],
) -> proto::Following {
    let mut following = proto::Following {
        reference: s.reference,
        deployment: s.deployment,
        wanted: s.wanted.unwrap_or_default(),
        active: s.active.unwrap_or_default(),
        last_error: s.last_error.unwrap_or_default(),
        held: String::new(),
    };
    if let Some(digest) = s.held {
        if active.get(&following.deployment) == Some(&digest) {
            following.active = digest;
        } else if held.iter().any(|h| h.digest == digest) {
            following.held = digest;
        }
    }
    following
}

fn saturate(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
