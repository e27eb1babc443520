# Shared helpers for Weft's black-box scripts (demo, e2e, benchmarks). Source it.
#
# Every run owns its world: a "node" netns where weft-manager and the host side of every veth
# live, one netns per pod, a temp dir (state, socket, logs) and a bpffs pin dir. Nothing runs in
# or changes the host's own network namespace, and `weft_cleanup` (an EXIT trap) removes it all
# even when a step fails.
#
# weft-manager and weft-cni run under `nsenter --net=...`, not `ip netns exec`: the latter also
# remounts /sys, which would hide the bpffs mount the datapath pins its maps in.

set -uo pipefail

WEFT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WEFT_BIN=${WEFT_BIN:-$WEFT_ROOT/target/release}
WEFT_PASSED=0
WEFT_FAILED=0

# A short unique prefix: netns names show up in `ip netns`, keep them recognisable.
WEFT_P=${WEFT_P:-wt$(printf '%04x' $((RANDOM ^ $$ & 0xffff)))}
WEFT_NODE=${WEFT_P}-node
WEFT_TMP=$(mktemp -d "/tmp/${WEFT_P}.XXXX")
WEFT_SOCK=$WEFT_TMP/manager.sock
WEFT_STATE=$WEFT_TMP/state
WEFT_BPFFS=/sys/fs/bpf/${WEFT_P}
WEFT_MANAGER_PID=
WEFT_PODS=()

