use super::sign::{SigningKey, new_key_pair, payload};
use super::*;

/// A key pair in `dir` named `name`: the signing key and the policy
/// trusting its public key.
fn pair(dir: &Path, name: &str) -> (SigningKey, PathBuf) {
    let (private, public, _) = new_key_pair(b"pw").unwrap();
    let (key, pub_path) = (
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.pub")),
    );
    std::fs::write(&key, private.as_bytes()).unwrap();
    std::fs::write(&pub_path, public).unwrap();
    (SigningKey::read(&key, b"pw").unwrap(), pub_path)
}

const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const OTHER: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

#[test]
fn a_signature_serves_only_when_a_trusted_key_made_it_for_this_digest() {
    let dir = tempfile::tempdir().unwrap();
    let (trusted, trusted_pub) = pair(dir.path(), "release");
    let (stranger, _) = pair(dir.path(), "stranger");
    let policy = TrustPolicy::new(&[trusted_pub], true).unwrap();
    let signed = |key: &SigningKey, digest: &str| {
        let payload = payload("registry.example/acme/greeter", digest).unwrap();
        PayloadSignature {
            signature: key.sign(&payload).unwrap(),
            payload,
        }
    };
    assert_eq!(
        policy
            .verify_payloads(DIGEST, &[signed(&trusted, DIGEST)])
            .unwrap(),
        trusted.fingerprint
    );
    // One good signature among others is enough.
    assert_eq!(
        policy
            .verify_payloads(
                DIGEST,
                &[signed(&stranger, DIGEST), signed(&trusted, DIGEST)]
            )
            .unwrap(),
        trusted.fingerprint
    );
    let refused = |found: &[PayloadSignature]| policy.verify_payloads(DIGEST, found).unwrap_err();
    assert!(matches!(refused(&[]), Refused::Unsigned { .. }));
    assert!(matches!(
        refused(&[signed(&stranger, DIGEST)]),
        Refused::UntrustedKey
    ));
    // A trusted key's signature of another artifact, replayed.
    let replayed = refused(&[signed(&trusted, OTHER)]);
    assert!(
        matches!(&replayed, Refused::OtherDigest { signed, .. } if signed == OTHER),
        "{replayed}"
    );
    // A payload tampered after signing.
    let mut tampered = signed(&trusted, OTHER);
    tampered.payload = payload("registry.example/acme/greeter", DIGEST).unwrap();
    assert!(matches!(refused(&[tampered]), Refused::UntrustedKey));
    let garbage = PayloadSignature {
        payload: b"not json".to_vec(),
        signature: "AAAA".into(),
    };
    assert!(matches!(refused(&[garbage]), Refused::Malformed(_)));
}

#[test]
fn a_files_signature_is_cosign_sign_blobs_over_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = pair(dir.path(), "release");
    let policy = TrustPolicy::new(&[public], true).unwrap();
    let bytes = b"\0asm component bytes";
    let signature = key.sign(bytes).unwrap();
    assert_eq!(
        policy.verify_blob(bytes, signature.as_bytes()).unwrap(),
        key.fingerprint
    );
    assert!(matches!(
        policy.verify_blob(b"other bytes", signature.as_bytes()),
        Err(Refused::UntrustedKey)
    ));
    assert!(matches!(
        policy.verify_blob(bytes, b"\x1b[2J not base64"),
        Err(Refused::Malformed(_))
    ));
}

#[test]
fn a_policy_takes_p256_public_keys_and_requires_one_to_require() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = pair(dir.path(), "release");
    let policy = TrustPolicy::new(std::slice::from_ref(&public), false).unwrap();
    assert!(policy.admits(None), "nothing required");
    let required = TrustPolicy::new(&[public], true).unwrap();
    assert!(required.admits(Some(&key.fingerprint)));
    assert!(!required.admits(None));
    assert!(!required.admits(Some("sha256:00")));
    assert!(matches!(
        TrustPolicy::new(&[], true),
        Err(PolicyError::RequireWithoutKeys)
    ));
    let junk = dir.path().join("junk.pub");
    std::fs::write(
        &junk,
        "-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n",
    )
    .unwrap();
    let e = TrustPolicy::new(&[junk], false).unwrap_err().to_string();
    assert!(e.starts_with("keys[0]: `"), "{e}");
    assert!(
        e.contains("is not a public key corral can verify with"),
        "{e}"
    );
    let missing = TrustPolicy::new(&[dir.path().join("none.pub")], false).unwrap_err();
    assert!(missing.to_string().contains("reading `"), "{missing}");
}
