//! Writes the `generate!` macro with the absolute path of this crate's copy
//! of corral's WIT, so an author's own `wit_bindgen` invocation (which
//! resolves paths against the author's crate) finds corral's package without
//! the author copying it.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let wit = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("wit");
    let wit = wit
        .to_str()
        .ok_or("the corral-guest crate's path is not UTF-8")?;
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("generate.rs");
    std::fs::write(out, MACRO.replace("CORRAL_WIT", &format!("{wit:?}")))?;
    Ok(())
}

const MACRO: &str = r#"
/// Generates the bindings of your activity's world, with corral's
/// `corral:activity` package and this crate's types already mapped: your
/// `wit/` needs only your own package, and your crate depends only on
/// `corral-guest`. (Do not also put corral's package in your `wit/deps`:
/// wit-bindgen refuses a package added twice.)
///
/// ```ignore
/// corral_guest::generate!("demo:greeter/greeter");
/// ```
///
/// Further `wit_bindgen::generate!` options may follow the world:
/// `corral_guest::generate!("demo:greeter/greeter", additional_derives: [Clone]);`.
#[macro_export]
macro_rules! generate {
    ($world:literal $(, $($option:tt)*)?) => {
        $crate::__private::wit_bindgen::generate!({
            path: [CORRAL_WIT, "wit"],
            world: $world,
            runtime_path: "::corral_guest::__private::wit_bindgen::rt",
            bitflags_path: "::corral_guest::__private::wit_bindgen::rt::bitflags",
            with: {
                "corral:activity/types@0.1.0": ::corral_guest::types,
                "corral:activity/context@0.1.0": ::corral_guest::context,
            },
            $($($option)*)?
        });
    };
}
"#;
