//! The documentation's signs are true: every repository path the README and
//! `docs/` name exists, every link between them lands on a file and a
//! heading that exist, and every `corral …` command they show is a real
//! subcommand taking the flags shown (asked of the real binary's `--help`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's top-level directories: a path in the docs that starts
/// with one of these names a file of this repository.
const TOP: &[&str] = &[
    ".ci",
    "deploy",
    "docs",
    "examples",
    "guest-sdk",
    "harness",
    "host",
    "proto",
    "tests",
    "wit",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every page a reader is sent to: the README, `docs/*.md`, the benches' README.
fn pages() -> Vec<(PathBuf, String)> {
    let root = root();
    let mut paths = vec![
        root.join("README.md"),
        root.join("host/corral/benches/README.md"),
    ];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// The text of every inline code span (`…`) of a page, outside code blocks.
fn code_spans(text: &str) -> Vec<String> {
    let mut spans = Vec::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        let parts: Vec<&str> = line.split('`').collect();
        spans.extend(parts.iter().skip(1).step_by(2).map(|s| s.to_string()));
    }
    spans
}

/// Markdown link targets: `](target)`.
fn links(text: &str) -> Vec<String> {
    text.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &text[at + 2..];
            rest.find(')').map(|end| rest[..end].to_string())
        })
        .collect()
}

/// GitHub's anchor for a heading.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_block = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
        } else if !in_block && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// Whether a repository path exists: as written, or with `*` as a wildcard
/// in its last segment, or as a file of the project `corral new` writes
/// (the authoring pages name `wit/world.wit` of that project).
fn exists(path: &str) -> bool {
    let root = root();
    let path = path.trim_end_matches('/');
    if let Some((dir, pattern)) = path.rsplit_once('/')
        && pattern.contains('*')
    {
        let (prefix, suffix) = pattern.split_once('*').unwrap();
        return std::fs::read_dir(root.join(dir)).is_ok_and(|entries| {
            entries.filter_map(Result::ok).any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with(prefix) && name.ends_with(suffix)
            })
        });
    }
    if root.join(path).exists() {
        return true;
    }
    // A file or directory `corral new` writes into a project
    // (`("wit/world.wit", …)`, `("wit/deps/corral/activity.wit", …)`).
    let new_project = std::fs::read_to_string(root.join("host/corral/src/cli/new/mod.rs")).unwrap();
    new_project.contains(&format!("(\"{path}\""))
        || new_project.contains(&format!("(\"{path}/"))
        || ["rust", "python", "js"].iter().any(|lang| {
            root.join("host/corral/src/cli/new/templates")
                .join(lang)
                .join(path)
                .exists()
        })
}

/// A code span that names a repository path: it starts with a top-level
/// directory and holds nothing a path here would not.
fn repository_path(span: &str) -> Option<&str> {
    let top = span.split('/').next()?;
    let path_like = span
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-/*".contains(c));
    (TOP.contains(&top) && span.contains('/') && path_like).then_some(span)
}

/// Every file name under `dir`, recursively.
fn file_names(dir: &Path, into: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            file_names(&path, into);
        } else {
            into.insert(entry.file_name().to_string_lossy().into_owned());
        }
    }
}

/// A code span that is a bare Rust file name (`hostile.rs`): the docs name
/// tests and modules so, and each must be a file of the host's crates.
fn bare_rust_file(span: &str) -> Option<&str> {
    let stem = span.strip_suffix(".rs")?;
    (!stem.is_empty()
        && stem
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit()))
    .then_some(span)
}

#[test]
fn every_repository_path_and_link_the_docs_name_exists() {
    let mut host_files = BTreeSet::new();
    file_names(&root().join("host"), &mut host_files);
    let pages = pages();
    let headings: BTreeMap<PathBuf, BTreeSet<String>> = pages
        .iter()
        .map(|(p, t)| (p.canonicalize().unwrap(), anchors(t)))
        .collect();
    let mut missing = Vec::new();
    for (page, text) in &pages {
        let name = page
            .strip_prefix(root())
            .unwrap_or(page)
            .display()
            .to_string();
        for span in code_spans(text) {
            if let Some(path) = repository_path(&span)
                && !exists(path)
            {
                missing.push(format!("{name}: `{path}` does not exist"));
            }
            if let Some(file) = bare_rust_file(&span)
                && !host_files.contains(file)
            {
                missing.push(format!("{name}: `{file}` is no file of the host's crates"));
            }
        }
        for target in links(text) {
            if target.starts_with("http://") || target.starts_with("https://") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let file = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            let Ok(file) = file.canonicalize() else {
                missing.push(format!("{name}: link `{target}` names no file"));
                continue;
            };
            if !anchor.is_empty() && !headings.get(&file).is_some_and(|set| set.contains(anchor)) {
                missing.push(format!("{name}: link `{target}` names no heading"));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// `corral` command lines of a page: lines of its code blocks that start
/// with `corral ` (or `cargo run -p corral -- `), and code spans that do,
/// each cut at its comment.
fn command_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            lines.push(line.to_string());
        }
    }
    // Code spans that quote a message (`corral refused outbound HTTP: …`)
    // are not commands.
    lines.extend(code_spans(text).into_iter().filter(|s| !s.contains(": ")));
    lines
        .into_iter()
        .filter_map(|line| {
            let line = line.split(" #").next().unwrap_or_default().trim();
            let line = line
                .strip_prefix("cargo run -p corral -- ")
                .map_or(line, |rest| rest);
            line.strip_prefix("corral ").map(str::to_string)
        })
        .collect()
}

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "corral {} --help failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn every_corral_command_and_flag_the_docs_show_exists() {
    let top = help(&[]);
    let subcommands: BTreeSet<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert!(subcommands.contains("serve"), "{top}");
    let mut wrong = Vec::new();
    let mut seen = 0;
    let mut helps: BTreeMap<String, String> = BTreeMap::new();
    for (page, text) in pages() {
        let name = page
            .strip_prefix(root())
            .unwrap_or(&page)
            .display()
            .to_string();
        for line in command_lines(&text) {
            let mut words = line.split_whitespace();
            let Some(first) = words.next() else { continue };
            if first.starts_with('…') || first.starts_with('[') || first.starts_with('<') {
                continue; // `corral …`: the binary in general
            }
            // `deploy|ls|…` names several.
            for sub in first.split('|') {
                let sub = sub.trim_end_matches(['…', ',', '.', ':']);
                // A hidden subcommand (`compile-worker`) is not listed, but
                // answers `--help`.
                let hidden = || {
                    Command::new(env!("CARGO_BIN_EXE_corral"))
                        .args([sub, "--help"])
                        .output()
                        .is_ok_and(|o| o.status.success())
                };
                if !subcommands.contains(sub) && !hidden() {
                    wrong.push(format!("{name}: `corral {line}`: no subcommand `{sub}`"));
                    continue;
                }
                seen += 1;
                let text = helps
                    .entry(sub.to_string())
                    .or_insert_with(|| help(&[sub]))
                    .clone();
                for flag in line.split_whitespace().filter(|w| w.starts_with("--")) {
                    let flag = flag
                        .trim_start_matches('[')
                        .split(['=', ']', ' ', ','])
                        .next()
                        .unwrap_or_default();
                    if flag != "--"
                        && flag != "--help"
                        && !text.contains(&format!("{flag} "))
                        && !text.contains(&format!("{flag}\n"))
                        && !text.contains(&format!("{flag}="))
                    {
                        wrong.push(format!(
                            "{name}: `corral {line}`: `corral {sub}` has no `{flag}`"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        seen > 30,
        "the docs show only {seen} corral commands: the scan is broken"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
