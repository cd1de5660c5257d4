//! Signed code only. A tenant's trust policy names the public keys its
//! versions must be signed by (ECDSA P-256 in PEM, what `cosign
//! generate-key-pair` and `corral key new` make) and whether every version
//! must be: with `require`, a version not verifiably signed by one of them
//! never serves, however it comes (a deploy from a registry, a followed
//! tag, a local file, a restart).
//!
//! The signatures are Sigstore's cosign format, keys and signatures read
//! and made with the `sigstore` crate: for a registry's artifact, a simple-signing payload
//! naming the manifest's digest, signed, in a manifest cosign finds by its
//! tag scheme (`sha256-<digest>.sig`) or the OCI 1.1 referrers API
//! (fetched by `crate::oci::signatures`); for a local file, `cosign
//! sign-blob`'s signature over its bytes (`verify_blob`). Verification is key-based and offline: no
//! transparency log or certificate authority is asked.

pub mod file;
pub mod payload;
pub mod sign;

use std::path::{Path, PathBuf};

use base64::Engine as _;
use sha2::{Digest, Sha256};
use sigstore::crypto::{CosignVerificationKey, Signature, SigningScheme};

use crate::oci::signatures::PayloadSignature;
use corral_core::shown::shown;
use payload::SimpleSigning;

/// One public key a tenant trusts.
#[derive(Clone)]
pub struct TrustedKey {
    /// `sha256:<hex>` of the key's DER form: the signer a version records
    /// and `status` shows.
    pub fingerprint: String,
    key: CosignVerificationKey,
}

impl std::fmt::Debug for TrustedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.fingerprint)
    }
}

impl TrustedKey {
    /// The key in the PEM file at `path`: an ECDSA P-256 public key.
    pub fn read(path: &Path) -> Result<TrustedKey, KeyError> {
        let pem = std::fs::read(path).map_err(|source| KeyError::Read {
            path: path.to_owned(),
            source,
        })?;
        TrustedKey::from_pem(&pem).map_err(|why| KeyError::NotAKey {
            path: path.to_owned(),
            why,
        })
    }

    /// A public key from its PEM text, or why it is not one corral takes.
    pub fn from_pem(pem: &[u8]) -> Result<TrustedKey, String> {
        let key =
            CosignVerificationKey::try_from_pem(pem).map_err(|e| shown(&e.to_string(), 200))?;
        let CosignVerificationKey::ECDSA_P256_SHA256_ASN1(der) = &key else {
            return Err(
                "not an ECDSA P-256 key (cosign's default; `corral key new` makes one)".into(),
            );
        };
        Ok(TrustedKey {
            fingerprint: fingerprint(der),
            key,
        })
    }

    /// Whether `signature` (base64, ASN.1 DER) is this key's over `message`.
    fn verifies(&self, signature: &str, message: &[u8]) -> bool {
        self.key
            .verify_signature(
                Signature::Base64Encoded(signature.trim().as_bytes()),
                message,
            )
            .is_ok()
    }
}

/// `sha256:<hex>` of a key's DER form.
pub fn fingerprint(der: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(der)))
}

/// A key file that cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("reading `{}`: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{}` is not a public key corral can verify with: {why}", path.display())]
    NotAKey { path: PathBuf, why: String },
}

/// A tenant's trust, validated: the keys its versions must be signed by,
/// and whether every version must be. The default trusts no key and
/// requires nothing.
#[derive(Clone, Debug, Default)]
pub struct TrustPolicy {
    keys: Vec<TrustedKey>,
    require: bool,
}

impl TrustPolicy {
    /// The keys in the PEM files at `paths`; `require` needs at least one.
    pub fn new(paths: &[PathBuf], require: bool) -> Result<TrustPolicy, PolicyError> {
        let keys = paths
            .iter()
            .enumerate()
            .map(|(i, p)| TrustedKey::read(p).map_err(|e| PolicyError::Key(i, e)))
            .collect::<Result<Vec<_>, _>>()?;
        if require && keys.is_empty() {
            return Err(PolicyError::RequireWithoutKeys);
        }
        Ok(TrustPolicy { keys, require })
    }

    /// Whether every version must be signed by one of its keys.
    pub fn require(&self) -> bool {
        self.require
    }

    /// Whether it names any key: signatures are looked for only then.
    pub fn has_keys(&self) -> bool {
        !self.keys.is_empty()
    }

