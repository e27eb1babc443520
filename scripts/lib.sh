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
WEFT_PLANNED=
WEFT_SUMMARISED=

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
  # A script with a plan (weft_plan) that stopped before its summary (die, a signal, an exit
  # anywhere): say what ran and what did not, and fail. Scripts without a plan (demo, benches,
  # the oracle's runner, which prints its own summary) keep their exit status.
  if [ -n "$WEFT_PLANNED" ] && [ -z "$WEFT_SUMMARISED" ]; then
    weft_summary || true
    [ "$rc" = 0 ] && rc=1
  fi
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
# listening PORT NETNS_CMD...: something listens on TCP PORT in the netns the command enters.
listening() { local port=$1; shift; "$@" ss -Hltn "sport = :$port" | matches .; }

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

# check_fails DESCRIPTION PATTERN COMMAND...: the command fails *and* says why: its output
# (stdout and stderr) matches the extended regex PATTERN. A failure for another reason (a tool
# missing, a crash, a typo in the test) is a failed check, not a pass.
check_fails() {
  local desc=$1 pattern=$2; shift 2
  local _out _rc
  _out=$("$@" 2>&1); _rc=$?
  if [ "$_rc" != 0 ] && grep -Eq -- "$pattern" <<<"$_out"; then
    WEFT_PASSED=$((WEFT_PASSED + 1)); echo "  ok   $desc"
  else
    WEFT_FAILED=$((WEFT_FAILED + 1))
    if [ "$_rc" = 0 ]; then echo "  FAIL $desc (unexpectedly succeeded)"; else echo "  FAIL $desc (exit $_rc, output does not match /$pattern/)"; fi
    printf '%s\n' "$_out" | sed 's/^/       /' | tail -15
  fi
}

# Negative traffic checks. A connect that fails proves nothing by itself (no server, a wrong
# address, a missing tool, a pod without a route all fail too): a flow counts as dropped by
# policy only when
#  (a) the server is there: it listens and accepts a connection made from its own netns to the
#      same address and port (traffic to a pod's own address stays on its loopback, which no
#      policy sees: the positive control beside the probe),
#  (b) the client's connect times out (a dropped SYN), neither refused nor unreachable, and
#  (c) the datapath counted it: the policy drop counters (`weftctl map dump metrics`, reasons
#      policy-deny and policy-default, and the ClusterNetworkPolicy tiers' admin-deny and
#      baseline-deny) of the server's endpoint (ingress) or the client's (egress) grew during
#      the probe.
# The counters are read from every socket in WEFT_DROP_SOCKS (default: this run's manager):
# multi-node tests list each node's, and each pod is looked up on the node that has it.

# policy_drops POD DIRECTION: policy drops counted for the pod's endpoint in that direction,
# summed over the managers of WEFT_DROP_SOCKS that have the pod.
policy_drops() {
  local pod=$1 dir=$2 sock id n total=0 found=
  for sock in ${WEFT_DROP_SOCKS:-$WEFT_SOCK}; do
    id=$("$WEFT_BIN/weftctl" --socket "$sock" -o json endpoint list 2>/dev/null |
      jq -r --arg c "$WEFT_P-$pod" '.[] | select(.container_id == $c and .state == "ready") | .id') || continue
    [ -n "$id" ] || continue
    n=$("$WEFT_BIN/weftctl" --socket "$sock" -o json map dump metrics | jq --argjson id "$id" --arg d "$dir" \
      '[.[] | select(.endpoint_id == $id and .direction == $d and (.reason | IN("policy-deny", "policy-default", "admin-deny", "baseline-deny"))) | .packets] | add // 0') || return 1
    total=$((total + n)); found=1
  done
  [ -n "$found" ] || { echo "no manager in '${WEFT_DROP_SOCKS:-$WEFT_SOCK}' has an endpoint for pod $pod" >&2; return 1; }
  echo "$total"
}

# total_policy_drops: every policy drop the datapath of this run's manager counted (all
# endpoints, both directions).
total_policy_drops() {
  weftctl -o json map dump metrics | jq '[.[] | select(.reason | IN("policy-deny", "policy-default", "admin-deny", "baseline-deny")) | .packets] | add // 0'
}

# flow_drops SERVER CLIENT: the drops that can stop a client -> server flow (server ingress +
# client egress).
flow_drops() {
  local a b
  a=$(policy_drops "$1" ingress) && b=$(policy_drops "$2" egress) || return 1
  echo $((a + b))
}

# tcp_dropped SERVER CLIENT DST_IP PORT: TCP client -> server is dropped by policy ((a)-(c)
# above); otherwise prints what happened instead and fails.
tcp_dropped() {
  local srv=$1 cli=$2 ip=$3 port=$4 fam=-4 before after out rc spid i
  [[ $ip == *:* ]] && fam=-6
  before=$(flow_drops "$srv" "$cli") || { echo "cannot read the drop counters"; return 1; }
  # Nothing may listen there yet: a listener left by an earlier check would answer the positive
  # control for a server that did not start.
  for i in $(seq 100); do
    listening "$port" in_pod "$srv" || break
    [ "$i" = 100 ] && { echo "port $port of $srv is already in use: cannot start the probe's server"; return 1; }
    sleep 0.05
  done
  # `ip netns exec` execs timeout(1): $! is the server itself (not a subshell, as with the in_pod
  # function), so the kill below ends it.
  ip netns exec "${WEFT_P}-$srv" timeout 20 nc "$fam" -lk "$port" >/dev/null 2>&1 &
  spid=$!
  for i in $(seq 100); do
    listening "$port" in_pod "$srv" && break
    sleep 0.02
  done
  if ! in_pod "$srv" nc "$fam" -z -w 2 "$ip" "$port" >/dev/null 2>&1; then
    kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
    echo "positive control failed: $srv does not accept TCP on $ip:$port from its own netns"
    return 1
  fi
  out=$(in_pod "$cli" nc "$fam" -v -z -w 2 "$ip" "$port" 2>&1); rc=$?
  kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
  if [ "$rc" = 0 ]; then echo "$cli -> $ip:$port connected: not dropped"; return 1; fi
  if ! grep -q 'timed out' <<<"$out"; then
    echo "$cli -> $ip:$port failed, but not as a dropped SYN does (no timeout): $out"
    return 1
  fi
  after=$(flow_drops "$srv" "$cli") || { echo "cannot read the drop counters"; return 1; }
  if [ "$after" -le "$before" ]; then
    echo "$cli -> $ip:$port timed out but the datapath counted no policy drop for it (before $before, after $after): not a policy drop"
    return 1
  fi
}

