//! `corral test --junit FILE`: the results as JUnit XML, the format CI
//! systems read: a test suite per file, a test case per case, a `failure`
//! element with the mismatches, an `error` element for a file that could
//! not run.

use std::fmt::Write as _;

use super::FileResult;

/// XML text with `&`, `<`, `>`, `"` and `'` escaped (attribute-safe).
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters other than tab and newlines are not XML.
            c if c.is_control() && !matches!(c, '\t' | '\n' | '\r') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

pub fn render(files: &[FileResult]) -> String {
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n");
    for file in files {
        let name = escape(&file.path.display().to_string());
        let failures = file.cases.iter().filter(|c| !c.problems.is_empty()).count();
        let errors = usize::from(file.error.is_some());
        let time: f64 = file.cases.iter().map(|c| c.elapsed.as_secs_f64()).sum();
        let _ = writeln!(
            xml,
            "  <testsuite name=\"{name}\" tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" time=\"{time:.3}\">",
            file.cases.len() + errors
        );
        if let Some(error) = &file.error {
            let _ = writeln!(
                xml,
                "    <testcase name=\"{name}\" classname=\"{name}\">\n      <error message=\"{}\"/>\n    </testcase>",
                escape(error)
            );
        }
        for case in &file.cases {
            let _ = write!(
                xml,
                "    <testcase name=\"{}\" classname=\"{name}\" time=\"{:.3}\"",
                escape(&case.name),
                case.elapsed.as_secs_f64()
            );
            if case.problems.is_empty() {
                xml.push_str("/>\n");
            } else {
                let text = escape(&case.problems.join("\n"));
                let _ = writeln!(
                    xml,
                    ">\n      <failure message=\"{}\">{text}</failure>\n    </testcase>",
                    escape(&case.problems[0])
                );
            }
        }
        xml.push_str("  </testsuite>\n");
    }
    xml.push_str("</testsuites>\n");
    xml
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::super::CaseResult;
    use super::*;

    #[test]
    fn failures_and_file_errors_are_escaped_into_their_elements() {
        let files = [
            FileResult {
                path: PathBuf::from("a.test.toml"),
                cases: vec![
                    CaseResult {
                        name: "passes".into(),
                        elapsed: Duration::from_millis(5),
                        problems: Vec::new(),
                    },
                    CaseResult {
                        name: "<fails>".into(),
                        elapsed: Duration::from_millis(7),
                        problems: vec!["expected result \"x\" & more".into()],
                    },
                ],
                error: None,
            },
            FileResult {
                path: PathBuf::from("b.test.toml"),
                cases: Vec::new(),
                error: Some("no such file\u{1}".into()),
            },
        ];
        let xml = render(&files);
        assert!(
            xml.contains(
                r#"<testsuite name="a.test.toml" tests="2" failures="1" errors="0" time="0.012">"#
            ),
            "{xml}"
        );
        assert!(
            xml.contains(r#"<testcase name="passes" classname="a.test.toml" time="0.005"/>"#),
            "{xml}"
        );
        assert!(xml.contains(
            r#"<failure message="expected result &quot;x&quot; &amp; more">expected result &quot;x&quot; &amp; more</failure>"#
        ), "{xml}");
        assert!(xml.contains(r#"name="&lt;fails&gt;""#), "{xml}");
        assert!(xml.contains(r#"<error message="no such file�"/>"#), "{xml}");
    }
}
