//! `corral new <name> --lang rust|python|js`: a ready activity project.
//! Every language gets the same WIT world (its own package, with corral's
//! in `wit/deps/corral`, or for Rust in the guest SDK written beside it), the
//! same activities (a typed record and a typed
//! failure, heartbeats and cancellation), a `build.sh` that writes
//! `dist/<name>.wasm`, and `<name>.test.toml` for `corral test`.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::error_exit;

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

#[derive(clap::Args)]
pub struct Args {
    /// The project's name: lower-case words joined by '-' (e.g. `hello`,
    /// `charge-card`). Also its WIT package (`local:<name>`) and directory.
    name: String,
    /// The guest language.
    #[arg(long)]
    lang: Lang,
    /// Where to create the project [default: ./<name>].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Why a project cannot be created.
#[derive(Debug, thiserror::Error)]
pub enum NewError {
    #[error(
        "`{0}` cannot name a project: use lower-case words of letters and digits, each starting \
         with a letter, joined by '-' (it is also the WIT package `local:<name>`)"
    )]
    Name(String),
    #[error("`{0}` is a word WIT or Rust reserves: choose another project name")]
    Reserved(String),
    #[error("{} already exists: choose another name or --dir", .0.display())]
    Exists(PathBuf),
    #[error("cannot write {}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// corral's WIT package, as `wit/deps/corral/activity.wit` of every project.
const ACTIVITY_WIT: &str = include_str!("../../../../../wit/activity.wit");
/// `wasi:config/store`, for a world that reads configuration.
const CONFIG_WIT: &str = include_str!("../../../../../wit/deps/config/store.wit");

/// The guest SDK, written into Rust projects (see `guest-sdk/Cargo.toml`).
const GUEST_SDK: [(&str, &str); 6] = [
    (
        "corral-guest/Cargo.toml",
        include_str!("../../../../../guest-sdk/Cargo.toml"),
    ),
    (
        "corral-guest/build.rs",
        include_str!("../../../../../guest-sdk/build.rs"),
    ),
    (
        "corral-guest/src/lib.rs",
        include_str!("../../../../../guest-sdk/src/lib.rs"),
    ),
    ("corral-guest/wit/activity.wit", ACTIVITY_WIT),
    (
        "corral-guest/wit/sdk.wit",
        include_str!("../../../../../wit/sdk.wit"),
    ),
    ("corral-guest/wit/deps/config/store.wit", CONFIG_WIT),
];

/// Files of every project; `{{name}}` is replaced.
const COMMON: [(&str, &str); 3] = [
    ("wit/world.wit", include_str!("templates/world.wit")),
    ("{{name}}.test.toml", include_str!("templates/test.toml")),
    (".gitignore", include_str!("templates/gitignore")),
];

fn language_files(lang: Lang) -> &'static [(&'static str, &'static str)] {
    match lang {
        Lang::Rust => &[
            ("Cargo.toml", include_str!("templates/rust/Cargo.toml")),
            ("src/lib.rs", include_str!("templates/rust/lib.rs")),
            ("build.sh", include_str!("templates/rust/build.sh")),
        ],
        Lang::Python => &[
            ("app.py", include_str!("templates/python/app.py")),
            ("build.sh", include_str!("templates/python/build.sh")),
        ],
        Lang::Js => &[
            ("app.js", include_str!("templates/js/app.js")),
            ("package.json", include_str!("templates/js/package.json")),
            ("build.sh", include_str!("templates/js/build.sh")),
        ],
    }
}

/// Words that WIT or Rust reserve: as a whole name they break the
/// generated bindings.
const RESERVED: &str = "\
    as async await bool borrow break char const constructor continue crate do dyn \
    else enum export extern f32 f64 false flags fn for func future gen if impl \
    import in include interface let list loop match mod move mut option own package \
    pub record ref resource result return s16 s32 s64 s8 self static std core stream \
    string struct super trait true try tuple type u16 u32 u64 u8 unsafe use variant \
    where while with world yield";

