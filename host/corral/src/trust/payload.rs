//! The simple-signing payload cosign signs for a registry artifact (the
//! "cosign container image signature" of containers/image's signature
//! format): the manifest digest it vouches for and the repository it was
//! signed in. Defined here, not taken from `sigstore::cosign`, whose
//! feature brings Fulcio, Rekor, OAuth and a second OCI client for these
//! few fields.

use serde::{Deserialize, Serialize};

/// The `critical.type` cosign writes and checks.
pub const COSIGN_TYPE: &str = "cosign container image signature";

#[derive(Debug, Serialize, Deserialize)]
pub struct SimpleSigning {
    pub critical: Critical,
    /// Annotations a signer added (cosign's `-a`): carried, never trusted.
    #[serde(default)]
    pub optional: Option<serde_json::Value>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Critical {
    pub identity: Identity,
    pub image: Image,
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Identity {
    #[serde(rename = "docker-reference")]
    pub docker_reference: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Image {
    #[serde(rename = "docker-manifest-digest")]
    pub docker_manifest_digest: String,
}

impl SimpleSigning {
    /// The payload for the artifact of `repository` (`registry/name`)
    /// whose manifest digest is `digest`.
    pub fn new(repository: &str, digest: &str) -> SimpleSigning {
        SimpleSigning {
            critical: Critical {
                identity: Identity {
                    docker_reference: repository.to_owned(),
                },
                image: Image {
                    docker_manifest_digest: digest.to_owned(),
                },
                kind: COSIGN_TYPE.to_owned(),
            },
            optional: None,
        }
    }

    /// Whether it is a cosign signature payload vouching for `digest`.
    /// The repository is not compared: the digest names the bytes, and the
    /// same bytes copied to another repository keep their signature (as
    /// `cosign verify` does by default).
    pub fn vouches_for(&self, digest: &str) -> bool {
        self.critical.kind.eq_ignore_ascii_case(COSIGN_TYPE)
            && self.critical.image.docker_manifest_digest == digest
    }
}
