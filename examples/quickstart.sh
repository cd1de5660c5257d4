#!/usr/bin/env bash
# The quickstart: builds the example activities and the host, then runs the
# typed greeter activity in the sandbox, end to end.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
CORRAL_SETUP_MINIMAL=1 source tests/setup.sh
command -v componentize-py >/dev/null || export CORRAL_SKIP_PYTHON=1
examples/build.sh
cargo build --quiet -p corral
corral="${CARGO_TARGET_DIR:-$root/target}/debug/corral"

set -x
"$corral" inspect examples/dist/greeter.wasm
"$corral" run examples/dist/greeter.wasm demo:greeter/api.greet '{"name":"Ada","title":"Countess","language":"english"}' '"formal"'
"$corral" run examples/dist/progress.wasm demo:progress/api.count-to 3 100
"$corral" run --json --memory 16MiB examples/dist/misbehave.wasm demo:misbehave/api.allocate 64 || true
