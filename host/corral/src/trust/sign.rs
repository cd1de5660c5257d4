//! Signing in cosign's format, for authors and pipelines: a key pair
//! (`corral key new`, cosign's encrypted private key and a PEM public
//! key), a registry artifact's signature (`corral sign`, `corral push
//! --sign`: a simple-signing payload for its manifest digest) and a local
//! file's (`corral sign FILE`: what `cosign sign-blob` writes). `cosign
//! verify --key` accepts what these make, and corral what cosign makes.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use sigstore::crypto::signing_key::{SigStoreKeyPair, SigStoreSigner};
use zeroize::Zeroizing;

use super::{fingerprint, scheme};

/// Where a private key's password comes from: corral's variable, or
/// cosign's (so one pipeline secret serves both tools).
pub const PASSWORD_VARIABLES: [&str; 2] = ["CORRAL_KEY_PASSWORD", "COSIGN_PASSWORD"];

/// The password for a private key, from the environment (empty if neither
/// variable is set, as cosign takes it).
pub fn password_from_env() -> Zeroizing<Vec<u8>> {
    let value = PASSWORD_VARIABLES
        .iter()
        .find_map(std::env::var_os)
        .unwrap_or_default();
    Zeroizing::new(value.as_encoded_bytes().to_vec())
}

/// A private key to sign with.
pub struct SigningKey {
    signer: SigStoreSigner,
    /// `sha256:<hex>` of its public key: what a host records as the signer.
    pub fingerprint: String,
}

impl SigningKey {
    /// The private key at `path`: cosign's encrypted format (with
    /// `password`), or an unencrypted PKCS#8 PEM.
    pub fn read(path: &Path, password: &[u8]) -> Result<SigningKey, SignError> {
        let pem = Zeroizing::new(std::fs::read(path).map_err(|source| SignError::Read {
            path: path.to_owned(),
            source,
        })?);
        let bad = |e: sigstore::errors::SigstoreError| SignError::Key {
            path: path.to_owned(),
            why: corral_core::shown::shown(&e.to_string(), 200),
        };
        let pair = if pem.windows(9).any(|w| w == b"ENCRYPTED") {
            SigStoreKeyPair::from_encrypted_pem(&pem, password).map_err(bad)?
        } else {
            SigStoreKeyPair::from_pem(&pem).map_err(bad)?
        };
        let der = pair.public_key_to_der().map_err(bad)?;
        let signer = pair.to_sigstore_signer(&scheme()).map_err(bad)?;
        Ok(SigningKey {
            signer,
            fingerprint: fingerprint(&der),
        })
    }

    /// Its base64 signature over `message` (ASN.1 DER ECDSA, as cosign's).
    pub fn sign(&self, message: &[u8]) -> Result<String, SignError> {
        let signature = self
            .signer
            .sign(message)
            .map_err(|e| SignError::Sign(e.to_string()))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(signature))
    }
}

/// A new key pair: the private key in cosign's encrypted format (under
/// `password`), the public key in PEM, and its fingerprint.
pub fn new_key_pair(password: &[u8]) -> Result<(Zeroizing<String>, String, String), SignError> {
    let fail = |e: sigstore::errors::SigstoreError| SignError::Sign(e.to_string());
    let signer = scheme().create_signer().map_err(fail)?;
    let pair = signer.to_sigstore_keypair().map_err(fail)?;
    let private = pair.private_key_to_encrypted_pem(password).map_err(fail)?;
    let public = pair.public_key_to_pem().map_err(fail)?;
    let der = pair.public_key_to_der().map_err(fail)?;
    Ok((private, public, fingerprint(&der)))
}

/// The simple-signing payload cosign signs for the artifact of
/// `repository` (`registry/name`) whose manifest digest is `digest`.
pub fn payload(repository: &str, digest: &str) -> Result<Vec<u8>, SignError> {
    serde_json::to_vec(&super::payload::SimpleSigning::new(repository, digest))
        .map_err(|e| SignError::Sign(e.to_string()))
}

/// Why signing failed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("reading `{}`: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{}` is not a private key corral can sign with (a wrong password?): {why}", path.display())]
    Key { path: PathBuf, why: String },
    #[error("signing: {0}")]
    Sign(String),
}
