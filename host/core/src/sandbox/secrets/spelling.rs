//! Finding a secret's value however an encoder spelled each of its
//! characters: as itself, percent-encoded (either hex case; a space also as
//! `+`) or JSON-escaped, in any mix.

pub(crate) fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    find(haystack, needle).is_some()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The most bytes one character of a value takes in any spelling
/// redaction knows (`\u0026`).
pub(crate) const LONGEST_SPELLING: usize = 6;

/// The length of a spelling of `value` at the start of `text`: each byte
/// of the value as itself, percent-encoded (`%XX`, either case), a space as
/// `+`, or JSON-escaped (`\uXXXX`, or `\"`, `\\`, `\/`), in any mix.
fn spelled_at(text: &[u8], value: &[u8]) -> Option<usize> {
    let hex = |digits: &[u8]| {
        std::str::from_utf8(digits)
            .ok()
            .and_then(|d| u32::from_str_radix(d, 16).ok())
    };
    let mut at = 0;
    for &b in value {
        let rest = &text[at..];
        // Escapes first: `\\` is a JSON-escaped backslash before it is a
        // raw one.
        at += match rest {
            [b'%', h, l, ..] if hex(&[*h, *l]) == Some(u32::from(b)) => 3,
            [b'\\', b'u', digits @ ..]
                if digits.len() >= 4 && hex(&digits[..4]) == Some(u32::from(b)) =>
            {
                6
            }
            [b'\\', escaped, ..] if *escaped == b && matches!(b, b'"' | b'\\' | b'/') => 2,
            [first, ..] if *first == b => 1,
            [b'+', ..] if b == b' ' => 1,
            _ => return None,
        };
    }
    Some(at)
}

/// `text` with every spelling of `value` replaced by `marker`; `None` when
/// there is none (almost always: no copy is made).
pub(crate) fn replace_spelled(text: &[u8], value: &[u8], marker: &str) -> Option<Vec<u8>> {
    let &first = value.first()?;
    let could_start = |b: u8| b == first || matches!(b, b'%' | b'\\' | b'+');
    let mut out: Option<Vec<u8>> = None;
    let (mut at, mut copied) = (0, 0);
    while at < text.len() {
        if could_start(text[at])
            && let Some(len) = spelled_at(&text[at..], value)
        {
            let out = out.get_or_insert_with(|| Vec::with_capacity(text.len()));
            out.extend_from_slice(&text[copied..at]);
            out.extend_from_slice(marker.as_bytes());
            at += len;
            copied = at;
        } else {
            at += 1;
        }
    }
    let mut out = out?;
    out.extend_from_slice(&text[copied..]);
    Some(out)
}
