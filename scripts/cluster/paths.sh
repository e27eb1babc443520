# Where the test cluster's binaries and images are: source it (after scripts/cluster/versions, which
# it sources itself when that has not been done). Defines paths only; creates nothing.
#
#   $CLUSTER_BIN     every binary by its plain name: kube-apiserver kube-controller-manager
#                    kube-scheduler kubelet kube-proxy kubectl e2e.test agnhost etcd etcdctl
#                    containerd containerd-shim-runc-v2 ctr runc prometheus
#                    netpol-conformance.test netpol-conformance-1node.test agnhost-netpol
#                    (symlinks into the cache, made by scripts/cluster/build for exactly the
#                    versions in scripts/cluster/versions)
#   $CLUSTER_IMAGES  OCI image-layout tarballs made by scripts/cluster/images, one per image
#                    (pause.tar, agnhost.tar, busybox.tar, agnhost-netpol.tar), named inside as
#                    $PAUSE_IMAGE etc.: `ctr -n k8s.io images import FILE` for each
#   $CLUSTER_NETPOL_API_DIR  sigs.k8s.io/network-policy-api at $NETWORK_POLICY_API_VERSION
#                    (config/crd/..., conformance/...), read-only in the Go module cache
#
# Everything lives under $CLUSTER_CACHE (default /var/cache/weft-cluster; override with
# WEFT_CLUSTER_CACHE), outside any work tree, keyed by version, so every clone and CI run on this
# machine shares one build.
# shellcheck shell=bash

if [ -z "${KUBERNETES_VERSION:-}" ]; then
  # shellcheck source=scripts/cluster/versions
  . "$(dirname "${BASH_SOURCE[0]}")/versions"
fi
CLUSTER_CACHE=${WEFT_CLUSTER_CACHE:-/var/cache/weft-cluster}
CLUSTER_GOMODCACHE=$CLUSTER_CACHE/go/mod
CLUSTER_GOCACHE=$CLUSTER_CACHE/go/build
# One directory per built binary and version: $CLUSTER_BUILDS/<name>-<version>/<name>
CLUSTER_BUILDS=$CLUSTER_CACHE/bin
# The whole version set, e.g. k8s-v1.34.4_etcd-v3.6.16_containerd-v2.3.7
CLUSTER_SET=k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_containerd-${CONTAINERD_VERSION}
CLUSTER_BIN=$CLUSTER_CACHE/sets/$CLUSTER_SET/bin
CLUSTER_IMAGES=$CLUSTER_CACHE/sets/$CLUSTER_SET/images
CLUSTER_NETPOL_API_DIR=$CLUSTER_GOMODCACHE/sigs.k8s.io/network-policy-api@$NETWORK_POLICY_API_VERSION
export CLUSTER_CACHE CLUSTER_GOMODCACHE CLUSTER_GOCACHE CLUSTER_BUILDS CLUSTER_SET CLUSTER_BIN \
  CLUSTER_IMAGES CLUSTER_NETPOL_API_DIR
