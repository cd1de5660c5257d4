//! What a version carries besides its bytes: a tenant's labels, aliases and
//! deployment config, and where the host pulled it from. A tenant's part is
//! bounded here (count, sizes), counted in its `max_stored`, and kept apart
//! from the host's: a label under a host prefix (`oci.`, `corral.`) is
//! refused from a tenant, and where a version was pulled from is a field
//! only the host writes, so a tenant cannot make the host trust bytes it
//! forged for a reference it names.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Labels a version may carry.
pub const MAX_LABELS: usize = 32;
/// Config keys a deployment may set.
pub const MAX_CONFIG_KEYS: usize = 64;
/// Aliases a version may add.
pub const MAX_ALIASES: usize = 64;
/// The longest label, config or alias key.
pub const MAX_KEY: usize = 128;
/// The longest label value.
pub const MAX_LABEL_VALUE: usize = 1024;
/// The longest config value (an alias's target is a type name: a key).
pub const MAX_CONFIG_VALUE: usize = 4096;
/// All of one version's metadata together: what each change of the index
/// (which holds every version) rewrites.
pub const MAX_METADATA: usize = 64 << 10;

/// Label prefixes only the host writes.
pub const HOST_PREFIXES: [&str; 2] = ["oci.", "corral."];

/// Where the host pulled a version from: written by the host, never taken
/// from a caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pulled {
    /// What was named: `oci://…:tag` or `…@sha256:…`.
    pub reference: String,
    /// The manifest's digest.
    pub manifest: String,
}

impl Pulled {
    /// As the API shows it, beside the tenant's labels.
    pub fn labels(&self) -> [(String, String); 2] {
        [
            ("oci.reference".to_owned(), self.reference.clone()),
            ("oci.manifest".to_owned(), self.manifest.clone()),
        ]
    }
}

/// A version's metadata that cannot be stored, naming the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("{what}: {count} given, at most {max}")]
    TooMany {
        what: &'static str,
        count: usize,
        max: usize,
    },
    #[error("{what} `{key}`: a key is 1 to {MAX_KEY} letters, digits or `-_./:`")]
    Key { what: &'static str, key: String },
    #[error("{what} `{key}`: its value is {len} bytes, at most {max}")]
    Value {
        what: &'static str,
        key: String,
        len: usize,
        max: usize,
    },
    #[error("label `{0}`: labels under `oci.` and `corral.` are the host's")]
    HostLabel(String),
    #[error(
        "the version's labels, aliases and config are {0} bytes together, at most {MAX_METADATA}"
    )]
    Total(usize),
}

/// A tenant's labels, aliases and config for a version, checked.
pub fn check(
    labels: &BTreeMap<String, String>,
    aliases: &BTreeMap<String, String>,
    config: &BTreeMap<String, String>,
) -> Result<(), MetadataError> {
    let shown = |key: &str| corral_core::shown::shown(key, MAX_KEY + 8);
    for (what, map, max_count, max_value) in [
        ("labels", labels, MAX_LABELS, MAX_LABEL_VALUE),
        ("aliases", aliases, MAX_ALIASES, MAX_KEY),
        ("config", config, MAX_CONFIG_KEYS, MAX_CONFIG_VALUE),
    ] {
        if map.len() > max_count {
            return Err(MetadataError::TooMany {
                what,
                count: map.len(),
                max: max_count,
            });
        }
        for (key, value) in map {
            if key.is_empty()
                || key.len() > MAX_KEY
                || !key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./:".contains(&b))
            {
                return Err(MetadataError::Key {
                    what,
                    key: shown(key),
                });
            }
            if value.len() > max_value {
                return Err(MetadataError::Value {
                    what,
                    key: key.clone(),
                    len: value.len(),
                    max: max_value,
                });
            }
        }
    }
    if let Some(key) = labels.keys().find(|k| {
        let k = k.to_ascii_lowercase();
        HOST_PREFIXES.iter().any(|p| k.starts_with(p))
    }) {
        return Err(MetadataError::HostLabel(key.clone()));
    }
    let total = size(labels, aliases, config);
    if total > MAX_METADATA {
        return Err(MetadataError::Total(total));
    }
    Ok(())
}

/// Bytes of metadata, as counted in `max_stored`.
pub fn size(
    labels: &BTreeMap<String, String>,
    aliases: &BTreeMap<String, String>,
    config: &BTreeMap<String, String>,
) -> usize {
    [labels, aliases, config]
        .iter()
        .flat_map(|map| map.iter())
        .map(|(k, v)| k.len() + v.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn metadata_is_bounded_and_host_labels_are_refused() {
        let none = BTreeMap::new();
        assert_eq!(check(&map(&[("team", "payments")]), &none, &none), Ok(()));
        assert_eq!(
            check(&map(&[("oci.manifest", "sha256:forged")]), &none, &none),
            Err(MetadataError::HostLabel("oci.manifest".into()))
        );
        for host in ["corral.x", "OCI.reference", "Corral.trusted"] {
            assert!(
                matches!(
                    check(&map(&[(host, "y")]), &none, &none),
                    Err(MetadataError::HostLabel(_))
                ),
                "{host}"
            );
        }
        let many: BTreeMap<String, String> = (0..=MAX_LABELS)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        assert!(matches!(
            check(&many, &none, &none),
            Err(MetadataError::TooMany { what: "labels", .. })
        ));
        let long = "v".repeat(MAX_LABEL_VALUE + 1);
        assert!(matches!(
            check(&map(&[("k", &long)]), &none, &none),
            Err(MetadataError::Value { what: "labels", .. })
        ));
        assert!(matches!(
            check(&map(&[("bad key\n", "v")]), &none, &none),
            Err(MetadataError::Key { .. })
        ));
        // Each within its bound, too much together.
        let big = "c".repeat(MAX_CONFIG_VALUE);
        let config: BTreeMap<String, String> =
            (0..20).map(|i| (format!("key{i}"), big.clone())).collect();
        assert!(matches!(
            check(&none, &none, &config),
            Err(MetadataError::Total(_))
        ));
        assert_eq!(size(&map(&[("ab", "cd")]), &none, &map(&[("e", "")])), 5);
    }

    #[test]
    fn aliases_and_config_keys_are_counted_and_every_key_and_alias_target_is_bounded() {
        let none = BTreeMap::new();
        for (what, max) in [("aliases", MAX_ALIASES), ("config", MAX_CONFIG_KEYS)] {
            let keys = |n: usize| -> BTreeMap<String, String> {
                (0..n).map(|i| (format!("k{i}"), "v".to_owned())).collect()
            };
            let check_as = |m: &BTreeMap<String, String>| match what {
                "aliases" => check(&none, m, &none),
                _ => check(&none, &none, m),
            };
            assert_eq!(check_as(&keys(max)), Ok(()), "{what}");
            assert_eq!(
                check_as(&keys(max + 1)),
                Err(MetadataError::TooMany {
                    what,
                    count: max + 1,
                    max
                }),
                "{what}"
            );
            let longest = "k".repeat(MAX_KEY);
            assert_eq!(check_as(&map(&[(&longest, "v")])), Ok(()), "{what}");
            let over = "k".repeat(MAX_KEY + 1);
            assert!(
                matches!(
                    check_as(&map(&[(&over, "v")])),
                    Err(MetadataError::Key { .. })
                ),
                "{what}"
            );
        }
        // An alias's target is a type name: a key's length at most.
        let target = "t".repeat(MAX_KEY + 1);
        assert!(matches!(
            check(&none, &map(&[("Short", &target)]), &none),
            Err(MetadataError::Value {
                what: "aliases",
                ..
            })
        ));
    }
}
