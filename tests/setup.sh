#!/usr/bin/env bash
# Installs what the build and the tests need on a fresh machine; quick (and
# quiet) when everything is already there. Sourced by tests/run and
# examples/quickstart.sh.
set -euo pipefail

COMPONENTIZE_PY_VERSION=0.25.1

if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  echo "setup: adding the wasm32-wasip2 Rust target" >&2
  rustup target add wasm32-wasip2
fi

if [ "${CORRAL_SETUP_MINIMAL:-}" != 1 ]; then
  for component in clippy rustfmt; do
    if ! rustup component list --installed | grep -q "^$component"; then
      echo "setup: adding rustup component $component" >&2
      rustup component add "$component"
    fi
  done
  if [ "$(componentize-py --version 2>/dev/null | awk '{print $2}')" != "$COMPONENTIZE_PY_VERSION" ]; then
    echo "setup: installing componentize-py $COMPONENTIZE_PY_VERSION (builds the Python example)" >&2
    python3 -m pip install --quiet --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY_VERSION"
  fi
fi
