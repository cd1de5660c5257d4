//! Who may be reached and how: the registries a pull speaks plain HTTP to,
//! credentials, the largest component, the deadline, and where a pull may
//! fetch from; and the OCI client every pull, resolution and push goes
//! through, whose connections all pass the host's proxy (`egress`).

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use oci_client::Client;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_wasm::WasmClient;

use super::egress::{Allowance, Destinations, Egress};
use super::error::{RegistrySaid, unreachable};
use super::{Credential, DEFAULT_DEADLINE, OciError, OciRef, RepositoryPrefix};

/// Who may be reached and how: registries that may be spoken to in plain
/// HTTP (only these), credentials, the largest component pulled, and where
/// a pull may fetch from.
#[derive(Clone)]
pub struct Registries {
    pub insecure: Vec<String>,
    /// For a registry without its own credential.
    pub auth: RegistryAuth,
    /// Registry host → its credential.
    pub credentials: BTreeMap<String, Credential>,
    pub max_bytes: u64,
    /// A registry's silence on one read.
    pub timeout: Duration,
    /// A whole pull, or a tag's resolution, from first byte to last.
    pub deadline: Duration,
    /// Hosts a pull may fetch from besides the reference's own registry
    /// (redirects, token realms): the tenant's `registries` rules; `Any`
    /// for a command-line pull of the user's own.
    pub destinations: Destinations,
}

impl Registries {
    /// Plain HTTP for `insecure` only; credentials from
    /// `CORRAL_REGISTRY_USERNAME` / `CORRAL_REGISTRY_PASSWORD` (never a
    /// command line: others can read it).
    pub fn from_env(insecure: Vec<String>, max_bytes: u64) -> Self {
        let auth = match (
            std::env::var("CORRAL_REGISTRY_USERNAME"),
            std::env::var("CORRAL_REGISTRY_PASSWORD"),
        ) {
            (Ok(user), Ok(password)) => RegistryAuth::Basic(user, password),
            _ => RegistryAuth::Anonymous,
        };
        Registries {
            insecure,
            auth,
            credentials: BTreeMap::new(),
            max_bytes,
            timeout: Duration::from_secs(60),
            deadline: DEFAULT_DEADLINE,
            destinations: Destinations::Any,
        }
    }

    /// These registries for a tenant: a pull fetches only from the hosts
    /// its `rules` name.
    pub fn within(&self, rules: &[RepositoryPrefix]) -> Registries {
        let mut registries = self.clone();
        registries.destinations = Destinations::Only {
            hosts: rules.iter().map(|r| r.registry().to_owned()).collect(),
            insecure: self.insecure.clone(),
        };
        registries
    }

    /// Where a pull of `reference` may fetch from.
    pub(super) fn destinations_for(&self, reference: &OciRef) -> Destinations {
        match &self.destinations {
            Destinations::Any => Destinations::Any,
            Destinations::Only { hosts, insecure } => {
                let mut hosts = hosts.clone();
                hosts.push(reference.registry().to_owned());
                Destinations::Only {
                    hosts,
                    insecure: insecure.clone(),
                }
            }
        }
    }

    pub fn with_credentials(&self, more: &BTreeMap<String, Credential>) -> Registries {
        let mut registries = self.clone();
        registries
            .credentials
            .extend(more.iter().map(|(k, v)| (k.clone(), v.clone())));
        registries
    }

    /// These registries for a pull on a tenant's behalf: the host's
    /// credential for any registry (`CORRAL_REGISTRY_USERNAME` and
    /// `CORRAL_REGISTRY_PASSWORD`) is never sent, as the tenant's registry
    /// would receive it; only credentials configured for the registry
    /// itself are.
    pub fn for_tenant(&self) -> Registries {
        let mut registries = self.clone();
        registries.auth = RegistryAuth::Anonymous;
        registries
    }

    pub(super) fn auth_for(&self, reference: &OciRef) -> Result<RegistryAuth, OciError> {
        match self.credentials.get(reference.registry()) {
            Some(credential) => credential.auth(reference.registry()),
            None => Ok(self.auth.clone()),
        }
    }

    /// A client whose every connection goes through `egress`.
    pub(super) fn client(&self, egress: &Egress) -> WasmClient {
        super::tls_provider();
        WasmClient::new(Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(self.insecure.clone()),
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(self.timeout),
            https_proxy: Some(egress.url().to_owned()),
            http_proxy: Some(egress.url().to_owned()),
            ..ClientConfig::default()
        }))
    }

    /// Runs `work` through a proxy for `reference` with `allowance` bytes,
    /// within the deadline; what the proxy saw decides the error.
    pub(super) async fn through<T, F>(
        &self,
        reference: &OciRef,
        allowance: u64,
        work: impl FnOnce(WasmClient, Allowance) -> F,
    ) -> Result<T, OciError>
    where
        F: Future<Output = Result<T, OciError>>,
    {
        let egress = Egress::start(self.destinations_for(reference), allowance)
            .await
            .map_err(OciError::Proxy)?;
        let client = self.client(&egress);
        let done = tokio::time::timeout(self.deadline, work(client, egress.allowance())).await;
        let text = || reference.to_string();
        match done {
            Ok(Ok(value)) => Ok(value),
            // What the proxy refused or cut off explains the client's
            // failure better than the client can (it saw a broken
            // connection); a failure of its own (a layer longer than
            // declared) explains itself.
            Ok(Err(e)) => Err(match (egress.refused(), &e) {
                (Some(destination), _) => OciError::Elsewhere {
                    reference: text(),
                    destination,
                },
                (None, OciError::Registry { .. })
                    if let Some((destination, error)) = egress.unreachable() =>
                {
                    unreachable(
                        reference,
                        self,
                        RegistrySaid::Connect { destination, error },
                    )
                }
                (None, OciError::Registry { .. } | OciError::Unreachable { .. })
                    if egress.over() =>
                {
                    OciError::Oversent {
                        reference: text(),
                        received: egress.received(),
                    }
                }
                _ => e,
            }),
            Err(_) => Err(match egress.refused() {
                Some(destination) => OciError::Elsewhere {
                    reference: text(),
                    destination,
                },
                None => OciError::Deadline {
                    reference: text(),
                    deadline: self.deadline,
                },
            }),
        }
    }
}
