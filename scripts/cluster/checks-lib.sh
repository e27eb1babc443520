# Helpers of scripts/cluster/checks (sourced after cluster.sh): counting, pods, probes, and the
# test namespaces wck-a (label team=blue) and wck-b (team=red) with their pods:
#   wck-a/web       app=web, agnhost netexec on 8080 (port name "http") and 8081 ("other")
#   wck-a/client    role=client  (agnhost pause; probes run in it with `agnhost connect`)
#   wck-b/client    role=client
#   wck-b/intruder  role=intruder

CK_PASSED=0
CK_FAILED=0
CK_NS_A=wck-a
CK_NS_B=wck-b
CK_RESTORE=()   # commands ck_cleanup runs (undo of what a group changed in the cluster)

ck_pass() { CK_PASSED=$((CK_PASSED + 1)); echo "  ok   $1"; }
ck_fail() {
  CK_FAILED=$((CK_FAILED + 1)); echo "  FAIL $1"
  [ -n "${2:-}" ] && printf '%s\n' "$2" | tail -15 | sed 's/^/       /'
  return 0
}
# check DESCRIPTION CMD...: passes when CMD succeeds (its output is shown when it fails).
check() {
  local desc=$1 out; shift
  if out=$("$@" 2>&1); then ck_pass "$desc"; else ck_fail "$desc" "$out"; fi
}
ck_summary() {
  echo "checks: $CK_PASSED passed, $CK_FAILED failed"
  [ "$CK_FAILED" = 0 ]
}

# within SECONDS CMD...: CMD succeeds before SECONDS have passed (a deadline, not a count of
# attempts: a probe that times out takes seconds itself); the last attempt's output otherwise.
within() {
  local end=$(($(date +%s) + $1)); shift
  while [ "$(date +%s)" -lt "$end" ]; do
    "$@" >/dev/null 2>&1 && return 0
    sleep 1
  done
  "$@"
}

# ck_node I: the name of node I of the cluster (1: the control plane's).
ck_node() { if [ "$1" = 1 ]; then echo "weft-$CL_NAME"; else echo "weft-$CL_NAME-$1"; fi; }

# eventually SECONDS CMD...: CMD succeeds within SECONDS (polled every second; the last
# attempt's output is printed when it never did).
eventually() {
  local t=$1 i; shift
  for i in $(seq "$t"); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 1
  done
  "$@"
}

