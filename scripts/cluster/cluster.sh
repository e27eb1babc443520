# The single-node cluster of scripts/cluster/up: names, paths and helpers shared by up, down,
# e2e, checks and the kubectl/exec wrappers. Source it; set WEFT_CLUSTER first for a cluster
# other than the default one.
#
# Everything one cluster makes carries its name, so two clusters (a developer's and a CI run's)
# and the rest of the team's tests never meet:
#   netns            weft-<name> (the node) and weft-<name>-up (its uplink's other end)
#   mount namespace  bound at $CL_STATE/ns/mnt: every component runs inside it, where /run, /sys,
#                    /sys/fs/bpf, /var/log and the CNI, kubelet and Weft directories are the
#                    node's own (scripts/cluster/mounts.sh); nothing is written to the host's
#   state            /var/lib/weft-cluster/<name> (certificates, configs, data, logs, pid files)
#   cgroups          /weft-<name> under every cgroup v1 controller (the kubelet's cgroupRoot)

set -uo pipefail

CL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CL_NAME=${WEFT_CLUSTER:-k1}
case $CL_NAME in
  *[!a-z0-9]* | "" | ??????????*)
    echo "cluster: WEFT_CLUSTER=\"$CL_NAME\" is not a valid cluster name: 1-9 characters of a-z and 0-9" >&2
    exit 2 ;;
esac
CL_NETNS=weft-$CL_NAME
CL_UPNS=weft-$CL_NAME-up
CL_NODE=weft-$CL_NAME                 # the Node's name
CL_STATE=/var/lib/weft-cluster/$CL_NAME
CL_MNTNS=$CL_STATE/ns/mnt
CL_CGROUP=/weft-$CL_NAME
CL_PIDS=$CL_STATE/pids
CL_LOGS=$CL_STATE/logs
CL_PKI=$CL_STATE/pki
CL_CONF=$CL_STATE/conf
CL_NODEFS=$CL_STATE/node              # what the node sees at /etc/cni/net.d, /opt/cni/bin, ...

# Addresses, all inside the node's netns: the node on its uplink, pods from the controller
# manager's allocation, Services from the API server's range.
CL_NODE_IP=192.168.77.2
CL_GW_IP=192.168.77.1
CL_CLUSTER_CIDR=10.244.0.0/16
CL_NODE_CIDR_MASK=24
CL_SERVICE_CIDR=10.96.0.0/16
CL_API_SVC_IP=10.96.0.1
CL_DNS_IP=10.96.0.10
CL_API=https://$CL_NODE_IP:6443
CL_CONTAINERD_SOCK=$CL_STATE/containerd/containerd.sock
CL_ADMIN_KUBECONFIG=$CL_CONF/admin.kubeconfig

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

# in_node CMD...: runs CMD in the node (its netns and mount namespace).
in_node() { nsenter --mount="$CL_MNTNS" --net="/run/netns/$CL_NETNS" --wd="$PWD" -- "$@"; }

# kc ARGS...: kubectl as the cluster's admin, from inside the node.
kc() { in_node "$CLUSTER_BIN/kubectl" --kubeconfig "$CL_ADMIN_KUBECONFIG" "$@"; }

# cl_exists: the state dir or the netns exists (a running cluster, or one left by a failure).
cl_exists() { [ -d "$CL_STATE" ] || [ -e "/run/netns/$CL_NETNS" ] || [ -e "/run/netns/$CL_UPNS" ]; }

# cl_start NAME CMD...: starts CMD in the node, detached (own session, stdin /dev/null), its
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
# process is in the node's netns), else nothing and status 1.
cl_pid() {
  local f=$CL_PIDS/$1.pid pid
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  [ "$(readlink "/proc/$pid/ns/net" 2>/dev/null)" = "$(cl_netns_id)" ] || return 1
  echo "$pid"
}

# The node netns's identity (net:[inode]) as /proc/PID/ns/net shows it.
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
