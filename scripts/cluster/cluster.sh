# The cluster of scripts/cluster/up (one node, or up to three with --nodes): names, paths and
# helpers shared by up, down, e2e, checks and the kubectl/exec wrappers. Source it; set
# WEFT_CLUSTER first for a cluster other than the default one.
#
# Everything one cluster makes carries its name, so two clusters (a developer's and a CI run's)
# and the rest of the team's tests never meet. Node 1 (weft-<name>) holds the control plane;
# nodes 2 and 3 (weft-<name>-2, weft-<name>-3) are workers. Per node I:
#   netns            weft-<name> (node 1), weft-<name>-I (workers); weft-<name>-up is the uplink's
#                    other end (with several nodes: the underlay bridge br0 joining every eth0)
#   mount namespace  bound at <node state>/ns/mnt: every component of the node runs inside it,
#                    where /run, /sys, /sys/fs/bpf, /var/log and the CNI, kubelet and Weft
#                    directories are the node's own (scripts/cluster/node-mounts); nothing is
#                    written to the host's
#   state            node 1: /var/lib/weft-cluster/<name> (the cluster's: certificates, configs,
#                    etcd, logs, pid files, the node count in `node-count`); workers: its nodes/I/
#   cgroups          /weft-<name> (node 1), /weft-<name>-I (workers) under every cgroup v1
#                    controller (each kubelet's cgroupRoot)
# cl_use_node I selects node I for the per-node variables below (CL_NODE, CL_NETNS, CL_MNTNS,
# CL_NODE_IP, CL_NSTATE, CL_PIDS, CL_LOGS, CL_PKI, CL_CONF, CL_NODEFS, CL_CGROUP,
# CL_CONTAINERD_SOCK); node 1 is selected when this file is sourced.

set -uo pipefail

CL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CL_NAME=${WEFT_CLUSTER:-k1}
case $CL_NAME in
  *[!a-z0-9]* | "" | ??????????*)
    echo "cluster: WEFT_CLUSTER=\"$CL_NAME\" is not a valid cluster name: 1-9 characters of a-z and 0-9" >&2
    exit 2 ;;
esac
CL_UPNS=weft-$CL_NAME-up
CL_STATE=/var/lib/weft-cluster/$CL_NAME
CL_MAX_NODES=3
CL_CA_PKI=$CL_STATE/pki               # the cluster's CA (node 1's pki dir); workers get ca.crt only

# cl_use_node I: node I's names and paths (I = 1 .. $CL_MAX_NODES; 1 = the control plane's).
cl_use_node() {
  local i=$1
  case $i in 1 | 2 | 3) ;; *) cl_die "no node $i: nodes are 1 to $CL_MAX_NODES" ;; esac
  CL_NODE_INDEX=$i
  if [ "$i" = 1 ]; then
    CL_NODE=weft-$CL_NAME               # the Node's name
    CL_NSTATE=$CL_STATE                 # the node's state dir
    CL_CGROUP=/weft-$CL_NAME
  else
    CL_NODE=weft-$CL_NAME-$i
    CL_NSTATE=$CL_STATE/nodes/$i
    CL_CGROUP=/weft-$CL_NAME-$i
  fi
  CL_NETNS=$CL_NODE
  CL_NODE_IP=192.168.77.$((i + 1))      # on the uplink (the underlay's /24 with several nodes)
  CL_MNTNS=$CL_NSTATE/ns/mnt
  CL_PIDS=$CL_NSTATE/pids
  CL_LOGS=$CL_NSTATE/logs
  CL_PKI=$CL_NSTATE/pki
  CL_CONF=$CL_NSTATE/conf
  CL_NODEFS=$CL_NSTATE/node             # what the node sees at /etc/cni/net.d, /opt/cni/bin, ...
  CL_CONTAINERD_SOCK=$CL_NSTATE/containerd/containerd.sock
}

# cl_node_count: the number of nodes up recorded in $CL_STATE/node-count (1 when there is none: a
# cluster made before the option, or none at all).
cl_node_count() {
  local n
  n=$(cat "$CL_STATE/node-count" 2>/dev/null)
  case $n in 1 | 2 | 3) echo "$n" ;; *) echo 1 ;; esac
}

