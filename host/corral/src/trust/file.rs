//! A file's signature file (`cosign sign-blob`'s output): where it is
//! looked for beside the file, and reading it, bounded, for the CLI's
//! upload and the host's configured files alike.

use std::io::Read as _;
use std::path::{Path, PathBuf};

/// The largest signature file read, and the most an upload's header
/// carries (a cosign signature is about 100 bytes).
pub const MAX_SIGNATURE: usize = 4 << 10;

/// `FILE.sig`, beside `path`: where `corral sign FILE` writes the
/// signature and where it is looked for.
pub fn beside(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".sig");
    name.into()
}

#[derive(Debug, thiserror::Error)]
pub enum SignatureFileError {
    #[error("reading the signature `{}`: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{}` is not a signature: over {MAX_SIGNATURE} bytes (a cosign signature is about 100)", path.display())]
    TooLarge { path: PathBuf },
}

/// The signature file at `path`, at most [`MAX_SIGNATURE`] bytes.
pub fn read(path: &Path) -> Result<Vec<u8>, SignatureFileError> {
    let failed = |source| SignatureFileError::Read {
        path: path.to_owned(),
        source,
    };
    let mut signature = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| {
            file.take(MAX_SIGNATURE as u64 + 1)
                .read_to_end(&mut signature)
        })
        .map_err(failed)?;
    if signature.len() > MAX_SIGNATURE {
        return Err(SignatureFileError::TooLarge {
            path: path.to_owned(),
        });
    }
    Ok(signature)
}

/// As [`read`], `None` where there is no file at `path`.
pub fn read_if_there(path: &Path) -> Result<Option<Vec<u8>>, SignatureFileError> {
    match read(path) {
        Ok(signature) => Ok(Some(signature)),
        Err(SignatureFileError::Read { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_file_is_read_only_up_to_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.wasm.sig");
        assert_eq!(beside(&dir.path().join("c.wasm")), path);
        assert!(read_if_there(&path).unwrap().is_none());
        assert!(
            read(&path)
                .unwrap_err()
                .to_string()
                .contains("reading the signature")
        );
        std::fs::write(&path, vec![b'A'; MAX_SIGNATURE]).unwrap();
        assert_eq!(read(&path).unwrap().len(), MAX_SIGNATURE);
        std::fs::write(&path, vec![b'A'; 64 << 20]).unwrap();
        let refused = read_if_there(&path).unwrap_err().to_string();
        assert!(
            refused.contains("is not a signature: over 4096 bytes"),
            "{refused}"
        );
    }
}