die() { echo "FATAL: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "these tests need root (netns, veth, bpf): run as root"
for tool in ip nsenter ping nc jq; do
  command -v "$tool" >/dev/null || die "$tool is missing: run scripts/setup"
done
for b in weft-manager weft-cni weftctl; do
  [ -x "$WEFT_BIN/$b" ] || die "$WEFT_BIN/$b is missing: run cargo build --release"
done

weft_cleanup() {
  local rc=$?
  weft_stop_manager
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${WEFT_P}-" || true); do
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$WEFT_BPFFS" "$WEFT_BPFFS"-* 2>/dev/null
  if [ "$rc" != 0 ] && [ -f "$WEFT_TMP/manager.log" ]; then
    echo "--- manager log (last 30 lines) ---" >&2
    tail -30 "$WEFT_TMP/manager.log" >&2
  fi
  rm -rf "$WEFT_TMP"
  exit "$rc"
}
trap weft_cleanup EXIT
trap 'exit 130' INT TERM

in_node() { nsenter --net="/run/netns/$WEFT_NODE" "$@"; }

# weft_need_replay: dies early, before anything is set up, when weft-k8s-replay is not built.
weft_need_replay() {
  [ -x "$WEFT_BIN/weft-k8s-replay" ] ||
    die "$WEFT_BIN/weft-k8s-replay is missing: cargo build --release -p weft-k8s --features replay --bin weft-k8s-replay"
}
# weft_start_replay: weft-k8s-replay serving $WEFT_TMP/replay.json in the node netns (where the
# manager runs) as the manager's API server; sets REPLAY_PID, then REPLAY_URL once the server
# wrote $WEFT_TMP/kubeconfig. The caller's EXIT trap kills $REPLAY_PID.
weft_start_replay() {
  local _
  nsenter --net="/run/netns/$WEFT_NODE" "$WEFT_BIN/weft-k8s-replay" "$WEFT_TMP/replay.json" "$WEFT_TMP/kubeconfig" \
    >>"$WEFT_TMP/replay.log" 2>&1 &
  REPLAY_PID=$!
  for _ in $(seq 100); do [ -s "$WEFT_TMP/kubeconfig" ] && break; sleep 0.05; done
  [ -s "$WEFT_TMP/kubeconfig" ] || die "weft-k8s-replay did not start: $(cat "$WEFT_TMP/replay.log")"
  REPLAY_URL=$(awk '/server:/ {print $2}' "$WEFT_TMP/kubeconfig")
}
# replay_push PATH EVENT-JSON: into the open watch of PATH (retried while the watcher reconnects).
replay_push() {
  local i
  for i in $(seq 100); do
    in_node curl -sf -X POST --data-binary "$2" "$REPLAY_URL/replay/push?path=$1" >/dev/null && return 0
    sleep 0.1
  done
  return 1
}
in_pod() { local pod=$1; shift; ip netns exec "${WEFT_P}-$pod" "$@"; }
weftctl() { "$WEFT_BIN/weftctl" --socket "$WEFT_SOCK" "$@"; }

weft_make_node() {
  ip netns add "$WEFT_NODE" || die "cannot create netns $WEFT_NODE"
  in_node ip link set lo up
}

# weft_start_manager [extra weft-manager flags...]
weft_start_manager() {
  # A manifest names its node: --node-name would have to match it, so it is left to the manifest.
  local name=(--node-name "$WEFT_P") a
  for a in "$@"; do [ "$a" = --node-manifest ] && name=(); done
  # nsenter directly, not the in_node function: `$!` of a backgrounded function is a subshell,
  # and killing that would leave the manager running.
  nsenter --net="/run/netns/$WEFT_NODE" "$WEFT_BIN/weft-manager" --state-dir "$WEFT_STATE" --socket "$WEFT_SOCK" \
    --bpffs "$WEFT_BPFFS" "${name[@]}" "$@" >>"$WEFT_TMP/manager.log" 2>&1 &
  WEFT_MANAGER_PID=$!
  weftctl status --wait 20 >/dev/null || die "weft-manager did not become ready (log: $WEFT_TMP/manager.log)"
}

weft_stop_manager() {
  if [ -n "$WEFT_MANAGER_PID" ]; then
    kill "$WEFT_MANAGER_PID" 2>/dev/null
    wait "$WEFT_MANAGER_PID" 2>/dev/null
    WEFT_MANAGER_PID=
  fi
}

weft_kill9_manager() {
  if [ -n "$WEFT_MANAGER_PID" ]; then
    kill -9 "$WEFT_MANAGER_PID" 2>/dev/null
    wait "$WEFT_MANAGER_PID" 2>/dev/null
    WEFT_MANAGER_PID=
  fi
}

weft_netconf() { # [cniVersion] [labels-json-array]
  local v=${1:-1.0.0} labels=${2:-[]}
  printf '{"cniVersion":"%s","name":"weft","type":"weft","socket":"%s","logFile":"%s","args":{"cni":{"labels":%s}}}' \
    "$v" "$WEFT_SOCK" "$WEFT_TMP/cni.log" "$labels"
}

# weft_cni COMMAND CONTAINER_ID NETNS_PATH IFNAME [VAR=value...]   (netconf on stdin)
weft_cni() {
  local cmd=$1 cid=$2 netns=$3 ifname=$4; shift 4
  env CNI_COMMAND="$cmd" CNI_CONTAINERID="$cid" CNI_NETNS="$netns" CNI_IFNAME="$ifname" \
    CNI_PATH=/usr/lib/cni CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=$cid" "$@" \
    nsenter --net="/run/netns/$WEFT_NODE" "$WEFT_BIN/weft-cni"
}

# weft_add_pod NAME [labels-json-array] [cniVersion]  → prints the CNI result
weft_add_pod() {
  local pod=$1 labels=${2:-[]} v=${3:-1.0.0}
  ip netns add "${WEFT_P}-$pod" || return 1
  WEFT_PODS+=("$pod")
  weft_netconf "$v" "$labels" | weft_cni ADD "$WEFT_P-$pod" "/run/netns/${WEFT_P}-$pod" eth0
}

weft_del_pod() {
  local pod=$1
  weft_netconf | weft_cni DEL "$WEFT_P-$pod" "/run/netns/${WEFT_P}-$pod" eth0
}

# The pod's IPv4 (or IPv6 with -6) address, from inside its netns.
pod_ip() {
  local fam=-4 pod=$1
  if [ "$1" = -6 ]; then fam=-6; pod=$2; fi
  in_pod "$pod" ip -o "$fam" addr show dev eth0 scope global | awk '{print $4}' | cut -d/ -f1 | head -1
}

# check DESCRIPTION COMMAND...: records a pass or a failure (with the command's output).
# `grep -q` exits at its first match; under pipefail the writer then dies of SIGPIPE and the
# pipeline fails although the line was there (`ctr images ls` writes a line per syscall).
# `matches` reads all of its input.
matches() { grep "$@" >/dev/null; }

check() {
  local desc=$1; shift
  local _out
  if _out=$("$@" 2>&1); then
    WEFT_PASSED=$((WEFT_PASSED + 1)); echo "  ok   $desc"
  else
    WEFT_FAILED=$((WEFT_FAILED + 1)); echo "  FAIL $desc"; printf '%s\n' "$_out" | sed 's/^/       /' | tail -15
  fi
}

# eventually COMMAND...: the command succeeds within 5 s (polled; its last output is kept).
eventually() {
  local i
  for i in $(seq 50); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  "$@"
}

# check_not DESCRIPTION COMMAND...: passes when the command fails.
check_not() {
  local desc=$1; shift
  if "$@" >/dev/null 2>&1; then
    WEFT_FAILED=$((WEFT_FAILED + 1)); echo "  FAIL $desc (unexpectedly succeeded)"
  else
    WEFT_PASSED=$((WEFT_PASSED + 1)); echo "  ok   $desc"
  fi
}

ping_ok() { # SRC_NETNS_CMD... DST_IP
  local dst=${*: -1}
  "${@:1:$#-1}" ping -c1 -W2 -q "$dst" >/dev/null
}

# tcp_ok SERVER_POD|node CLIENT_POD|node DST_IP PORT : a TCP connect from client to server works.
tcp_ok() {
  local srv=$1 cli=$2 ip=$3 port=$4 fam=-4
  [[ $ip == *:* ]] && fam=-6
  local run_srv=(in_pod "$srv") run_cli=(in_pod "$cli")
  [ "$srv" = node ] && run_srv=(in_node)
  [ "$cli" = node ] && run_cli=(in_node)
  "${run_srv[@]}" timeout 5 nc "$fam" -l "$port" >/dev/null 2>&1 &
  local spid=$!
  local i
  for i in $(seq 50); do
    "${run_srv[@]}" ss -Hltn "sport = :$port" | matches . && break
    sleep 0.02
  done
  "${run_cli[@]}" nc "$fam" -z -w 2 "$ip" "$port"
  local rc=$?
  kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
  return $rc
}

# Snapshot of everything a failed CNI call must leave unchanged.
node_snapshot() {
  {
    in_node ip -o link show | awk '{print $2}' | sort
    in_node ip route show
    in_node ip -6 route show | grep -v '^fe80'
    weftctl -o json ipam list | jq -c '[.[].address] | sort'
    weftctl -o json endpoint list | jq -c '[.[].id] | sort'
  }
}

weft_summary() {
  echo "$(basename "$0"): $WEFT_PASSED passed, $WEFT_FAILED failed"
  [ "$WEFT_FAILED" = 0 ]
}