# cl_node_index NAME-OR-INDEX: the index of a node of this cluster given as 1..3 or by its Node
# name (weft-NAME, weft-NAME-2, ...); dies naming the nodes there are otherwise.
cl_node_index() {
  local want=$1 n i
  n=$(cl_node_count)
  for i in $(seq "$n"); do
    { [ "$want" = "$i" ] || { [ "$i" = 1 ] && [ "$want" = "weft-$CL_NAME" ]; } ||
      [ "$want" = "weft-$CL_NAME-$i" ]; } && { echo "$i"; return 0; }
  done
  local names="weft-$CL_NAME"
  for i in $(seq 2 "$n"); do names="$names weft-$CL_NAME-$i"; done
  cl_die "no node $want: its nodes are $names (or 1..$n)"
}

# Addresses, all inside the nodes' netns: the nodes on their uplink, pods from the controller
# manager's allocation, Services from the API server's range. The API server listens on node
# 1's address, which every worker reaches over the underlay.
CL_GW_IP=192.168.77.1
CL_API_IP=192.168.77.2
CL_CLUSTER_CIDR=10.244.0.0/16
CL_NODE_CIDR_MASK=24
CL_SERVICE_CIDR=10.96.0.0/16
CL_API_SVC_IP=10.96.0.1
CL_DNS_IP=10.96.0.10
CL_API=https://$CL_API_IP:6443
CL_ADMIN_KUBECONFIG=$CL_STATE/conf/admin.kubeconfig
# Ports that host-network test pods listen on, kept out of each node's ephemeral range
# (net.ipv4.ip_local_reserved_ports, set by up when it makes the node's netns): the
# network-policy-api conformance fixture's centaur pod listens on 34345-34352 (its suite's fixed
# default, inside Linux's 32768-60999), and the node's own outgoing connections (kubelet, etcd,
# the API server's clients: ~240 at once on node 1) would otherwise hold one of them now and then
# ("bind: address already in use", the fixture never Ready).
CL_HOST_NETWORK_PORTS=34345-34352

cl_die() { echo "cluster $CL_NAME: $*" >&2; exit 1; }
cl_log() { printf '%s cluster %s: %s\n' "$(date +%H:%M:%S)" "$CL_NAME" "$*" >&2; }

cl_require_root() {
  [ "$(id -u)" = 0 ] || cl_die "needs root (netns, mounts, cgroups): run as root"
}

# The component binaries (scripts/cluster/build) and the image archives (scripts/cluster/images).
# Defines $CLUSTER_BIN, $CLUSTER_IMAGES and the image names ($PAUSE_IMAGE, $AGNHOST_IMAGE, ...).
cl_load_builds() {
  # shellcheck source=scripts/cluster/paths.sh
  source "$CL_ROOT/scripts/cluster/paths.sh" || cl_die "scripts/cluster/paths.sh is missing"
}
cl_load_builds
cl_use_node 1

# in_node CMD...: runs CMD in the selected node (its netns and mount namespace).
in_node() { nsenter --mount="$CL_MNTNS" --net="/run/netns/$CL_NETNS" --wd="$PWD" -- "$@"; }

# kc ARGS...: kubectl as the cluster's admin, from inside node 1 (whichever node is selected).
kc() {
  nsenter --mount="$CL_STATE/ns/mnt" --net="/run/netns/weft-$CL_NAME" --wd="$PWD" -- \
    "$CLUSTER_BIN/kubectl" --kubeconfig "$CL_ADMIN_KUBECONFIG" "$@"
}

# cl_exists: the state dir or a netns of the cluster exists (a running cluster, or one left by
# a failure).
cl_exists() {
  local i
  [ -d "$CL_STATE" ] || [ -e "/run/netns/$CL_UPNS" ] || [ -e "/run/netns/weft-$CL_NAME" ] && return 0
  for i in $(seq 2 "$CL_MAX_NODES"); do
    [ -e "/run/netns/weft-$CL_NAME-$i" ] && return 0
  done
  return 1
}

# cl_start NAME CMD...: starts CMD in the selected node, detached (own session, stdin /dev/null), its
# output in $CL_LOGS/NAME.log, its pid in $CL_PIDS/NAME.pid. nsenter execs CMD (no fork: only
# --pid makes it fork), so the pid is CMD's own.
cl_start() {
  local name=$1; shift
  mkdir -p "$CL_PIDS" "$CL_LOGS"
  setsid nsenter --mount="$CL_MNTNS" --net="/run/netns/$CL_NETNS" -- "$@" \
    </dev/null >>"$CL_LOGS/$name.log" 2>&1 &
  echo $! >"$CL_PIDS/$name.pid"
}

