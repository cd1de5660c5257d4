//! Text the host writes that came from outside it — a guest, a network
//! peer, a registry: cut to a bound and with its control characters
//! escaped, so it can neither fill a log, nor forge a log line or a metrics
//! sample, nor move an operator's terminal.

use std::borrow::Cow;
use std::fmt;

/// `text` cut to at most `max` bytes at a character boundary, marked with
/// `…` where it was cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `text` with its control characters escaped, then cut to `max` bytes.
pub fn shown(text: &str, max: usize) -> String {
    truncate(&escaped(text), max)
}

/// `text` with every control character (C0, DEL, C1), and the Unicode
/// controls that reorder what a terminal shows (bidirectional overrides and
/// isolates), written as Rust escapes: `\n`, `\u{1b}`. Borrowed when there
/// is none, as in almost every line.
pub fn escaped(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if needs_escape(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Displays its text [`escaped`]: for a log line's message.
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&escaped(self.0))
    }
}

/// Displays its text as [`shown`] does (escaped, then cut to the bound),
/// allocating only when there is something to escape: for a log field or
/// a span attribute.
pub struct Shown<'a>(pub &'a str, pub usize);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = escaped(self.0);
        if text.len() <= self.1 {
            return f.write_str(&text);
        }
        let mut end = self.1;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        write!(f, "{}…", &text[..end])
    }
}

/// The longest name an engine or a caller chose (an activity id, an
/// activity type asked for) that the host writes whole.
pub const MAX_NAME: usize = 256;

fn needs_escape(c: char) -> bool {
    (c.is_control() && c != '\t')
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_plain_text_is_borrowed() {
        assert!(matches!(
            escaped("plain text, tabs\tkept"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            escaped("a\nINFO forged\r\u{1b}[31mred\u{7f}\u{202e}"),
            "a\\nINFO forged\\r\\u{1b}[31mred\\u{7f}\\u{202e}"
        );
        assert_eq!(Escaped("x\ny").to_string(), "x\\ny");
        assert_eq!(Shown("ab\ncd", 4).to_string(), "ab\\n…");
        assert_eq!(Shown("abc", 4).to_string(), "abc");
    }

    #[test]
    fn text_is_cut_at_a_character_boundary_after_escaping() {
        assert_eq!(truncate("héllo", 2), "h…");
        assert_eq!(truncate("short", 10), "short");
        // The escape counts against the bound: nothing grows past it.
        assert_eq!(shown("\n\n\n", 4), "\\n\\n…");
    }
}
