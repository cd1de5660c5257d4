//! What one tenant may keep stored, and the refusal that names the numbers.

use super::store::{TenantIndex, Version};
use crate::config::Quota;

/// A new version that would take a tenant over its [`Quota`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaExceeded {
    #[error(
        "tenant `{tenant}` keeps {stored} versions, its limit (limits.max_versions): remove one first"
    )]
    Versions { tenant: String, stored: usize },
    #[error(
        "tenant `{tenant}` keeps {} and this version adds {}, over its limit of {} (limits.max_stored): remove versions first",
        corral_core::sandbox::format_bytes(*stored),
        corral_core::sandbox::format_bytes(*adding),
        corral_core::sandbox::format_bytes(*limit)
    )]
    Bytes {
        tenant: String,
        stored: u64,
        adding: u64,
        limit: u64,
    },
}

impl Quota {
    /// Whether `tenant` may store `candidate` (new, or in place of its
    /// version of the same digest), counting every version's
    /// [`Version::stored_bytes`].
    pub fn admit(
        &self,
        tenant: &str,
        index: &TenantIndex,
        candidate: &Version,
    ) -> Result<(), QuotaExceeded> {
        let others = index
            .versions
            .iter()
            .filter(|v| v.digest != candidate.digest);
        let stored = others.clone().count();
        if stored >= self.versions {
            return Err(QuotaExceeded::Versions {
                tenant: tenant.to_owned(),
                stored,
            });
        }
        let bytes: u64 = others.map(Version::stored_bytes).sum();
        let adding = candidate.stored_bytes();
        if bytes.saturating_add(adding) > self.bytes {
            return Err(QuotaExceeded::Bytes {
                tenant: tenant.to_owned(),
                stored: bytes,
                adding,
                limit: self.bytes,
            });
        }
        Ok(())
    }
}

impl Quota {
    /// What `max_stored` leaves beside the tenant's versions: the room its
    /// recorded attempts may take.
    pub fn room(&self, index: &TenantIndex) -> u64 {
        let stored: u64 = index.versions.iter().map(Version::stored_bytes).sum();
        self.bytes.saturating_sub(stored)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn version(name: &str, hex: &str) -> Version {
        Version {
            name: name.into(),
            digest: format!("sha256:{hex}"),
            size: 1,
            uploaded_at_ms: 0,
            aliases: BTreeMap::new(),
            labels: BTreeMap::new(),
            from_config: false,
            config: BTreeMap::new(),
            compiled: 0,
            pulled: None,
            reuse: None,
            held: Vec::new(),
            served: false,
            signer: None,
        }
    }

    #[test]
    fn quotas_refuse_with_the_numbers() {
        let mut t = TenantIndex::default();
        t.versions.push(Version {
            size: 600 << 20,
            ..version("a", "aa")
        });
        let quota = Quota {
            versions: 2,
            bytes: 1 << 30,
        };
        let sized = |hex: &str, size: u64| Version {
            size,
            ..version("a", hex)
        };
        assert!(quota.admit("acme", &t, &sized("cc", 100 << 20)).is_ok());
        let e = quota
            .admit("acme", &t, &sized("cc", 500 << 20))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("keeps 600 MiB and this version adds 500 MiB, over its limit of 1 GiB"),
            "{e}"
        );
        // The same digest again replaces, it does not add.
        assert!(quota.admit("acme", &t, &sized("aa", 900 << 20)).is_ok());
        t.versions.push(version("a", "bb"));
        let e = quota
            .admit("acme", &t, &sized("cc", 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("keeps 2 versions"), "{e}");
    }

    #[test]
    fn labels_config_aliases_and_the_compiled_artifact_count_against_max_stored() {
        let quota = Quota {
            versions: 100,
            bytes: 1 << 20,
        };
        let t = TenantIndex::default();
        let mut v = version("a", "aa");
        v.size = 100;
        v.compiled = 1000;
        v.labels.insert("team".into(), "x".repeat(500));
        v.config.insert("k".into(), "y".repeat(500));
        v.aliases.insert("short".into(), "demo:a/b.c".into());
        assert_eq!(v.stored_bytes(), 100 + 1000 + 504 + 501 + 15);
        assert!(quota.admit("acme", &t, &v).is_ok());
        v.compiled = 1 << 20;
        let e = quota.admit("acme", &t, &v).unwrap_err();
        assert!(matches!(e, QuotaExceeded::Bytes { .. }), "{e}");
    }
}
