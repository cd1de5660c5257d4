//! Named arguments (one JSON object keyed by parameter name, as Aion's
//! typed actions deliver them) onto a function's WIT parameters, in order.

use serde_json::{Map, Value};
use wasmtime::component::types::Type;

use super::names_match;

/// Named arguments that do not fit the parameters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error("missing argument `{name}` (expected {expected})")]
    Missing { name: String, expected: String },
    #[error("unknown argument `{name}` (expected {expected})")]
    Unknown { name: String, expected: String },
}

/// The values of `named` in the order of `params`. Names match as record
/// fields do (`max-len`, `max_len` and `maxLen` are one name); a missing
/// `option` parameter is `null` (`none`).
pub fn positional(
    params: &[(String, Type)],
    mut named: Map<String, Value>,
) -> Result<Vec<Value>, ArgsError> {
    let expected = || {
        params
            .iter()
            .map(|(name, _)| format!("`{name}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut values = Vec::with_capacity(params.len());
    for (name, ty) in params {
        let key = named.keys().find(|key| names_match(name, key)).cloned();
        match key.and_then(|key| named.remove(&key)) {
            Some(value) => values.push(value),
            None if matches!(ty, Type::Option(_)) => values.push(Value::Null),
            None => {
                return Err(ArgsError::Missing {
                    name: name.clone(),
                    expected: expected(),
                });
            }
        }
    }
    if let Some(unknown) = named.keys().next() {
        return Err(ArgsError::Unknown {
            name: unknown.clone(),
            expected: expected(),
        });
    }
    Ok(values)
}
