//! JSON ⇄ WIT value conversion driven by the function's own component types
//! (no code generation in the host).
//!
//! | WIT | JSON |
//! |---|---|
//! | `bool`, integers, `f32`/`f64` | booleans and numbers (integers are range-checked; `"NaN"`, `"Infinity"`, `"-Infinity"` for non-finite floats) |
//! | `char`, `string` | strings |
//! | `list<u8>` | a base64 string (output), or a base64 string or an array of numbers (input) |
//! | `list<T>`, `tuple<…>` | arrays |
//! | `record` | objects with the WIT (kebab-case) field names; snake_case and camelCase accepted on input |
//! | `variant` | `"case"` when the case has no payload, else `{"case": payload}` |
//! | `enum` | the case name as a string |
//! | `flags` | an array of flag names |
//! | `option<T>` | `null` or the value |
//! | `result<T, E>` (nested) | `{"ok": …}` or `{"err": …}` |
//!
//! Errors name the JSON path inside the value: `$.items[3].price: expected
//! u32, got -1`.

mod args;
mod from_wit;
mod sample;
mod schema;
mod to_wit;

use std::fmt;

pub use args::{ArgsError, positional};
pub use from_wit::{json_size_at_least, payload_to_json_filtering, to_json, to_json_filtering};
pub use sample::sample;
pub use schema::{input_schema, output_schema};
pub use to_wit::{describe as describe_json, from_json};

/// A JSON value that does not fit its WIT type (or a WIT value that cannot be
/// represented), with the path to the offending part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertError {
    /// `$`, `$.items[3].price`, …
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConvertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

impl std::error::Error for ConvertError {}

/// The JSON path being converted, grown and shrunk as conversion descends,
/// and what a guest's bytes pass through before they are encoded.
#[derive(Default)]
pub(crate) struct JsonPath<'a> {
    segments: Vec<Segment>,
    /// Applied to each `list<u8>` a guest returns before it is encoded as
    /// base64 (in which no redaction could find a secret's value).
    bytes: Option<&'a BytesFilter<'a>>,
}

/// What a guest's bytes pass through before they are encoded.
pub type BytesFilter<'a> = dyn Fn(&mut Vec<u8>) + 'a;

#[derive(Debug)]
enum Segment {
    Field(String),
    Index(usize),
}

impl<'a> JsonPath<'a> {
    /// A path whose byte lists pass through `bytes`.
    pub(crate) fn filtering_bytes(bytes: &'a BytesFilter<'a>) -> Self {
        JsonPath {
            segments: Vec::new(),
            bytes: Some(bytes),
        }
    }

    /// Passes a guest's bytes through the path's filter, if it has one.
    pub(crate) fn filter_bytes(&self, bytes: &mut Vec<u8>) {
        if let Some(filter) = self.bytes {
            filter(bytes);
        }
    }

    pub(crate) fn field<T>(&mut self, name: &str, f: impl FnOnce(&mut Self) -> T) -> T {
        self.segments.push(Segment::Field(name.to_owned()));
        let out = f(self);
        self.segments.pop();
        out
    }

    pub(crate) fn index<T>(&mut self, index: usize, f: impl FnOnce(&mut Self) -> T) -> T {
        self.segments.push(Segment::Index(index));
        let out = f(self);
        self.segments.pop();
        out
    }

    pub(crate) fn error(&self, message: impl Into<String>) -> ConvertError {
        ConvertError {
            path: self.to_string(),
            message: message.into(),
        }
    }
}

impl fmt::Display for JsonPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("$")?;
        for segment in &self.segments {
            match segment {
                Segment::Field(name) => write!(f, ".{name}")?,
                Segment::Index(i) => write!(f, "[{i}]")?,
            }
        }
        Ok(())
    }
}

/// Whether a JSON key (or case name) written in kebab-case, snake_case or
/// camelCase names the WIT identifier `wit` (always kebab-case).
pub(crate) fn names_match(wit: &str, key: &str) -> bool {
    if wit == key {
        return true;
    }
    if key.contains('_') {
        return key.len() == wit.len()
            && key
                .chars()
                .zip(wit.chars())
                .all(|(k, w)| k == w || (k == '_' && w == '-'));
    }
    // camelCase: every upper-case letter starts a new kebab-case word.
    let mut kebab = String::with_capacity(wit.len());
    for c in key.chars() {
        if c.is_ascii_uppercase() && !kebab.is_empty() {
            kebab.push('-');
        }
        kebab.push(c.to_ascii_lowercase());
    }
    kebab == wit
}

#[cfg(test)]
mod tests;
