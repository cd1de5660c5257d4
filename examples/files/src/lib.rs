//! `demo:files`: file access through the directories the tenant granted
//! (`corral run … --dir ./data:/data`), and nothing else.

use std::io::ErrorKind;

use corral_guest::Failure;

corral_guest::generate!("demo:files/files");

use exports::demo::files::api::Guest;

fn failure(path: &str, e: std::io::Error) -> Failure {
    let kind = match e.kind() {
        ErrorKind::NotFound => "NotFound",
        ErrorKind::PermissionDenied => "Denied",
        _ => "Io",
    };
    Failure::new(kind, format!("{path}: {e}")).non_retryable()
}

struct Files;

impl Guest for Files {
    fn read(path: String) -> Result<String, Failure> {
        std::fs::read_to_string(&path).map_err(|e| failure(&path, e))
    }

    fn list_dir(dir: String) -> Result<Vec<String>, Failure> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| failure(&dir, e))? {
            let entry = entry.map_err(|e| failure(&dir, e))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    fn write(path: String, contents: String) -> Result<(), Failure> {
        std::fs::write(&path, contents).map_err(|e| failure(&path, e))
    }
}

export!(Files);
