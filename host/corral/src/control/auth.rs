//! Bearer tokens: each tenant's token reaches only that tenant; the
//! operator's reaches every tenant. The host keeps only SHA-256 hashes.

use std::collections::HashMap;

use corral_core::shown::{MAX_NAME, Shown};
use tonic::Status;
use tonic::metadata::MetadataMap;

use crate::token::TokenHash;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Operator,
    Tenant(String),
}

/// Token hashes → principals.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    tokens: HashMap<TokenHash, Principal>,
    tenants: Vec<String>,
}

impl Auth {
    /// The operator's token hash, and each tenant's.
    pub fn new<'a>(
        operator: Option<TokenHash>,
        tenants: impl IntoIterator<Item = (&'a str, Option<TokenHash>)>,
    ) -> Self {
        let mut auth = Auth::default();
        if let Some(hash) = operator {
            auth.tokens.insert(hash, Principal::Operator);
        }
        for (name, hash) in tenants {
            auth.tenants.push(name.to_owned());
            if let Some(hash) = hash {
                auth.tokens.insert(hash, Principal::Tenant(name.to_owned()));
            }
        }
        auth
    }

    /// The caller named by the request's `authorization: Bearer …` header.
    pub fn principal(&self, metadata: &MetadataMap) -> Result<Principal, Status> {
        let Some(value) = metadata.get("authorization") else {
            return Err(Status::unauthenticated(
                "no token: send `authorization: Bearer <token>` (CORRAL_TOKEN or --token)",
            ));
        };
        let value = value
            .to_str()
            .map_err(|_| Status::unauthenticated("the authorization header is not text"))?;
        let Some(hash) = TokenHash::of_bearer(value) else {
            return Err(Status::unauthenticated(
                "the authorization header must be `Bearer <token>`",
            ));
        };
        self.tokens
            .get(&hash)
            .cloned()
            .ok_or_else(|| Status::unauthenticated("the token is not valid on this host"))
    }

    /// The tenant a tenant-scoped call acts on: a tenant's own (an empty
    /// request means it), or the one the operator names.
    pub fn tenant(&self, principal: &Principal, requested: &str) -> Result<String, Status> {
        match principal {
            Principal::Tenant(own) if requested.is_empty() || requested == own => Ok(own.clone()),
            // The name asked for is the caller's text: escaped and cut, as
            // it is logged.
            Principal::Tenant(own) => Err(Status::permission_denied(format!(
                "the token of tenant `{own}` cannot act on tenant `{}`",
                Shown(requested, MAX_NAME)
            ))),
            Principal::Operator if requested.is_empty() => Err(Status::invalid_argument(
                "the operator token acts on any tenant: name one (--tenant)",
            )),
            Principal::Operator if self.tenants.iter().any(|t| t == requested) => {
                Ok(requested.to_owned())
            }
            Principal::Operator => Err(Status::not_found(format!(
                "no tenant `{}` is configured",
                Shown(requested, MAX_NAME)
            ))),
        }
    }

    /// The tenants a status call covers.
    pub fn scope(&self, principal: &Principal, requested: &str) -> Result<Vec<String>, Status> {
        match principal {
            Principal::Operator if requested.is_empty() => Ok(self.tenants.clone()),
            _ => self.tenant(principal, requested).map(|t| vec![t]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::generate_token;
    use tonic::Code;

    fn with_token(token: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("authorization", format!("Bearer {token}").parse().unwrap());
        m
    }

    #[test]
    fn tokens_reach_only_their_tenant_and_the_operator_reaches_all() {
        let (a, a_hash) = generate_token().unwrap();
        let (op, op_hash) = generate_token().unwrap();
        let auth = Auth::new(Some(op_hash), [("a", Some(a_hash)), ("b", None)]);

        let tenant_a = auth.principal(&with_token(&a)).unwrap();
        assert_eq!(tenant_a, Principal::Tenant("a".into()));
        assert_eq!(auth.tenant(&tenant_a, "").unwrap(), "a");
        assert_eq!(
            auth.tenant(&tenant_a, "b").unwrap_err().code(),
            Code::PermissionDenied
        );

        let operator = auth.principal(&with_token(&op)).unwrap();
        assert_eq!(auth.tenant(&operator, "b").unwrap(), "b");
        assert_eq!(
            auth.tenant(&operator, "").unwrap_err().code(),
            Code::InvalidArgument
        );
        assert_eq!(
            auth.tenant(&operator, "zz").unwrap_err().code(),
            Code::NotFound
        );
        assert_eq!(auth.scope(&operator, "").unwrap(), ["a", "b"]);

        let e = auth.principal(&MetadataMap::new()).unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated);
        let e = auth.principal(&with_token("corral_wrong")).unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated);
    }

    #[test]
    fn a_hash_is_64_hex_digits_in_either_case_and_shows_as_lowercase() {
        let upper = "AB".repeat(32);
        let hash: TokenHash = upper.parse().unwrap();
        assert_eq!(hash.to_string(), "ab".repeat(32));
        assert_eq!("ab".repeat(32).parse::<TokenHash>().unwrap(), hash);
        for bad in ["", "ab", &"zz".repeat(32), &"ab".repeat(33)] {
            assert!(bad.parse::<TokenHash>().is_err(), "{bad}");
        }
        let (token, hash) = generate_token().unwrap();
        assert_eq!(TokenHash::of_bearer(&format!("Bearer {token}")), Some(hash));
        assert_eq!(TokenHash::of_bearer(&token), None);
    }
}
