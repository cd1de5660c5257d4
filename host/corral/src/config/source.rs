//! Where a configured component comes from: a file beside the
//! configuration, or an OCI registry.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::oci::{self, Credential, OciError, OciRef, PasswordSource};

#[derive(Clone)]
pub enum ComponentSource {
    File(PathBuf),
    Oci(OciRef),
}

impl ComponentSource {
    /// `text` as written in `components`: `oci://…`, or a path relative to
    /// `base` (the configuration's directory).
    pub fn parse(text: &str, base: &Path) -> Result<Self, OciError> {
        if oci::is_reference(text) {
            Ok(ComponentSource::Oci(text.parse()?))
        } else {
            Ok(ComponentSource::File(base.join(text)))
        }
    }

    /// The deployment a configured component is a version of: the file's
    /// stem, or the repository's last segment.
    pub fn deployment(&self) -> String {
        let name = match self {
            ComponentSource::File(path) => {
                path.file_stem().map(|s| s.to_string_lossy().into_owned())
            }
            ComponentSource::Oci(reference) => Some(reference.repository_name().to_owned()),
        };
        name.filter(|n| !n.is_empty())
            .unwrap_or_else(|| "component".to_owned())
    }
}

impl fmt::Display for ComponentSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ComponentSource::File(path) => write!(f, "{}", path.display()),
            ComponentSource::Oci(reference) => write!(f, "{reference}"),
        }
    }
}

impl fmt::Debug for ComponentSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Followed tags: OCI references that name a tag (a digest never moves).
pub(super) fn follows(texts: &[String], key: &str) -> Result<Vec<OciRef>, super::ConfigError> {
    texts
        .iter()
        .map(|text| {
            let invalid = |problem: String| super::ConfigError::Invalid {
                key: key.to_owned(),
                problem,
            };
            let reference: OciRef = text.parse().map_err(|e: OciError| invalid(e.to_string()))?;
            if reference.digest().is_some() || reference.tag().is_none() {
                return Err(invalid(format!(
                    "`{text}` pins a digest, which never moves: follow a tag (…:stable)"
                )));
            }
            Ok(reference)
        })
        .collect()
}

/// A registry credential as written: a user name, and where the password
/// is (exactly one of an environment variable and a file).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCredential {
    username: String,
    password_env: Option<String>,
    password_file: Option<PathBuf>,
    /// Read only to refuse it without quoting it.
    password: Option<toml::Value>,
}

pub(super) fn credentials(
    raw: &std::collections::BTreeMap<String, RawCredential>,
    base: &Path,
    key: &str,
) -> Result<std::collections::BTreeMap<String, Credential>, super::ConfigError> {
    raw.iter()
        .map(|(registry, c)| {
            if c.password.is_some() {
                return Err(super::ConfigError::Invalid {
                    key: format!("{key}.{registry:?}.password"),
                    problem: "a password is never read from the configuration: name it with \
                              password_env or password_file"
                        .to_owned(),
                });
            }
            let password = match (&c.password_env, &c.password_file) {
                (Some(name), None) => PasswordSource::Env(name.clone()),
                (None, Some(path)) => PasswordSource::File(base.join(path)),
                _ => {
                    return Err(super::ConfigError::Invalid {
                        key: format!("{key}.{registry:?}"),
                        problem: "give the password as exactly one of password_env and \
                                  password_file (never in the configuration itself)"
                            .to_owned(),
                    });
                }
            };
            Ok((
                registry.clone(),
                Credential {
                    username: c.username.clone(),
                    password,
                },
            ))
        })
        .collect()
}
