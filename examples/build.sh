#!/usr/bin/env bash
# Builds every example activity into examples/dist/*.wasm.
#   examples/build.sh            all examples: Rust, Python (componentize-py) and
#                                JavaScript (node; componentize-js comes from npm)
#   CORRAL_SKIP_PYTHON=1 ...     without the Python example
#   CORRAL_SKIP_JS=1 ...         without the JavaScript example
#   CORRAL_QUIET=1 ...           without cargo's progress
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dist="$here/dist"
mkdir -p "$dist"
# One build at a time: test processes may call this concurrently.
exec 9>"$dist/.lock"
flock 9

target="${CARGO_TARGET_DIR:-$here/target}"
quiet=()
[ -n "${CORRAL_QUIET:-}" ] && quiet=(--quiet)
cargo build "${quiet[@]}" --release --target wasm32-wasip2 --manifest-path "$here/Cargo.toml" --target-dir "$target"
for name in greeter progress files misbehave echo fetch; do
  cp -p "$target/wasm32-wasip2/release/$name.wasm" "$dist/$name.wasm.tmp"
  mv "$dist/$name.wasm.tmp" "$dist/$name.wasm"
done
# The attack suite's guests: test-only, kept out of dist/ (which `corral dev`
# serves).
guests="$here/../tests/guests/dist"
mkdir -p "$guests"
cp -p "$target/wasm32-wasip2/release/hostile.wasm" "$guests/hostile.wasm.tmp"
mv "$guests/hostile.wasm.tmp" "$guests/hostile.wasm"
# The same guest without function names (a stripped tenant component).
cargo build "${quiet[@]}" --profile stripped --target wasm32-wasip2 --manifest-path "$here/Cargo.toml" --target-dir "$target" -p hostile
cp -p "$target/wasm32-wasip2/stripped/hostile.wasm" "$guests/hostile-stripped.wasm.tmp"
mv "$guests/hostile-stripped.wasm.tmp" "$guests/hostile-stripped.wasm"
# Version 1 of `versioned` is dist/versioned.wasm; version 2 of the same
# deployment is dist/v2/versioned.wasm, version 3 dist/v3/versioned.wasm (kept
# apart: they export the same types).
cp -p "$target/wasm32-wasip2/release/versioned.wasm" "$dist/versioned.wasm.tmp"
mv "$dist/versioned.wasm.tmp" "$dist/versioned.wasm"
mkdir -p "$dist/v2"
cargo build "${quiet[@]}" --release --target wasm32-wasip2 --manifest-path "$here/Cargo.toml" --target-dir "$target" -p versioned --features v2
cp -p "$target/wasm32-wasip2/release/versioned.wasm" "$dist/v2/versioned.wasm.tmp"
mv "$dist/v2/versioned.wasm.tmp" "$dist/v2/versioned.wasm"
mkdir -p "$dist/v3"
cargo build "${quiet[@]}" --release --target wasm32-wasip2 --manifest-path "$here/Cargo.toml" --target-dir "$target" -p versioned --features v3
cp -p "$target/wasm32-wasip2/release/versioned.wasm" "$dist/v3/versioned.wasm.tmp"
mv "$dist/v3/versioned.wasm.tmp" "$dist/v3/versioned.wasm"

if [ -z "${CORRAL_SKIP_PYTHON:-}" ]; then
  if ! command -v componentize-py >/dev/null; then
    echo "componentize-py is not installed: pip install componentize-py (or set CORRAL_SKIP_PYTHON=1)" >&2
    exit 1
  fi
  py="$here/python-shout"
  if [ ! -f "$dist/python-shout.wasm" ] || [ -n "$(find "$py" "$here/../wit" -newer "$dist/python-shout.wasm" -type f | head -1)" ]; then
    [ -n "${CORRAL_QUIET:-}" ] || echo "building examples/python-shout with componentize-py (a minute or so)" >&2
    (cd "$py" && componentize-py -d "$here/../wit" -d wit -w demo:shout/shout componentize app -o "$dist/python-shout.wasm.tmp" >/dev/null)
    mv "$dist/python-shout.wasm.tmp" "$dist/python-shout.wasm"
  fi
fi

if [ -z "${CORRAL_SKIP_JS:-}" ]; then
  if ! command -v npm >/dev/null; then
    echo "node and npm are not installed: install Node.js 18 or later (or set CORRAL_SKIP_JS=1)" >&2
    exit 1
  fi
  js="$here/js-greeter"
  # componentize-js, pinned by package-lock.json, from npm.
  if [ ! -d "$js/node_modules/@bytecodealliance/componentize-js" ] || [ "$js/package-lock.json" -nt "$js/node_modules/.package-lock.json" ]; then
    [ -n "${CORRAL_QUIET:-}" ] || echo "installing componentize-js from npm for examples/js-greeter" >&2
    (cd "$js" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  fi
  if [ ! -f "$dist/js-greeter.wasm" ] || [ -n "$(find -L "$js/app.js" "$js/wit" -newer "$dist/js-greeter.wasm" -type f | head -1)" ]; then
    [ -n "${CORRAL_QUIET:-}" ] || echo "building examples/js-greeter with componentize-js (half a minute or so)" >&2
    (cd "$js" && npx --no-install componentize-js app.js --wit wit --world-name js-greeter --out "$dist/js-greeter.wasm.tmp" >/dev/null)
    mv "$dist/js-greeter.wasm.tmp" "$dist/js-greeter.wasm"
  fi
fi
