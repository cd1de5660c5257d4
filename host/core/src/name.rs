//! The names operators and tenants give things (tenants, deployments, the
//! deployments `corral dev` makes from file names): one rule, one type.

use std::fmt;

/// The longest name.
pub const MAX_NAME: usize = 128;

/// Whether `c` may be part of a name: a letter, a digit, `-`, `_` or `.`.
pub fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-_.".contains(c)
}

/// A name that follows the rule: 1 to [`MAX_NAME`] of [`name_char`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(String);

/// Text that is not a name; shows it escaped and cut short.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` must be 1 to {MAX_NAME} letters, digits, `-`, `_` or `.`")]
pub struct BadName(String);

impl Name {
    pub fn new(text: impl Into<String>) -> Result<Name, BadName> {
        let text = text.into();
        if text.is_empty() || text.len() > MAX_NAME || !text.chars().all(name_char) {
            return Err(BadName(crate::shown::shown(&text, MAX_NAME + 8)));
        }
        Ok(Name(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::ops::Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_1_to_128_letters_digits_dashes_underscores_or_dots() {
        for good in ["a", "acme-eu_1.2", &"x".repeat(MAX_NAME)] {
            assert_eq!(Name::new(good).unwrap().as_str(), good);
        }
        for bad in ["", "a b", "a/b", "ä", "a\n", &"x".repeat(MAX_NAME + 1)] {
            assert!(Name::new(bad).is_err(), "{bad:?}");
        }
        let e = Name::new("a\u{1b}[31m").unwrap_err().to_string();
        assert!(!e.contains('\u{1b}'), "{e}");
    }
}