/// A name that is a WIT package name, a directory, a crate and an npm package.
fn check_name(name: &str) -> Result<(), NewError> {
    if RESERVED.split_whitespace().any(|word| word == name) {
        return Err(NewError::Reserved(name.to_owned()));
    }
    let word_ok = |word: &str| {
        word.starts_with(|c: char| c.is_ascii_lowercase())
            && word
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    };
    if name.len() > 64 || !name.split('-').all(word_ok) {
        return Err(NewError::Name(name.to_owned()));
    }
    Ok(())
}

/// Every file of a `lang` project named `name`: path and contents.
fn project_files(name: &str, lang: Lang) -> Vec<(String, String)> {
    // Rust's crate file and wit-bindgen's module both spell `-` as `_`.
    let snake_name = name.replace('-', "_");
    let fill = |text: &str| {
        text.replace("{{name}}", name)
            .replace("{{snake_name}}", &snake_name)
    };
    let mut files: Vec<(String, String)> = COMMON
        .iter()
        .chain(language_files(lang))
        .map(|(path, text)| (fill(path), fill(text)))
        .collect();
    if let Lang::Rust = lang {
        // `corral_guest::generate!` brings corral's package itself (a second
        // copy in wit/deps would be a duplicate package to wit-bindgen).
        files.extend(
            GUEST_SDK
                .iter()
                .map(|(path, text)| ((*path).to_owned(), (*text).to_owned())),
        );
    } else {
        files.push(("wit/deps/corral/activity.wit".into(), ACTIVITY_WIT.into()));
        files.push(("wit/deps/config/store.wit".into(), CONFIG_WIT.into()));
    }
    files
}

/// Writes the project into `dir`, which must not exist yet.
fn create(dir: &Path, name: &str, lang: Lang) -> Result<(), NewError> {
    check_name(name)?;
    let write_error = |path: &Path| {
        let path = path.to_owned();
        move |source| NewError::Write { path, source }
    };
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(write_error(parent))?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            return Err(NewError::Exists(dir.to_owned()));
        }
        Err(e) => return Err(write_error(dir)(e)),
    }
    for (relative, text) in project_files(name, lang) {
        let path = dir.join(&relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(write_error(parent))?;
        }
        std::fs::write(&path, text).map_err(write_error(&path))?;
        if relative == "build.sh" {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .map_err(write_error(&path))?;
        }
    }
    Ok(())
}

