//! Where a configured component comes from: a file beside the
//! configuration, or an OCI registry.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::oci::{self, OciError, OciRef};

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
