#!/usr/bin/env bash
# The DaemonSet's image (scripts/image): built from target/release, imported into this run's own
# containerd (scripts/containerd/lib.sh) and run with `ctr run`: the image's own weft-manager,
# weftctl, weft-cni and nft start with the libraries the image carries, and they are the
# binaries of this tree.
source "$(dirname "$0")/../lib.sh"
weft_plan 8
source "$WEFT_ROOT/scripts/containerd/lib.sh"

weft_make_node
ctrd_setup
ctrd_start
archive=$WEFT_TMP/weft-image.tar
IMAGE=localhost/weft:$(sed -n 's/^version = "\(.*\)"/\1/p' "$WEFT_ROOT/Cargo.toml" | head -1)
check "scripts/image builds the archive" bash "$WEFT_ROOT/scripts/image" --no-build --out "$archive"
check "the DaemonSet names this image" grep -q "image: $IMAGE\$" "$WEFT_ROOT/conf/k8s/03-daemonset.yaml"
ctr() { command ctr --address "$CTRD_SOCK" -n k8s.io "$@"; }
check "ctr images import takes it" ctr images import --snapshotter overlayfs "$archive"
listed() { ctr images ls -q | matches -x "$IMAGE"; }
check "it is listed as $IMAGE" listed

# in_image NAME [--env K=V] CMD...: runs CMD in a fresh container NAME of the image (its own
# netns and mounts, this run's cgroup parent), removed afterwards.
in_image() {
  local name=$WEFT_P-$1 env=(); shift
  if [ "$1" = --env ]; then env=(--env "$2"); shift 2; fi
  timeout 60 /usr/bin/ctr --address "$CTRD_SOCK" -n k8s.io run --rm --snapshotter overlayfs \
    --cgroup "$CTRD_CGROUP/$name" "${env[@]}" "$IMAGE" "$name" "$@" </dev/null
}
version=$(in_image v /usr/local/bin/weft-manager --version 2>&1)
check "the image's weft-manager runs: $version" test "$version" = "$("$WEFT_BIN/weft-manager" --version)"
help=$(in_image h /usr/local/bin/weftctl --help 2>&1)
check "the image's weftctl runs" grep -q "policy" <<<"$help"
nftv=$(in_image n /usr/sbin/nft --version 2>&1)
check "the image's nft runs (masquerade): $nftv" grep -q '^nftables v' <<<"$nftv"
# (weft-cni is not run here: `ctr run` keeps its stdin open, and the plugin reads the netconf
# from stdin; the manager copies it to the host, where scripts/e2e/containerd.sh runs it.)
# The content is this tree's: the manager refuses a bad flag with this tree's message.
bad=$(in_image b /usr/local/bin/weft-manager --metrics-listen nowhere 2>&1)
check "it is this tree's build (--metrics-listen check)" grep -q -- '--metrics-listen "nowhere"' <<<"$bad"
weft_summary