pub fn new(args: Args) -> ExitCode {
    let dir = args.dir.unwrap_or_else(|| PathBuf::from(&args.name));
    if let Err(e) = create(&dir, &args.name, args.lang) {
        return error_exit(&e);
    }
    let needs = match args.lang {
        Lang::Rust => "Rust with `rustup target add wasm32-wasip2`",
        Lang::Python => "`pip install componentize-py==0.25.1`",
        Lang::Js => "Node.js 18 or later (componentize-js comes from npm)",
    };
    let name = &args.name;
    println!(
        "created {dir}: local:{name}/api.greet and local:{name}/api.count\n\n\
         cd {dir}\n\
         ./build.sh                   # dist/{name}.wasm (needs {needs})\n\
         corral test                  # the cases of {name}.test.toml, in the sandbox\n\
         corral deploy dist/{name}.wasm   # to a running host (corral dev prints how)",
        dir = dir.display(),
    );
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_must_be_a_wit_package_name() {
        for good in ["hello", "charge-card", "v2-api"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        assert!(matches!(check_name("record"), Err(NewError::Reserved(_))));
        for bad in [
            "", "Hello", "2fast", "a--b", "-a", "a-", "a_b", "a/b", "../x",
        ] {
            let e = check_name(bad).unwrap_err();
            assert!(e.to_string().contains("lower-case words"), "{bad}: {e}");
        }
    }

    #[test]
    fn every_placeholder_is_filled_and_every_language_has_a_build_script() {
        for lang in [Lang::Rust, Lang::Python, Lang::Js] {
            let files = project_files("charge-card", lang);
            assert!(files.iter().any(|(p, _)| p == "build.sh"));
            assert!(files.iter().any(|(p, _)| p == "charge-card.test.toml"));
            let deps = files
                .iter()
                .any(|(p, _)| p == "wit/deps/corral/activity.wit");
            let sdk = files
                .iter()
                .any(|(p, _)| p == "corral-guest/wit/activity.wit");
            assert!(deps != sdk, "corral's WIT exactly once");
            for (path, text) in &files {
                assert!(!path.contains("{{") && !text.contains("{{"), "{path}");
            }
        }
    }

    #[test]
    fn an_existing_directory_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("hello");
        std::fs::create_dir(&project).unwrap();
        std::fs::write(project.join("keep"), "mine").unwrap();
        let e = create(&project, "hello", Lang::Js).unwrap_err();
        assert!(matches!(e, NewError::Exists(_)), "{e}");
        assert_eq!(
            std::fs::read_to_string(project.join("keep")).unwrap(),
            "mine"
        );
        assert!(!project.join("app.js").exists());
    }

    /// The one command in a script that starts with `tool`, its words with
    /// the project's own names (`{{name}}`, the example's) as `NAME` and its
    /// output path dropped: what must agree between a template and its
    /// example.
    fn command(script: &str, tool: &str, names: &[&str]) -> Vec<String> {
        let line = script
            .lines()
            .map(|l| {
                l.trim()
                    .trim_start_matches('(')
                    .trim_start_matches("cd \"$js\" && ")
                    .trim_start_matches("cd \"$py\" && ")
            })
            .find(|l| l.starts_with(tool))
            .unwrap_or_else(|| panic!("no `{tool}` in {script}"));
        let mut words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        if let Some(at) = words.iter().position(|w| w == "-o" || w == "--out") {
            words.truncate(at);
        }
        words
            .into_iter()
            .filter(|w| !w.starts_with('"') && !w.starts_with("-d"))
            .map(|w| names.iter().fold(w, |w, n| w.replace(n, "NAME")))
            .collect()
    }

    /// `corral new`'s templates and the examples are built the same way
    /// with the same pinned tools: they share the WIT (the templates embed
    /// the repository's, the examples link it), and this holds the rest
    /// together so neither drifts.
    #[test]
    fn the_templates_and_the_examples_build_alike() {
        let examples_build = include_str!("../../../../../examples/build.sh");
        let setup = include_str!("../../../../../tests/setup.sh");
        // JavaScript: the same npm packages at the same versions, the same
        // componentize-js command.
        let deps = |text: &str| {
            serde_json::from_str::<serde_json::Value>(text).unwrap()["devDependencies"].clone()
        };
        let example_js = include_str!("../../../../../examples/js-greeter/package.json");
        let template_js = include_str!("templates/js/package.json");
        assert_eq!(deps(template_js), deps(example_js));
        let names = ["{{name}}", "js-greeter"];
        assert_eq!(
            command(include_str!("templates/js/build.sh"), "npx", &names),
            command(examples_build, "npx", &names)
        );
        // Python: the componentize-py that tests/setup.sh installs, and the
        // same command.
        let pinned = setup
            .lines()
            .find_map(|l| l.strip_prefix("COMPONENTIZE_PY_VERSION="))
            .unwrap();
        let template_py = include_str!("templates/python/build.sh");
        assert!(
            template_py.contains(&format!("componentize-py=={pinned}")),
            "{template_py}"
        );
        let names = ["local:{{name}}/{{name}}", "demo:shout/shout"];
        assert_eq!(
            command(template_py, "componentize-py", &names),
            command(examples_build, "componentize-py", &names)
        );
    }
}