# ping_dropped SRC DST DST_IP: ICMP echo src -> dst is dropped by policy: the destination
# answers its own address (positive control), the source's ping gets no reply at all (not an
# error such as "unreachable"), and the drop counters grew.
ping_dropped() {
  local src=$1 dst=$2 ip=$3 before after out rc
  before=$(flow_drops "$dst" "$src") || { echo "cannot read the drop counters"; return 1; }
  in_pod "$dst" ping -c1 -W2 -q "$ip" >/dev/null 2>&1 || { echo "positive control failed: $dst does not answer its own $ip"; return 1; }
  out=$(in_pod "$src" ping -c1 -W2 "$ip" 2>&1); rc=$?
  if [ "$rc" = 0 ]; then echo "$src -> $ip answered: not dropped"; return 1; fi
  if [ "$rc" != 1 ] || ! grep -q ' 0 received' <<<"$out" || grep -qi 'unreachable\|prohibited' <<<"$out"; then
    echo "$src -> $ip failed, but not as a dropped echo does (exit $rc): $out"
    return 1
  fi
  after=$(flow_drops "$dst" "$src") || { echo "cannot read the drop counters"; return 1; }
  [ "$after" -gt "$before" ] || { echo "no reply, but the datapath counted no policy drop (before $before, after $after)"; return 1; }
}

# check_dropped DESCRIPTION SERVER CLIENT DST_IP PORT: a check that TCP client -> server is
# dropped by policy (tcp_dropped).
check_dropped() {
  local desc=$1; shift
  check "$desc" tcp_dropped "$@"
}

ping_ok() { # SRC_NETNS_CMD... DST_IP
  local dst=${*: -1}
  "${@:1:$#-1}" ping -c1 -W2 -q "$dst" >/dev/null
}

# tcp_ok SERVER_POD|node CLIENT_POD|node DST_IP PORT : a TCP connect from client to server works.
tcp_ok() {
  local srv=$1 cli=$2 ip=$3 port=$4 fam=-4
  [[ $ip == *:* ]] && fam=-6
  # The commands in_pod and in_node run, not the functions: backgrounded, a function is a
  # subshell, and killing it would leave the listener behind to answer a later check.
  local run_srv=(ip netns exec "${WEFT_P}-$srv") run_cli=(in_pod "$cli")
  [ "$srv" = node ] && run_srv=(nsenter --net="/run/netns/$WEFT_NODE")
  [ "$cli" = node ] && run_cli=(in_node)
  local i
  # Nothing else may listen there: nc sets SO_REUSEPORT, so a second listener would share the
  # port with it, answer for it, and take (then drop, when killed) connections meant for it.
  for i in $(seq 100); do
    listening "$port" "${run_srv[@]}" || break
    [ "$i" = 100 ] && { echo "port $port of $srv is already in use: cannot start the check's server (use another port)"; return 1; }
    sleep 0.05
  done
  "${run_srv[@]}" timeout 5 nc "$fam" -l "$port" >/dev/null 2>&1 &
  local spid=$!
  for i in $(seq 50); do
    listening "$port" "${run_srv[@]}" && break
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

# weft_plan N: this script runs N checks when it runs to its end. A script that stops early (a
# `die`, a crash, a kill) would otherwise report only the checks it reached: with a plan, the
# summary (printed by weft_summary, or by the EXIT trap when the script never got there)
# counts each check that did not run as a failure and says how many there were, and a script
# whose count no longer matches its plan fails too (update the plan with the checks).
weft_plan() { WEFT_PLANNED=$1; }

weft_summary() {
  WEFT_SUMMARISED=1
  local ran=$((WEFT_PASSED + WEFT_FAILED)) missing=0 name
  name=$(basename "$0")
  if [ -n "$WEFT_PLANNED" ] && [ "$ran" -lt "$WEFT_PLANNED" ]; then
    missing=$((WEFT_PLANNED - ran))
    echo "$name: $missing of $WEFT_PLANNED planned checks did not run"
  elif [ -n "$WEFT_PLANNED" ] && [ "$ran" -gt "$WEFT_PLANNED" ]; then
    echo "$name: ran $ran checks, $WEFT_PLANNED planned: the plan (weft_plan) is out of date"
    WEFT_FAILED=$((WEFT_FAILED + 1))
  fi
  echo "$name: $WEFT_PASSED passed, $((WEFT_FAILED + missing)) failed"
  [ "$WEFT_FAILED" = 0 ] && [ "$missing" = 0 ]
}
