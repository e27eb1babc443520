# OCI image-layout archives built from a directory, without docker or a registry: the one place
# Weft packs an image (scripts/image, scripts/containerd/pause-image.sh, scripts/cluster/images).
# Source it; needs tar, gzip, sha256sum, jq (and ldd for oci_add_exe).
#
#   oci_pack ROOTFS OUT NAME CONFIG
#     ROOTFS  directory packed as the image's one gzip layer (owner root, mtime 0, sorted: the same
#             files give the same archive)
#     OUT     the archive to write (oci-layout, index.json, blobs/sha256/...)
#     NAME    image name, e.g. registry.k8s.io/pause:3.10.1: index.json's io.containerd.image.name
#             (what `ctr images import` calls it) and org.opencontainers.image.ref.name (the tag,
#             what skopeo reads)
#     CONFIG  JSON object: the image config's "config" (Entrypoint, Cmd, Env, User, Labels, ...)
#   Prints "OUT: NAME (size, manifest sha256:...)". Load it: ctr -n k8s.io images import OUT
#
#   oci_add_exe ROOTFS EXE [DEST]
#     copies EXE to ROOTFS/DEST (default: the same path) and every shared library ldd resolves for
#     it (and the dynamic loader) at its absolute path, as real files: the loader finds them in its
#     default directories, no ld.so.cache needed. A static EXE brings nothing else.
#
#   oci_arch   the OCI architecture name of this machine (amd64, arm64)
#
#   oci_ensure_debs PKG...
#     installs those of the Debian packages PKG that are missing (an image takes files from them),
#     as scripts/setup does; fails, saying which and how, when it cannot.
# shellcheck shell=bash

oci_ensure_debs() {
  local p missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} = 0 ] && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "missing Debian packages ${missing[*]}: apt-get install ${missing[*]} (as root)" >&2
    return 1
  fi
  echo "installing Debian packages ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || {
    echo "apt-get install ${missing[*]} failed" >&2
    return 1
  }
}

oci_arch() {
  case $(uname -m) in
    x86_64) echo amd64 ;;
    aarch64) echo arm64 ;;
    *) echo "oci_arch: unsupported architecture $(uname -m)" >&2; return 1 ;;
  esac
}

oci_add_exe() {
  local rootfs=$1 exe=$2 dest=${3:-$2} lib
  [ -x "$exe" ] || { echo "oci_add_exe: $exe is not an executable file" >&2; return 1; }
  mkdir -p "$rootfs$(dirname "$dest")"
  cp -L "$exe" "$rootfs$dest"
  # ldd exits 1 on a static binary ("not a dynamic executable"): nothing to add then.
  { ldd "$exe" 2>/dev/null || true; } | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' |
    sort -u | while read -r lib; do
      [ -e "$rootfs$lib" ] && continue
      mkdir -p "$rootfs$(dirname "$lib")"
      cp -L "$lib" "$rootfs$lib"
    done
}

oci_pack() {
  local rootfs=$1 out=$2 name=$3 config=$4 work arch rc=0
  local tool
  for tool in tar gzip sha256sum jq; do
    command -v "$tool" >/dev/null || { echo "oci_pack: $tool is missing: run scripts/setup" >&2; return 1; }
  done
  [ -d "$rootfs" ] || { echo "oci_pack: $rootfs is not a directory" >&2; return 1; }
  jq -e 'type == "object"' >/dev/null 2>&1 <<<"$config" ||
    { echo "oci_pack: the image config must be a JSON object, got: $config" >&2; return 1; }
  arch=$(oci_arch) || return 1
  work=$(mktemp -d)
  _oci_pack_in "$work" "$rootfs" "$out" "$name" "$config" "$arch" || rc=$?
  rm -rf "$work"
  return "$rc"
}

_oci_pack_in() {
  local work=$1 rootfs=$2 out=$3 name=$4 config=$5 arch=$6
  local diff_id layer_d layer_s cfg_d cfg_s man_d man_s
  mkdir -p "$work/img/blobs/sha256"
  _oci_blob() { # FILE → prints "digest size" and stores the blob
    local d s
    d=$(sha256sum "$1" | cut -d' ' -f1)
    s=$(stat -c %s "$1")
    cp "$1" "$work/img/blobs/sha256/$d"
    echo "$d $s"
  }
  tar -C "$rootfs" --owner=0 --group=0 --numeric-owner --mtime=@0 --sort=name -cf "$work/layer.tar" . || return 1
  diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
  gzip -n -c "$work/layer.tar" >"$work/layer.tar.gz" || return 1
  read -r layer_d layer_s < <(_oci_blob "$work/layer.tar.gz")

  jq -cn --arg diff "sha256:$diff_id" --arg arch "$arch" --argjson config "$config" \
    '{architecture: $arch, os: "linux", config: $config,
      rootfs: {type: "layers", diff_ids: [$diff]}}' >"$work/config.json" || return 1
  read -r cfg_d cfg_s < <(_oci_blob "$work/config.json")

  jq -cn --arg cd "sha256:$cfg_d" --argjson cs "$cfg_s" --arg ld "sha256:$layer_d" --argjson ls "$layer_s" \
    '{schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cd, size: $cs},
      layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $ld, size: $ls}]}' \
    >"$work/manifest.json" || return 1
  read -r man_d man_s < <(_oci_blob "$work/manifest.json")

  jq -cn --arg md "sha256:$man_d" --argjson ms "$man_s" --arg name "$name" --arg arch "$arch" \
    '{schemaVersion: 2, manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json",
      digest: $md, size: $ms, platform: {architecture: $arch, os: "linux"},
      annotations: {"io.containerd.image.name": $name,
        "org.opencontainers.image.ref.name": ($name | sub("^.*:"; ""))}}]}' >"$work/img/index.json" || return 1
  echo '{"imageLayoutVersion":"1.0.0"}' >"$work/img/oci-layout"
  mkdir -p "$(dirname "$out")"
  tar -C "$work/img" --owner=0 --group=0 --numeric-owner --mtime=@0 --sort=name -cf "$out.tmp" . || return 1
  mv "$out.tmp" "$out"
  echo "$out: $name ($(du -h "$out" | cut -f1), manifest sha256:$man_d)"
}
