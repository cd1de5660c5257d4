//! Admin API tokens: made at random, kept only as their SHA-256. A leaf:
//! the configuration, the admin API and `/metrics` all read it.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

/// A token's SHA-256: the only form in which the host keeps a token. Built
/// from a token, from a bearer header, or from the 64 hex digits a
/// configuration names; compared as bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash([u8; 32]);

impl TokenHash {
    pub fn of_token(token: &str) -> TokenHash {
        TokenHash(Sha256::digest(token.as_bytes()).into())
    }

    /// The hash of the token in an `authorization` header value
    /// (`Bearer <token>`); `None` when the value is not a bearer token.
    pub fn of_bearer(value: &str) -> Option<TokenHash> {
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))?;
        Some(TokenHash::of_token(token.trim()))
    }
}

/// Text that is not 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a hex SHA-256 (64 hex digits; `corral token` prints one)")]
pub struct NotAHash(String);

impl FromStr for TokenHash {
    type Err = NotAHash;

    fn from_str(text: &str) -> Result<Self, NotAHash> {
        let mut bytes = [0u8; 32];
        match hex::decode_to_slice(text, &mut bytes) {
            Ok(()) => Ok(TokenHash(bytes)),
            Err(_) => Err(NotAHash(corral_core::shown::shown(text, 80))),
        }
    }
}

impl fmt::Display for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TokenHash({self})")
    }
}

/// A new random token (256 bits, hex) and its SHA-256.
pub fn generate_token() -> Result<(String, TokenHash), getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    let token = format!("corral_{}", hex::encode(bytes));
    let hash = TokenHash::of_token(&token);
    Ok((token, hash))
}