# cl_pid NAME: the pid of a component that is running (and is still the one we started: the
# process is in the selected node's netns), else nothing and status 1.
cl_pid() {
  local f=$CL_PIDS/$1.pid pid
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  [ "$(readlink "/proc/$pid/ns/net" 2>/dev/null)" = "$(cl_netns_id)" ] || return 1
  echo "$pid"
}

# The selected node netns's identity (net:[inode]) as /proc/PID/ns/net shows it.
cl_netns_id() {
  local ino
  ino=$(stat -L -c %i "/run/netns/$CL_NETNS" 2>/dev/null) || return 1
  echo "net:[$ino]"
}
cl_mntns_id() {
  [ "$(stat -f -c %T "$CL_MNTNS" 2>/dev/null)" = nsfs ] || return 1
  echo "mnt:[$(stat -L -c %i "$CL_MNTNS")]"
}

# cl_stop NAME [SECONDS]: SIGTERM, then SIGKILL after SECONDS (default 10).
cl_stop() {
  local name=$1 t=${2:-10} pid i
  pid=$(cl_pid "$name") || { rm -f "$CL_PIDS/$name.pid"; return 0; }
  kill "$pid" 2>/dev/null
  for i in $(seq $((t * 10))); do
    [ -d "/proc/$pid" ] || break
    sleep 0.1
  done
  [ -d "/proc/$pid" ] && kill -9 "$pid" 2>/dev/null
  rm -f "$CL_PIDS/$name.pid"
}

# wait_for SECONDS WHAT CMD...: polls CMD every half second until it succeeds.
wait_for() {
  local t=$1 what=$2 i; shift 2
  for i in $(seq $((t * 2))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  "$@" >/dev/null 2>&1 && return 0
  cl_log "gave up after ${t}s waiting for $what"
  return 1
}

# cl_start_apiserver: kube-apiserver on node 1 (selects node 1), as up starts it (also after a
# stop: scripts/cluster/checks.d/faults.sh).
cl_start_apiserver() {
  cl_use_node 1
  local p=$CL_PKI
  cl_start kube-apiserver "$CLUSTER_BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --advertise-address="$CL_NODE_IP" --bind-address=0.0.0.0 --secure-port=6443 \
    --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
    --client-ca-file="$p/ca.crt" \
    --kubelet-client-certificate="$p/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$p/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$p/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --service-cluster-ip-range="$CL_SERVICE_CIDR" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --requestheader-client-ca-file="$p/front-proxy-ca.crt" \
    --requestheader-allowed-names=front-proxy-client --requestheader-username-headers=X-Remote-User \
    --requestheader-group-headers=X-Remote-Group --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$p/front-proxy-client.crt" --proxy-client-key-file="$p/front-proxy-client.key" \
    --allow-privileged=true --profiling=false
}

# cl_start_kubelet: the selected node's kubelet, as up starts it.
cl_start_kubelet() {
  cl_start kubelet "$CLUSTER_BIN/kubelet" --config="$CL_CONF/kubelet.yaml" \
    --kubeconfig="$CL_CONF/kubelet.kubeconfig" --hostname-override="$CL_NODE" \
    --node-ip="$CL_NODE_IP" --v=2
}

# cl_import_image FILE NAME: imports the image archive FILE into the selected node's containerd
# (namespace k8s.io, as up does) and checks NAME is there.
cl_import_image() {
  local f=$1 name=$2 out
  out=$(in_node "$CLUSTER_BIN/ctr" --address "$CL_CONTAINERD_SOCK" -n k8s.io images import \
    --snapshotter overlayfs "$f" 2>&1) ||
    { echo "ctr images import $f failed on $CL_NODE: $out" >&2; return 1; }
  in_node "$CLUSTER_BIN/ctr" --address "$CL_CONTAINERD_SOCK" -n k8s.io images ls -q 2>/dev/null |
    grep -x "$name" >/dev/null ||
    { echo "image $name is not in the containerd of $CL_NODE after importing $f" >&2; return 1; }
}
