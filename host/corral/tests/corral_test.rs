//! `corral test`: the examples' test files (Rust, Python, JavaScript guests)
//! pass through the real binary; a file whose expectations do not hold
//! fails with a line per mismatch, exit 1 and a JUnit report that says so;
//! a file that cannot run is named with its problem.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::activities::text;
use common::example;

fn corral_test(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_corral"))
        .arg("test")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("corral runs")
}

fn root() -> std::path::PathBuf {
    example("greeter")
        .ancestors()
        .nth(3)
        .expect("the repository root")
        .to_owned()
}

#[test]
fn the_examples_test_files_pass_in_every_language() {
    let root = root();
    let junit = tempfile::tempdir().unwrap();
    let report = junit.path().join("junit.xml");
    let out = corral_test(
        &root,
        &[
            "examples/greeter/greeter.test.toml",
            "examples/python-shout/shout.test.toml",
            "examples/js-greeter/js-greeter.test.toml",
            "--junit",
            report.to_str().unwrap(),
        ],
    );
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("\n12 passed, 0 failed"), "{said}");
    assert!(
        said.contains("ok   examples/js-greeter/js-greeter.test.toml: stops when cancelled"),
        "{said}"
    );
    let xml = std::fs::read_to_string(&report).unwrap();
    assert_eq!(xml.matches("<testsuite ").count(), 3, "{xml}");
    assert!(!xml.contains("<failure"), "{xml}");
}

#[test]
fn unmet_expectations_fail_with_what_differs_and_a_junit_report() {
    let dir = tempfile::tempdir().unwrap();
    let greeter = example("greeter").display().to_string();
    std::fs::write(
        dir.path().join("wrong.test.toml"),
        format!(
            r#"
component = {greeter:?}

[[case]]
name = "passes"
activity = "demo:greeter/api.greet"
args = [{{ name = "Ada", language = "english" }}, "casual"]
expect = {{ result = {{ message = "Hi, Ada!", calls-in-instance = 1, attempt = 1 }} }}

[[case]]
name = "wrong result"
activity = "demo:greeter/api.greet"
args = [{{ name = "Ada", language = "english" }}, "casual"]
expect = {{ result = {{ message = "Hello" }}, heartbeats = 2 }}

[[case]]
name = "wrong class"
activity = "demo:greeter/api.greet"
args = ["not a person", "casual"]
expect = {{ failure = {{ class = "Timeout" }} }}
"#
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("broken.test.toml"), "component = 7\n").unwrap();
    // Without file names: every *.test.toml here.
    let out = corral_test(dir.path(), &["--junit", "report.xml"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("ok   wrong.test.toml: passes"), "{said}");
    assert!(
        said.contains("FAIL wrong.test.toml: wrong result"),
        "{said}"
    );
    assert!(
        said.contains("expected result {\"message\":\"Hello\"}"),
        "{said}"
    );
    assert!(said.contains("expected 2 heartbeats, got 0"), "{said}");
    assert!(
        said.contains("expected a Timeout failure, got InvalidInput"),
        "{said}"
    );
    assert!(
        said.contains("FAIL broken.test.toml: `broken.test.toml`"),
        "{said}"
    );
    assert!(said.contains("\n1 passed, 3 failed"), "{said}");
    let xml = std::fs::read_to_string(dir.path().join("report.xml")).unwrap();
    assert!(
        xml.contains(r#"tests="3" failures="2" errors="0""#),
        "{xml}"
    );
    assert!(
        xml.contains(r#"tests="1" failures="0" errors="1""#),
        "{xml}"
    );
}

#[test]
fn no_test_files_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = corral_test(dir.path(), &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no test files"), "{}", text(&out));
}

#[test]
fn a_file_that_cannot_run_names_its_problem() {
    let dir = tempfile::tempdir().unwrap();
    let greeter = example("greeter").display().to_string();
    let case = r#"
[[case]]
name = "greets"
activity = "demo:greeter/api.greet"
args = [{ name = "Ada", language = "english" }, "casual"]
"#;
    let files = [
        (
            "limit",
            format!(
                "component = {greeter:?}\nlimits = {{ memory = \"lots\" }}\n{case}expect = {{ result = 1 }}\n"
            ),
            "its limits or capabilities: limits.memory: `lots` is not a byte size",
        ),
        (
            "class",
            format!(
                "component = {greeter:?}\n{case}expect = {{ failure = {{ class = \"Oops\" }} }}\n"
            ),
            "case `greets`: expect.failure.class: `Oops` is not a failure class",
        ),
        (
            "both",
            format!(
                "component = {greeter:?}\n{case}expect = {{ result = 1, failure = {{ class = \"Trap\" }} }}\n"
            ),
            "expect exactly one of result, result_json or failure",
        ),
        (
            "missing",
            format!("component = \"nowhere.wasm\"\n{case}expect = {{ result = 1 }}\n"),
            "cannot read `nowhere.wasm`: No such file or directory",
        ),
    ];
    for (name, text_of_file, problem) in files {
        let file = format!("{name}.test.toml");
        std::fs::write(dir.path().join(&file), text_of_file).unwrap();
        let out = corral_test(dir.path(), &[&file]);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(1), "{name}: {said}");
        assert!(said.contains(&format!("FAIL {file}: ")), "{name}: {said}");
        assert!(said.contains(problem), "{name}: {said}");
    }
}
