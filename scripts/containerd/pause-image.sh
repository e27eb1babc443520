#!/usr/bin/env bash
# Builds the CRI sandbox ("pause") image from pause.c as an OCI image-layout tarball that
# `ctr images import` takes: oci-layout, index.json naming the image, manifest, config and one
# gzip layer holding a static /pause. Offline, reproducible (fixed mtimes, gzip -n).
#   pause-image.sh OUT.tar IMAGE_NAME
set -euo pipefail
out=$1 name=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/rootfs" "$work/img/blobs/sha256"
gcc -static -Os -s -o "$work/rootfs/pause" "$here/pause.c"

blob() { # FILE → prints "digest size" and stores the blob
  local d s
  d=$(sha256sum "$1" | cut -d' ' -f1)
  s=$(stat -c %s "$1")
  cp "$1" "$work/img/blobs/sha256/$d"
  echo "$d $s"
}

tar -C "$work/rootfs" --owner=0 --group=0 --numeric-owner --mtime=@0 --sort=name -cf "$work/layer.tar" pause
diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
gzip -n -c "$work/layer.tar" >"$work/layer.tar.gz"
read -r layer_d layer_s < <(blob "$work/layer.tar.gz")

jq -cn --arg diff "sha256:$diff_id" '{architecture: "amd64", os: "linux",
  config: {Entrypoint: ["/pause"], User: "65535:65535"},
  rootfs: {type: "layers", diff_ids: [$diff]}}' >"$work/config.json"
read -r cfg_d cfg_s < <(blob "$work/config.json")

jq -cn --arg cd "sha256:$cfg_d" --argjson cs "$cfg_s" --arg ld "sha256:$layer_d" --argjson ls "$layer_s" \
  '{schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cd, size: $cs},
    layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $ld, size: $ls}]}' \
  >"$work/manifest.json"
read -r man_d man_s < <(blob "$work/manifest.json")

jq -cn --arg md "sha256:$man_d" --argjson ms "$man_s" --arg name "$name" \
  '{schemaVersion: 2, manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json",
    digest: $md, size: $ms, platform: {architecture: "amd64", os: "linux"},
    annotations: {"io.containerd.image.name": $name}}]}' >"$work/img/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$work/img/oci-layout"
tar -C "$work/img" --owner=0 --group=0 --numeric-owner --mtime=@0 --sort=name -cf "$out" .
