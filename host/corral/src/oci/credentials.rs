//! Registry credentials: a user name in the configuration, the password
//! from an environment variable or a file — never the configuration's text,
//! never a log line. Read at each pull, so a rotated password is used
//! without a restart.

use std::path::PathBuf;

use oci_client::secrets::RegistryAuth;

use super::OciError;

/// Where a registry password comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum PasswordSource {
    Env(String),
    File(PathBuf),
}

/// A user name and where its password is.
#[derive(Clone, Debug, PartialEq)]
pub struct Credential {
    pub username: String,
    pub password: PasswordSource,
}

impl Credential {
    /// The credential as oci-client sends it, the password read now.
    pub(super) fn auth(&self, registry: &str) -> Result<RegistryAuth, OciError> {
        let missing = |why: String| OciError::Credentials {
            registry: registry.to_owned(),
            why,
        };
        let password = match &self.password {
            PasswordSource::Env(name) => std::env::var(name)
                .map_err(|_| missing(format!("the environment variable {name} is not set")))?,
            PasswordSource::File(path) => std::fs::read_to_string(path)
                .map_err(|e| missing(format!("cannot read {}: {e}", path.display())))?
                .trim_end_matches(['\r', '\n'])
                .to_owned(),
        };
        Ok(RegistryAuth::Basic(self.username.clone(), password))
    }
}
