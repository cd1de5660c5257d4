#!/bin/sh
# Builds dist/{{name}}.wasm, a WebAssembly component.
# Needs Rust with the wasm32-wasip2 target: rustup target add wasm32-wasip2
set -eu
cd "$(dirname "$0")"
cargo build --release --target wasm32-wasip2
mkdir -p dist
cp "${CARGO_TARGET_DIR:-target}/wasm32-wasip2/release/{{snake_name}}.wasm" dist/{{name}}.wasm
echo "built dist/{{name}}.wasm"
