//! An engine's address answered by a hostile peer: what it says reaches
//! corral's last words at start, escaped and bounded.

mod common;

use common::activities::text;
use common::example;
use common::processes::{FORGED_AT, forgery, loopback_peer, serve_to_exit};

/// A gRPC peer on a loopback port that answers every call with
/// `PERMISSION_DENIED` and `message` (trailers only, as a gRPC server
/// refusing a call does).
fn refusing_grpc_peer(message: &str) -> u16 {
    // gRPC's own encoding of a status message: every byte but printable
    // ASCII (and `%`) percent-encoded.
    let encoded: String = message
        .bytes()
        .map(|b| match b {
            b' '..=b'~' if b != b'%' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    loopback_peer(|listener| async move {
        while let Ok((socket, _)) = listener.accept().await {
            let encoded = encoded.clone();
            tokio::spawn(async move {
                let Ok(mut connection) = h2::server::handshake(socket).await else {
                    return;
                };
                while let Some(Ok((_, mut respond))) = connection.accept().await {
                    let refusal = http::Response::builder()
                        .header("content-type", "application/grpc")
                        .header("grpc-status", "7")
                        .header("grpc-message", encoded.as_str())
                        .body(())
                        .unwrap();
                    let _ = respond.send_response(refusal, true);
                }
            });
        }
    })
}

#[test]
fn an_engines_refusal_in_corrals_last_words_is_escaped_and_bounded() {
    let port = refusing_grpc_peer(&forgery("refused", 6000));
    let greeter = format!("{:?}", example("greeter").display().to_string());
    let out = serve_to_exit(&format!(
        "[host]\nconnect_timeout = \"1s\"\ncache_dir = \"cache\"\n[[tenant]]\nname = \"acme\"\n\
         temporal = {{ address = \"http://127.0.0.1:{port}\", namespace = \"default\", task_queue = \"q\" }}\n\
         components = [{greeter}]\n"
    ));
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    // It did hear the peer (so the bounds below were tested), and says
    // which tenant's engine refused.
    let last = String::from_utf8_lossy(&out.stderr)
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned();
    assert!(last.starts_with("corral: "), "{said}");
    assert!(last.contains("acme"), "{last}");
    assert!(last.contains("refused\\n2026"), "{last}");
    assert!(
        !said.lines().any(|line| line.starts_with(FORGED_AT)),
        "a forged line in corral's output:\n{said}"
    );
    assert!(!said.contains('\u{1b}'), "an escape in corral's output");
    assert!(
        !said.contains(&"x".repeat(2500)),
        "the peer's text whole in corral's output ({} bytes)",
        said.len()
    );
    assert!(last.len() < 2200, "{} bytes: {last}", last.len());
}
