# shellcheck shell=bash disable=SC2034  # the variables are used by the scripts that source this
# Helpers of scripts/bench-cluster (sourced after scripts/cluster/cluster.sh): the plugin in use,
# pods and their network namespaces, the probers, the daemon's process, and the RESULT lines.
# Every time is CLOCK_REALTIME in µs: bash's EPOCHREALTIME and the Python tools' time.time_ns().

BC_PY=$CL_ROOT/scripts/bench
PTP_CONF=00-bench-ptp.conflist
PTP_NET=bench-ptp
PTP_SUBNET=10.244.250.0/24        # inside the cluster CIDR, outside the Node's podCIDR
UDP_PORT=8081                     # agnhost netexec --udp-port

bc_now() { local t=${EPOCHREALTIME/./}; echo $((10#$t)); }
bc_die() { echo "bench-cluster: $*" >&2; exit 1; }
bc_log() { printf '%s bench-cluster: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# --------------------------------------------------------------------------------- RESULT lines
# result99 NAME FILE [key=value...]: `RESULT name=NAME key=value... median= p10= p90= p99= n=`
# from one number per line in FILE (nearest-rank percentiles, as bench/common.sh `result`, plus
# p99). An empty FILE prints a MISSING line instead: never a made-up figure.
result99() {
  local name=$1 file=$2
  shift 2
  if [ ! -s "$file" ]; then
    echo "MISSING name=$name $* reason=no-samples"
    return 0
  fi
  sort -g "$file" | awk -v name="$name" -v extra="$*" '{a[NR]=$1}
    function at(q,  i) { i = int(NR * q + 0.5); if (i < 1) i = 1; if (i > NR) i = NR; return a[i] }
    END {
      printf "RESULT name=%s%s median=%.4g p10=%.4g p90=%.4g p99=%.4g n=%d\n", name, (extra == "" ? "" : " " extra),
        a[int((NR+1)/2)], at(0.1), at(0.9), at(0.99), NR
    }'
}
# result_value NAME VALUE [key=value...]: one measured value (n=1).
result_value() {
  local name=$1 v=$2
  shift 2
  if [ -z "$v" ] || [ "$v" = - ]; then
    echo "MISSING name=$name $* reason=not-measured"
    return 0
  fi
  echo "RESULT name=$name $* median=$v p10=$v p90=$v p99=$v n=1"
}
missing() { local name=$1 reason=$2; shift 2; echo "MISSING name=$name $* reason=\"$reason\""; }

# ------------------------------------------------------------------------------ the node's CNI
# The reference plugins (ptp + host-local) beside Weft: Debian's containernetworking-plugins, as
# scripts/bench-cni uses them, copied into the node's CNI bin dir. Their conflist sorts before
# Weft's 05-weft.conflist, and containerd (max_conf_num = 1) loads the first one: writing it
# switches the node's new pods to ptp, removing it switches them back.
ptp_install() {
  [ -x /usr/lib/cni/ptp ] && [ -x /usr/lib/cni/host-local ] ||
    bc_die "/usr/lib/cni/ptp or host-local is missing: scripts/setup installs containernetworking-plugins"
  cp /usr/lib/cni/ptp /usr/lib/cni/host-local "$CL_NODEFS/opt-cni-bin/" || bc_die "cannot copy ptp into $CL_NODEFS/opt-cni-bin"
}
ptp_conflist() {
  jq -n --arg net "$PTP_NET" --arg sub "$PTP_SUBNET" '{cniVersion: "1.0.0", name: $net, plugins: [
    {type: "ptp", ipMasq: false, ipam: {type: "host-local", ranges: [[{subnet: $sub}]], routes: [{dst: "0.0.0.0/0"}]}}]}'
}
# The first three octets of the addresses IMPL gives pods (both ranges are /24s).
impl_prefix() {
  local cidr
  case $1 in
    ptp) cidr=$PTP_SUBNET ;;
    *) cidr=$(kc get node "$CL_NODE" -o jsonpath='{.spec.podCIDR}') ;;
  esac
  echo "${cidr%.*/*}."
}
use_impl() { # weft|ptp|cilium: the node's new pods get this plugin
  local impl=$1 f=$CL_NODEFS/etc-cni-net.d/$PTP_CONF
  case $impl in
    ptp)
      ptp_conflist >"$f.tmp" && mv "$f.tmp" "$f" || bc_die "cannot write $f" ;;
    *)
      rm -f "$f" ;;
  esac
  # containerd reloads the directory on change (fsnotify); give it a moment before the next pod.
  sleep 2
  node_is_ready || wait_for 120 "the Node to be Ready" node_is_ready || bc_die "the Node is not Ready with $impl"
}
node_is_ready() { [ "$(kc get node "$CL_NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }

# -------------------------------------------------------------------------------------- pods
ensure_ns() { # NS [label=value...]
  local ns=$1
  shift
  kc get ns "$ns" >/dev/null 2>&1 || kc create ns "$ns" >/dev/null || bc_die "cannot create namespace $ns"
  [ $# = 0 ] || kc label ns "$ns" --overwrite "$@" >/dev/null
  wait_for 60 "the default ServiceAccount in $ns" kc -n "$ns" get sa default || bc_die "no default ServiceAccount in $ns"
}
# clear_ns NS IMPL: deletes every pod of NS and waits until its plugin released them: no Weft
# endpoint of the namespace left, no host-local reservation of ptp's network left.
clear_ns() {
  local ns=$1 impl=$2
  kc -n "$ns" delete pods --all --grace-period=1 --wait=true --timeout=600s >/dev/null 2>&1 ||
    bc_die "deleting the pods of $ns did not finish: $(kc -n "$ns" get pods 2>&1 | tail -3)"
  case $impl in
    weft) wait_for 60 "Weft to release the endpoints of $ns" weft_ns_empty "$ns" ||
      bc_die "Weft still has endpoints of $ns after its pods were deleted" ;;
    ptp) wait_for 60 "host-local to release ptp's addresses" ptp_empty ||
      bc_die "host-local still holds addresses: $(ls "$CL_NODEFS/var-lib-cni/networks/$PTP_NET")" ;;
  esac
}
weftctl_node() { in_node "$CL_ROOT/target/release/weftctl" --socket /run/weft/manager.sock "$@"; }
weft_ns_empty() {
  [ "$(weftctl_node -o json endpoint list | jq --arg ns "$1" '[.[] | select(.pod_namespace == $ns)] | length')" = 0 ]
}
ptp_empty() {
  local d=$CL_NODEFS/var-lib-cni/networks/$PTP_NET
  [ ! -d "$d" ] || [ -z "$(find "$d" -maxdepth 1 -type f -name '[0-9]*' -print -quit)" ]
}
# reset_leftovers IMPL NS...: what an interrupted run left in NS (--reuse): the NetworkPolicies,
# and the pods, each deleted while the plugin that made it is the node's (a pod's DEL goes to
# the plugin of the conflist in use when it is deleted: one deleted under the other plugin would
# leave its endpoint or address behind). Ends with IMPL in use.
reset_leftovers() {
  local impl=$1 ns prefix
  shift
  prefix=$(impl_prefix ptp)
  for ns in "$@"; do
    kc get ns "$ns" >/dev/null 2>&1 || continue
    kc -n "$ns" delete networkpolicies --all >/dev/null 2>&1
    if kc -n "$ns" get pods -o json | jq -e --arg p "$prefix" 'any(.items[]; (.status.podIP // "") | startswith($p))' >/dev/null; then
      use_impl ptp
      local pods
      pods=$(kc -n "$ns" get pods -o json | jq -r --arg p "$prefix" '.items[] | select((.status.podIP // "") | startswith($p)) | .metadata.name')
      # shellcheck disable=SC2086
      kc -n "$ns" delete pod $pods --grace-period=1 --wait=true --timeout=300s >/dev/null 2>&1
    fi
  done
  use_impl "$impl"
  for ns in "$@"; do
    kc get ns "$ns" >/dev/null 2>&1 && clear_ns "$ns" "$impl"
  done
}
# pod_pid NS POD: the host pid of the pod's first container (its netns is the pod's).
pod_pid() {
  local cid pid
  cid=$(kc -n "$1" get pod "$2" -o jsonpath='{.status.containerStatuses[0].containerID}') || return 1
  cid=${cid#containerd://}
  [ -n "$cid" ] || return 1
  pid=$(in_node "$CLUSTER_BIN/ctr" --address "$CL_CONTAINERD_SOCK" -n k8s.io task ls 2>/dev/null |
    awk -v id="$cid" '$1 == id {print $2}')
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  [ "$(readlink "/proc/$pid/ns/net")" != "$(cl_netns_id)" ] || return 1 # a pod netns, not the node's
  echo "$pid"
}
in_pod_net() { local pid=$1; shift; nsenter --net="/proc/$pid/ns/net" -- "$@"; }

# daemon_pid weft|cilium: the node daemon's process (hostNetwork: in the node's netns), by its
# executable's name; exactly one, else nothing and status 1.
daemon_pid() {
  local exe p n found=()
  case $1 in weft) exe=weft-manager ;; cilium) exe=cilium-agent ;; *) return 1 ;; esac
  n=$(cl_netns_id) || return 1
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/net" 2>/dev/null)" = "$n" ] || continue
    [ "$(basename "$(readlink "$p/exe" 2>/dev/null)")" = "$exe" ] && found+=("${p#/proc/}")
  done
  [ ${#found[@]} = 1 ] || return 1
  echo "${found[0]}"
}
# daemon_metrics weft|cilium FILE: the daemon's Prometheus text (hostNetwork, port 9962).
daemon_metrics() {
  in_node curl -sf --max-time 10 http://127.0.0.1:9962/metrics >"$2"
}
daemon_ready_args() {
  case $1 in
    weft) echo "--unix /run/weft/manager.sock --path /v1/healthz" ;;
    cilium) echo "--url http://127.0.0.1:9879/healthz --header brief:true" ;;
  esac
}
# Weft's policy drops on one pod's endpoint in one direction (datapath metrics map).
weft_policy_drops() { # NS POD DIRECTION
  local id
  id=$(weftctl_node -o json endpoint list | jq -r --arg ns "$1" --arg p "$2" \
    '.[] | select(.pod_namespace == $ns and .pod_name == $p) | .id') || return 1
  [ -n "$id" ] || { echo "no Weft endpoint for $1/$2" >&2; return 1; }
  weftctl_node -o json map dump metrics | jq --argjson id "$id" --arg d "$3" \
    '[.[] | select(.endpoint_id == $id and .direction == $d and (.reason == "policy-deny" or .reason == "policy-default")) | .packets] | add // 0'
}