    pub fn fingerprints(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.fingerprint.as_str())
    }

    /// Whether a version recorded as signed by `signer` may serve: always
    /// when nothing is required; otherwise only a key trusted now.
    pub fn admits(&self, signer: Option<&str>) -> bool {
        !self.require || signer.is_some_and(|s| self.fingerprints().any(|f| f == s))
    }

    /// The trusted key whose signature over `message` `signature` is.
    fn signer_of(&self, signature: &str, message: &[u8]) -> Option<&TrustedKey> {
        self.keys.iter().find(|k| k.verifies(signature, message))
    }

    /// Verifies `cosign sign-blob`'s signature (base64 ASN.1 DER ECDSA,
    /// as its `--output-signature` file holds it) over a file's `bytes`:
    /// the signer's fingerprint, or why it is refused.
    pub fn verify_blob(&self, bytes: &[u8], signature: &[u8]) -> Result<String, Refused> {
        let text = std::str::from_utf8(signature)
            .ok()
            .map(str::trim)
            .filter(|t| base64::engine::general_purpose::STANDARD.decode(t).is_ok())
            .ok_or(Refused::Malformed(
                "a signature file holds base64 text (cosign sign-blob's output)".to_owned(),
            ))?;
        match self.signer_of(text, bytes) {
            Some(key) => Ok(key.fingerprint.clone()),
            None => Err(Refused::UntrustedKey),
        }
    }
}

/// A policy that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("keys[{0}]: {1}")]
    Key(usize, #[source] KeyError),
    #[error("`require = true` needs at least one key to verify with")]
    RequireWithoutKeys,
}

/// Why a version is not verifiably signed by a trusted key.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("no signature for {digest} (sign it: corral sign, or cosign sign --key)")]
    Unsigned { digest: String },
    #[error("signed, but by no key the tenant trusts")]
    UntrustedKey,
    #[error("its signature is for {signed}, not {digest}")]
    OtherDigest { signed: String, digest: String },
    #[error("its signatures are not cosign's: {0}")]
    Malformed(String),
    #[error("no signature file (--signature FILE.sig, cosign sign-blob's output)")]
    NoSignatureFile,
    #[error("its signatures could not be read: {0}")]
    Unreadable(String),
}

impl Refused {
    /// Its reason as a metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::Unsigned { .. } | Refused::NoSignatureFile => "unsigned",
            Refused::UntrustedKey => "untrusted_key",
            Refused::OtherDigest { .. } => "other_digest",
            Refused::Malformed(_) => "malformed",
            Refused::Unreadable(_) => "unreadable",
        }
    }
}

impl TrustPolicy {
    /// The signer of the artifact whose manifest digest is `digest`, by the
    /// simple-signing `signatures` found for it: the first a trusted key
    /// made whose payload names `digest`; otherwise why none serves.
    pub fn verify_payloads(
        &self,
        digest: &str,
        signatures: &[PayloadSignature],
    ) -> Result<String, Refused> {
        if signatures.is_empty() {
            return Err(Refused::Unsigned {
                digest: digest.to_owned(),
            });
        }
        let mut other = None;
        let mut malformed = None;
        let mut untrusted = false;
        for s in signatures {
            let payload: SimpleSigning = match serde_json::from_slice(&s.payload) {
                Ok(payload) => payload,
                Err(e) => {
                    malformed = Some(shown(&e.to_string(), 200));
                    continue;
                }
            };
            let Some(key) = self.signer_of(&s.signature, &s.payload) else {
                untrusted = true;
                continue;
            };
            if payload.vouches_for(digest) {
                return Ok(key.fingerprint.clone());
            }
            other = Some(shown(&payload.critical.image.docker_manifest_digest, 100));
        }
        Err(match (other, untrusted, malformed) {
            (Some(signed), _, _) => Refused::OtherDigest {
                signed,
                digest: digest.to_owned(),
            },
            (None, true, _) => Refused::UntrustedKey,
            (None, false, Some(why)) => Refused::Malformed(why),
            (None, false, None) => Refused::Unsigned {
                digest: digest.to_owned(),
            },
        })
    }
}

/// The signing scheme of every key corral makes and takes.
pub fn scheme() -> SigningScheme {
    SigningScheme::ECDSA_P256_SHA256_ASN1
}

#[cfg(test)]
mod tests;
