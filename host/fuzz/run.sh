#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 60), with cargo-fuzz on a
# nightly toolchain (installed when missing). Not part of CI: findings go in
# host/fuzz/artifacts/<target>/, and each is fixed with a test of its own.
#   host/fuzz/run.sh 300
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
seconds="${1:-60}"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
# json_to_wit reads the echo example.
[ -f "$here/../../examples/dist/echo.wasm" ] || CORRAL_SKIP_PYTHON=1 CORRAL_SKIP_JS=1 "$here/../../examples/build.sh"
cd "$here"
for target in admin_messages config oci_manifest json_to_wit; do
  echo "== $target for ${seconds}s" >&2
  # -O: release, as `cargo fuzz build -O` builds it (set FUZZ_BUILD="-O -a"
  # to keep debug assertions and overflow checks; that rebuilds everything).
  # shellcheck disable=SC2086
  cargo +nightly fuzz run ${FUZZ_BUILD:--O} --fuzz-dir "$here" "$target" -- -max_total_time="$seconds" -rss_limit_mb=4096
done
