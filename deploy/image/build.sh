#!/usr/bin/env bash
# Builds corral's container image from scratch: no base image is pulled.
#
#   deploy/image/build.sh [IMAGE]        builds corral (release) and IMAGE
#                                        (default corral:latest)
#   CORRAL_BIN=path deploy/image/build.sh IMAGE
#                                        packs a corral already built
#
# It gathers the image's whole root file system into the build context:
# the corral binary, the C libraries it links (from this machine, as ldd
# names them), the CA certificates registries' TLS is checked against, a
# non-root user, and the directories the Containerfile declares as volumes.
# Nothing else: no shell, no package manager, no compiler. Then `podman
# build` (or `docker build`, with CORRAL_IMAGE_TOOL=docker) makes the image.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
image="${1:-corral:latest}"
tool="${CORRAL_IMAGE_TOOL:-podman}"

if [ -n "${CORRAL_BIN:-}" ]; then
  corral="$CORRAL_BIN"
else
  echo "image: building corral (cargo build --release -p corral)" >&2
  cargo build --release -p corral --manifest-path "$root/Cargo.toml"
  corral="${CARGO_TARGET_DIR:-$root/target}/release/corral"
fi
[ -x "$corral" ] || { echo "image: no corral binary at $corral" >&2; exit 1; }
command -v "$tool" >/dev/null || { echo "image: $tool is not installed (apt-get install podman)" >&2; exit 1; }

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
rootfs="$context/rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/corral" "$rootfs/etc/ssl/certs" \
  "$rootfs/var/lib" "$rootfs/var/cache" "$rootfs/tmp" "$rootfs/proc"
cp "$corral" "$rootfs/usr/local/bin/corral"
# The binary's shared libraries and its loader, at the paths it was linked
# against (`ldd` prints `name => path (address)` or `path (address)`).
ldd "$corral" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' | while read -r lib; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done
cp -L /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
# The user corral runs as (65532, as distroless images name `nonroot`).
printf 'root:x:0:0:root:/root:/sbin/nologin\ncorral:x:65532:65532:corral:/var/lib/corral:/sbin/nologin\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\ncorral:x:65532:\n' >"$rootfs/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$rootfs/etc/hosts"
chmod 1777 "$rootfs/tmp"
# Its data and cache directories, which the Containerfile gives its user.
mkdir -p "$context/owned"
chmod 0700 "$context/owned"
cp "$here/Containerfile" "$context/Containerfile"
"$tool" build --quiet -t "$image" -f "$context/Containerfile" "$context"
echo "image: built $image" >&2
