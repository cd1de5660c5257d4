//! Signing for authors and release pipelines, in cosign's formats:
//! `corral key new NAME` (a key pair), `corral sign oci://REF --key KEY`
//! (a registry artifact, its signature pushed beside it where cosign looks
//! for it), `corral sign FILE --key KEY` (a local file: `FILE.sig`, what
//! `cosign sign-blob` writes) and `corral push --sign KEY`. Private keys'
//! passwords come from CORRAL_KEY_PASSWORD or COSIGN_PASSWORD.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sha2::{Digest as _, Sha256};

use corral::oci::{self, OciRef, Registries};
use corral::trust::sign::{
    PASSWORD_VARIABLES, SigningKey, new_key_pair, password_from_env, payload,
};

use super::{RegistryArgs, error_exit, usage_error};

#[derive(clap::Args)]
pub struct Args {
    /// What to sign: oci://REGISTRY/REPOSITORY:TAG (or @sha256:…), a
    /// component in a registry; or a file.
    target: String,
    /// The private key: cosign's encrypted format (`corral key new`,
    /// `cosign generate-key-pair`) or an unencrypted PKCS#8 PEM.
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// Where a file's signature is written [default: FILE.sig].
    #[arg(long, value_name = "FILE")]
    output_signature: Option<PathBuf>,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(clap::Args)]
pub struct KeyArgs {
    #[command(subcommand)]
    command: KeyCommand,
}

#[derive(clap::Subcommand)]
enum KeyCommand {
    /// Make a key pair: NAME.key (cosign's encrypted private key, under the
    /// password in CORRAL_KEY_PASSWORD or COSIGN_PASSWORD, mode 0600) and
    /// NAME.pub (the public key a tenant's trust names).
    New {
        /// The files' path without extension (e.g. keys/release).
        name: PathBuf,
    },
}

pub async fn sign(args: Args) -> ExitCode {
    let key = match signing_key(&args.key) {
        Ok(key) => key,
        Err(code) => return code,
    };
    if !oci::is_reference(&args.target) {
        return sign_file(Path::new(&args.target), args.output_signature, &key);
    }
    if args.output_signature.is_some() {
        return usage_error(
            "--output-signature is for a file: a registry artifact's signature is pushed beside it",
        );
    }
    let reference: OciRef = match args.target.parse() {
        Ok(reference) => reference,
        Err(e) => return error_exit(&e),
    };
    let registries = args.registry.registries();
    let digest = match oci::component_manifest(&reference, &registries).await {
        Ok((digest, _)) => digest,
        Err(e) => return error_exit(&e),
    };
    sign_artifact(&reference, &digest, &key, &registries).await
}

/// The private key at `path`, its password from the environment.
pub(super) fn signing_key(path: &Path) -> Result<SigningKey, ExitCode> {
    SigningKey::read(path, &password_from_env()).map_err(|e| {
        usage_error(format!(
            "{e} (its password comes from {})",
            PASSWORD_VARIABLES.join(" or ")
        ))
    })
}

/// Signs the component manifest `digest` of `reference`'s repository and
/// pushes the signature where cosign (and a host) looks for it.
pub(super) async fn sign_artifact(
    reference: &OciRef,
    digest: &str,
    key: &SigningKey,
    registries: &Registries,
) -> ExitCode {
    let payload = match payload(&reference.repository(), digest) {
        Ok(payload) => payload,
        Err(e) => return error_exit(&e),
    };
    let signature = match key.sign(&payload) {
        Ok(signature) => signature,
        Err(e) => return error_exit(&e),
    };
    match oci::signatures::push_signature(reference, digest, payload, signature, registries).await {
        Ok(_) => {
            println!(
                "signed {} with key {}",
                reference.at_digest(digest),
                key.fingerprint
            );
            ExitCode::SUCCESS
        }
        Err(e) => error_exit(&e),
    }
}

/// Signs the file at `path` as `cosign sign-blob` does, writing the
/// signature to `output` (default `FILE.sig`).
fn sign_file(path: &Path, output: Option<PathBuf>, key: &SigningKey) -> ExitCode {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) => return usage_error(format!("reading `{}`: {e}", path.display())),
    };
    let signature = match key.sign(&bytes) {
        Ok(signature) => signature,
        Err(e) => return error_exit(&e),
    };
    let output = output.unwrap_or_else(|| corral::trust::file::beside(path));
    if let Err(e) = std::fs::write(&output, &signature) {
        return usage_error(format!("writing `{}`: {e}", output.display()));
    }
    println!(
        "signed {} (sha256:{}) with key {}: {}",
        path.display(),
        hex::encode(Sha256::digest(&bytes)),
        key.fingerprint,
        output.display()
    );
    ExitCode::SUCCESS
}

pub fn key(args: KeyArgs) -> ExitCode {
    let KeyCommand::New { name } = args.command;
    if !PASSWORD_VARIABLES
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    {
        return usage_error(format!(
            "set {} to the password to encrypt the private key with (empty for none)",
            PASSWORD_VARIABLES.join(" or ")
        ));
    }
    let password = password_from_env();
    if password.is_empty() {
        eprintln!(
            "warning: the private key is not encrypted ({} is empty): whoever reads the file can sign as you",
            PASSWORD_VARIABLES.join(" or ")
        );
    }
    let (private, public, fingerprint) = match new_key_pair(&password) {
        Ok(pair) => pair,
        Err(e) => return error_exit(&e),
    };
    let with = |extension: &str| {
        let mut path = name.as_os_str().to_owned();
        path.push(extension);
        PathBuf::from(path)
    };
    let (key_path, pub_path) = (with(".key"), with(".pub"));
    for path in [&key_path, &pub_path] {
        if path.exists() {
            return usage_error(format!("`{}` exists: not overwriting it", path.display()));
        }
    }
    // The private key owner-only from its first byte; neither key over a
    // file, or through a link, made meanwhile.
    let mut file = match corral_core::private::new_file(&key_path) {
        Ok(file) => file,
        Err(e) => return usage_error(format!("writing `{}`: {e}", key_path.display())),
    };
    let written = file.write_all(private.as_bytes()).and_then(|()| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&pub_path)?
            .write_all(public.as_bytes())
    });
    if let Err(e) = written {
        // Not half a pair (the private key is this run's own): a rerun
        // would be refused for it alone.
        let _ = std::fs::remove_file(&key_path);
        return usage_error(format!("writing the key pair `{}`: {e}", name.display()));
    }
    println!(
        "private key {} (keep it secret), public key {} ({fingerprint})",
        key_path.display(),
        pub_path.display()
    );
    ExitCode::SUCCESS
}
