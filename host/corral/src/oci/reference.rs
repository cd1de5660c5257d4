//! Where a component is in a registry (`oci://registry/repository:tag` or
//! `…@sha256:…`), and the rules that say where a tenant may deploy from.

use std::fmt;
use std::str::FromStr;

use oci_client::Reference;

use super::{OciError, SCHEME};

/// A component's place in a registry: `oci://registry/repository:tag` or
/// `oci://registry/repository@sha256:…`.
#[derive(Clone, Debug)]
pub struct OciRef {
    pub(super) reference: Reference,
}

impl OciRef {
    /// The registry's host (and port).
    pub fn registry(&self) -> &str {
        self.reference.registry()
    }

    /// The repository's last segment (`greeter` of `acme/greeter`).
    pub fn repository_name(&self) -> &str {
        let repository = self.reference.repository();
        repository.rsplit('/').next().unwrap_or(repository)
    }

    /// `registry/repository`: the identity a signature payload names.
    pub fn repository(&self) -> String {
        format!(
            "{}/{}",
            self.reference.registry(),
            self.reference.repository()
        )
    }

    /// The same repository, at `tag`.
    pub fn with_tag(&self, tag: &str) -> OciRef {
        OciRef {
            reference: Reference::with_tag(
                self.reference.registry().to_owned(),
                self.reference.repository().to_owned(),
                tag.to_owned(),
            ),
        }
    }

    /// The same repository, pinned to `digest`.
    pub fn at_digest(&self, digest: &str) -> OciRef {
        OciRef {
            reference: Reference::with_digest(
                self.reference.registry().to_owned(),
                self.reference.repository().to_owned(),
                digest.to_owned(),
            ),
        }
    }

    /// The tag the reference names, if it names one.
    pub fn tag(&self) -> Option<&str> {
        self.reference.tag()
    }

    /// The digest the reference pins, if it pins one.
    pub fn digest(&self) -> Option<&str> {
        self.reference.digest()
    }
}

impl fmt::Display for OciRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}", self.reference.whole())
    }
}

impl FromStr for OciRef {
    type Err = OciError;

    fn from_str(text: &str) -> Result<Self, OciError> {
        let bad = |why: String| OciError::Reference {
            reference: text.to_owned(),
            why,
        };
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad(format!("it does not start with {SCHEME}")))?;
        // Without a registry, oci-client would quietly mean Docker Hub.
        let (registry, _) = rest
            .split_once('/')
            .ok_or_else(|| bad("it names no repository: oci://REGISTRY/REPOSITORY:TAG".into()))?;
        if !registry.contains(['.', ':']) && registry != "localhost" {
            return Err(bad(format!(
                "`{registry}` is not a registry host (oci://registry.example.com/…)"
            )));
        }
        // oci-client would quietly mean `:latest`: a host should run what
        // was named.
        let last = rest.rsplit('/').next().unwrap_or_default();
        if !last.contains([':', '@']) {
            return Err(bad("it names no tag or digest (…:1.0 or …@sha256:…)".into()));
        }
        let reference = Reference::from_str(rest).map_err(|e| bad(e.to_string()))?;
        Ok(OciRef { reference })
    }
}

/// A registry, or a repository prefix in one, a tenant may deploy from:
/// `registry.example.com` or `registry.example.com/acme` (which allows
/// `…/acme/greeter`, not `…/acmecorp/…`). Built only by [`FromStr`].
#[derive(Clone, Debug, PartialEq)]
pub struct RepositoryPrefix(String);

impl RepositoryPrefix {
    /// The registry host (and port) the prefix is in.
    pub fn registry(&self) -> &str {
        self.0.split('/').next().unwrap_or(&self.0)
    }

    pub fn allows(&self, reference: &OciRef) -> bool {
        let whole = format!(
            "{}/{}",
            reference.registry(),
            reference.reference.repository()
        );
        whole == self.0
            || whole
                .strip_prefix(&self.0)
                .is_some_and(|rest| rest.starts_with('/'))
    }
}

impl fmt::Display for RepositoryPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for RepositoryPrefix {
    type Err = OciError;

    fn from_str(text: &str) -> Result<Self, OciError> {
        let bad = |why: &str| OciError::Reference {
            reference: text.to_owned(),
            why: why.to_owned(),
        };
        let trimmed = text.trim_end_matches('/');
        if trimmed.contains("://") {
            return Err(bad(
                "name the registry without a scheme: registry.example.com/acme",
            ));
        }
        let registry = trimmed.split('/').next().unwrap_or_default();
        if !registry.contains(['.', ':']) && registry != "localhost" {
            return Err(bad(
                "it does not start with a registry host (registry.example.com/…)",
            ));
        }
        let path_ok = trimmed.split('/').skip(1).all(|segment| {
            !segment.is_empty()
                && segment
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
        });
        if !path_ok || trimmed.contains(['@', ' ']) {
            return Err(bad("repositories are lower-case segments joined by '/'"));
        }
        Ok(RepositoryPrefix(trimmed.to_owned()))
    }
}

/// Whether `text` is meant as an OCI reference rather than a file.
pub fn is_reference(text: &str) -> bool {
    text.starts_with(SCHEME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_name_a_registry_a_repository_and_a_tag_or_digest() {
        let ok: OciRef = "oci://registry.example.com/acme/greeter:1.2.0"
            .parse()
            .unwrap();
        assert_eq!(ok.registry(), "registry.example.com");
        assert_eq!(
            ok.to_string(),
            "oci://registry.example.com/acme/greeter:1.2.0"
        );
        let pinned: OciRef = format!(
            "oci://127.0.0.1:5000/acme/greeter@sha256:{}",
            "a".repeat(64)
        )
        .parse()
        .unwrap();
        assert_eq!(
            pinned.digest(),
            Some(format!("sha256:{}", "a".repeat(64)).as_str())
        );
        for (bad, why) in [
            (
                "registry.example.com/acme/greeter:1",
                "does not start with oci://",
            ),
            ("oci://greeter:1", "names no repository"),
            ("oci://acme/greeter:1", "is not a registry host"),
            (
                "oci://registry.example.com/acme/greeter",
                "names no tag or digest",
            ),
            (
                "oci://registry.example.com/Acme/greeter:1",
                "not an OCI reference",
            ),
        ] {
            let e = bad.parse::<OciRef>().err().unwrap().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_repository_prefix_allows_its_repositories_on_segment_boundaries() {
        let acme: RepositoryPrefix = "registry.example.com/acme/".parse().unwrap();
        let allows = |text: &str| acme.allows(&text.parse().unwrap());
        assert!(allows("oci://registry.example.com/acme/greeter:1"));
        assert!(allows("oci://registry.example.com/acme/team/greeter:1"));
        assert!(!allows("oci://registry.example.com/acmecorp/greeter:1"));
        assert!(!allows("oci://registry.example.com/other/greeter:1"));
        assert!(!allows(
            "oci://registry.example.com.evil.net/acme/greeter:1"
        ));
        let whole: RepositoryPrefix = "127.0.0.1:5000".parse().unwrap();
        assert!(whole.allows(&"oci://127.0.0.1:5000/any/thing:1".parse().unwrap()));
        assert!(!whole.allows(&"oci://127.0.0.1:50001/any/thing:1".parse().unwrap()));
        for bad in [
            "https://registry.example.com",
            "acme/greeter",
            "registry.example.com/Acme",
        ] {
            assert!(bad.parse::<RepositoryPrefix>().is_err(), "{bad}");
        }
    }
}
