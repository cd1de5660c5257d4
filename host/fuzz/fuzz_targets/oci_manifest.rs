//! A manifest a registry sends, as the host reads it: a layer it may
//! fetch, or a bounded error, never a panic; an error's text stays within
//! its bound whatever the registry sent.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(tag) = "oci://registry.example.com/acme/x:1".parse::<corral::oci::OciRef>() else {
        return;
    };
    match corral::oci::component_layer(data, &tag, 64 << 20) {
        Ok((digest, layer)) => {
            assert!(corral::oci::is_sha256_digest(&digest));
            assert!(layer.size >= 0 && layer.size <= 64 << 20);
            assert!(layer.urls.as_ref().is_none_or(Vec::is_empty));
        }
        Err(e) => {
            let text = e.to_string();
            assert!(text.len() < 4096, "an error of {} bytes", text.len());
        }
    }
});
