//! Keys and signatures made by the real CLI (`corral key new`, `corral
//! sign`), for the signature tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::activities::text;

/// `corral <args>` with the private keys' password in the environment.
pub fn corral(args: &[&str], password: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_corral"));
    command
        .args(args)
        .env_remove("CORRAL_KEY_PASSWORD")
        .env_remove("COSIGN_PASSWORD");
    if let Some(password) = password {
        command.env("CORRAL_KEY_PASSWORD", password);
    }
    command.output().expect("corral runs")
}

/// `corral <args>`, expecting success: its stdout.
pub fn ok(args: &[&str], password: &str) -> String {
    let out = corral(args, Some(password));
    assert!(out.status.success(), "corral {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `corral <args>`, expecting a refusal (exit 2) that says `says`.
pub fn refused(out: &Output, says: &str) {
    let said = text(out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains(says), "no `{says}` in: {said}");
}

/// A key pair made by `corral key new`: the private key's path, the
/// public key's, and its fingerprint as printed.
pub struct Key {
    pub private: String,
    pub public: PathBuf,
    pub fingerprint: String,
    pub password: &'static str,
}

pub fn new_key(dir: &Path, name: &str, password: &'static str) -> Key {
    let base = dir.join(name);
    let said = ok(&["key", "new", &base.display().to_string()], password);
    let fingerprint = said
        .split_once("(sha256:")
        .and_then(|(_, rest)| rest.split(')').next())
        .map(|hex| format!("sha256:{hex}"))
        .unwrap_or_else(|| panic!("no fingerprint in: {said}"));
    Key {
        private: format!("{}.key", base.display()),
        public: base.with_extension("pub"),
        fingerprint,
        password,
    }
}

pub fn sign(target: &str, key: &Key, extra: &[&str]) -> String {
    let mut args = vec!["sign", target, "--key", &key.private];
    args.extend_from_slice(extra);
    ok(&args, key.password)
}