# The weft pod of node 1 (the only one on a single-node cluster): the one the groups look at.
weft_pods_() { kc -n kube-system get pods -l k8s-app=weft --field-selector "spec.nodeName=$CL_NODE" "$@"; }
weftctl_() { kc -n kube-system exec "$(weft_pod)" -c weft-manager -- /usr/local/bin/weftctl "$@"; }
pod_ip() { kc -n "$1" get pod "$2" -o jsonpath='{.status.podIP}'; }
weft_pod() { weft_pods_ -o jsonpath='{.items[0].metadata.name}'; }
weft_restarts() { weft_pods_ -o jsonpath='{.items[0].status.containerStatuses[0].restartCount}'; }
weft_ready() { [ "$(weft_pods_ -o jsonpath='{.items[0].status.containerStatuses[0].ready}')" = true ]; }
weft_log() { kc -n kube-system logs "$(weft_pod)" -c weft-manager "$@"; }
node_ready() { kc get node "$CL_NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'; }
node_ready_msg() { kc get node "$CL_NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].message}'; }

# connect NS POD IP PORT [tcp|udp]: one `agnhost connect` from the pod; prints ok, TIMEOUT (what
# a policy drop looks like), REFUSED, or what went wrong when the probe itself failed.
connect() {
  local ns=$1 pod=$2 ip=$3 port=$4 proto=${5:-tcp} out
  if out=$(kc -n "$ns" exec "$pod" -- /agnhost connect "$ip:$port" --timeout=2s --protocol="$proto" 2>&1); then
    echo ok
  elif grep -qx TIMEOUT <<<"$out" || grep -qE '^TIMEOUT: read udp .*i/o timeout$' <<<"$out"; then
    # TCP: the SYN went unanswered; UDP: the datagram's answer never came.
    echo TIMEOUT
  elif grep -qx REFUSED <<<"$out"; then
    echo REFUSED
  else
    echo "probe error: $out"
  fi
}
# reaches NS POD IP PORT: the connection is made.
reaches() { local r; r=$(connect "$@"); [ "$r" = ok ] || { echo "$1/$2 -> $3:$4: $r"; return 1; }; }
# dropped NS POD IP PORT: the connection times out (a drop), not refused and not a probe error.
dropped() { local r; r=$(connect "$@"); [ "$r" = TIMEOUT ] || { echo "$1/$2 -> $3:$4: $r (expected a drop: TIMEOUT)"; return 1; }; }

# The manager's process on the node: in the node's netns, running weft-manager.
manager_pids() {
  local p n
  n=$(cl_netns_id)
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/net" 2>/dev/null)" = "$n" ] || continue
    [ "$(basename "$(readlink "$p/exe" 2>/dev/null)")" = weft-manager ] && echo "${p#/proc/}"
  done
}

# The Weft endpoint of pod NS/NAME (JSON), from the manager's API in the DaemonSet's pod.
endpoint_of() {
  weftctl_ -o json endpoint list | jq -ce --arg ns "$1" --arg p "$2" \
    '[.[] | select(.pod_namespace == $ns and .pod_name == $p)] | if length == 1 then .[0] else error("\(length) endpoints for \($ns)/\($p)") end'
}
# has_label NS POD KEY VALUE: the pod's endpoint carries KEY=VALUE (KEY with its source, k8s:...).
has_label() {
  local ep
  ep=$(endpoint_of "$1" "$2") || return 1
  jq -e --arg k "$3" --arg v "$4" 'any(.labels[]; .key == $k and .value == $v)' <<<"$ep" >/dev/null ||
    { echo "labels of $1/$2: $(jq -c '[.labels[] | .key + "=" + .value]' <<<"$ep")"; return 1; }
}
lacks_label_key() {
  local ep
  ep=$(endpoint_of "$1" "$2") || return 1
  ! jq -e --arg k "$3" 'any(.labels[]; .key == $k)' <<<"$ep" >/dev/null ||
    { echo "labels of $1/$2: $(jq -c '[.labels[] | .key + "=" + .value]' <<<"$ep")"; return 1; }
}

# ck_pin: on a cluster of several nodes, "  nodeName: <node 1>" for a pod spec (the groups other
# than multinode judge one node's datapath); nothing on one node.
ck_pin() { [ "$(cl_node_count)" -gt 1 ] && echo "  nodeName: $CL_NODE"; return 0; }
ck_pods_yaml() {
  local img=$AGNHOST_IMAGE
  cat <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $CK_NS_A, labels: {team: blue}}
---
apiVersion: v1
kind: Namespace
metadata: {name: $CK_NS_B, labels: {team: red}}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: $CK_NS_A, labels: {app: web}}
spec:
$(ck_pin)
  terminationGracePeriodSeconds: 1
  containers:
  - name: http
    image: $img
    args: [netexec, --http-port=8080, --udp-port=9080]
    ports: [{name: http, containerPort: 8080}]
  - name: other
    image: $img
    args: [netexec, --http-port=8081, --udp-port=9081]
    ports: [{name: other, containerPort: 8081}]
EOF
  local ns pod role
  for ns_pod_role in "$CK_NS_A client client" "$CK_NS_B client client" "$CK_NS_B intruder intruder"; do
    read -r ns pod role <<<"$ns_pod_role"
    cat <<EOF
---
apiVersion: v1
kind: Pod
metadata: {name: $pod, namespace: $ns, labels: {role: $role}}
spec:
$(ck_pin)
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: $img
    args: [pause]
EOF
  done
}

ck_delete_namespaces() {
  kc delete namespace "$CK_NS_A" "$CK_NS_B" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1
}

ck_setup() {
  ck_delete_namespaces
  ck_pods_yaml | kc apply -f - >/dev/null || cl_die "cannot create the test pods"
  kc -n "$CK_NS_A" wait --for=condition=Ready pod --all --timeout=120s >/dev/null &&
    kc -n "$CK_NS_B" wait --for=condition=Ready pod --all --timeout=120s >/dev/null ||
    { kc get pods -A -o wide >&2; cl_die "the test pods did not become Ready"; }
  WEB_IP=$(pod_ip "$CK_NS_A" web)
  echo "   (test pods Ready; web is $WEB_IP)"
}

ck_cleanup() {
  local c
  for c in "${CK_RESTORE[@]}"; do eval "$c" >/dev/null 2>&1; done
  kc delete ccnp --all >/dev/null 2>&1
  ck_delete_namespaces
}
