#!/usr/bin/env bash
# Builds the CRI sandbox ("pause") image from pause.c as an OCI image-layout tarball that
# `ctr images import` takes (scripts/oci.sh): a static /pause, run as 65535:65535. Offline,
# reproducible (fixed mtimes, gzip -n).
#   pause-image.sh OUT.tar IMAGE_NAME
set -euo pipefail
[ $# = 2 ] || { echo "usage: pause-image.sh OUT.tar IMAGE_NAME" >&2; exit 2; }
out=$1 name=$2
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/oci.sh
. "$here/../oci.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/rootfs"
gcc -static -Os -s -o "$work/rootfs/pause" "$here/pause.c"
oci_pack "$work/rootfs" "$out" "$name" '{"Entrypoint": ["/pause"], "User": "65535:65535"}' >/dev/null
