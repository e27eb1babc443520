# Faults of a cluster of several nodes (issue 30, item 5), sourced by checks; skipped on one node.
# Pods, per node I (J the other node): srvI (app=fa-srv, selected by a NetworkPolicy admitting
# role=allowed only) and openI (app=fa-open, selected by none), netexec servers; probers
# (scripts/cluster/probers.sh) okI (role=allowed, probing srvJ, and ok1 also srv1 on its own
# node) and noI (role=denied, probing srvJ and openJ in turn: openJ answering is the positive
# control of every drop). Each fault is judged by the probers' log over its time window:
#   api        the API server stopped for a while, then started again: allowed answered,
#              denied dropped throughout (nothing needs the API server to forward or enforce);
#              after it returns a new NetworkPolicy is enforced on both nodes
#   partition  node 2 cut from the API server (its traffic to and from 192.168.77.2:6443
#              dropped by a netfilter rule in node 2's own netns; the API server still reaches
#              the kubelet, so kubectl exec and logs keep working): traffic and policy in force
#              keep working on both sides; a NetworkPolicy change made meanwhile is enforced on
#              node 1 at once and not on node 2 (it cannot know), then on node 2 once the
#              partition is lifted (converges)
#   node       node 2's kubelet stopped and its manager killed: node 1's pods keep talking to
#              each other (and node 2's pods keep answering: its datapath stays); its Node
#              deleted: node 1's route to its pod CIDR and node 1's ipcache entries of its pods
#              go; the kubelet started again: the Node registers again, its manager comes back
#              and cross-node traffic works again, both ways, with a new pod
# Everything stopped is started again and the netfilter rule removed, also on failure (the
# checks' EXIT trap runs CK_RESTORE).
# shellcheck shell=bash
source "$CL_ROOT/scripts/cluster/probers.sh"
FA_NODES=$(cl_node_count)
if [ "$FA_NODES" -lt 2 ]; then
  echo "  skip faults: cluster $CL_NAME has $FA_NODES node; the faults need several: scripts/cluster/up --nodes 2"
  return 0
fi
F=wck-fa
N1=$(ck_node 1) N2=$(ck_node 2)
# The partition's rules, in node 2's netns (the cluster's own, never the host's).
FA_RULES=("OUTPUT -d $CL_API_IP -p tcp --dport 6443 -j DROP" "INPUT -s $CL_API_IP -p tcp --sport 6443 -j DROP")
fa_unpartition() {
  local r
  for r in "${FA_RULES[@]}"; do
    # shellcheck disable=SC2086
    while ip netns exec "$N2" iptables -w -D $r 2>/dev/null; do :; done
  done
  return 0
}
fa_restart_kubelet2() { cl_use_node 2; cl_pid kubelet >/dev/null || cl_start_kubelet; cl_use_node 1; }
fa_restart_apiserver() { cl_use_node 1; cl_pid kube-apiserver >/dev/null || cl_start_apiserver; wait_for 90 "the API server" kc get --raw /readyz; }
CK_RESTORE+=("fa_unpartition" "fa_restart_apiserver" "fa_restart_kubelet2")
CK_RESTORE+=("kc delete namespace $F --ignore-not-found --wait=true --timeout=120s")
pr_fixture "$F" fa own
check "servers and probers Ready on both nodes (srv1 $SRV1, srv2 $SRV2)" pr_ready "$F"
check "before the faults: no1 ($N1) reaches open2, is dropped at srv2" eval \
  'within 20 reaches "$F" no1 "$OPEN2" 8080 && within 20 dropped "$F" no1 "$SRV2" 8080'
check "before the faults: no2 ($N2) reaches open1, is dropped at srv1" eval \
  'within 20 reaches "$F" no2 "$OPEN1" 8080 && within 20 dropped "$F" no2 "$SRV1" 8080'
check "before the faults: ok1 reaches srv2 and srv1, ok2 reaches srv1" eval \
  'within 20 reaches "$F" ok1 "$SRV2" 8080 && reaches "$F" ok1 "$SRV1" 8080 && within 20 reaches "$F" ok2 "$SRV1" 8080'
check "probers started" pr_go "$F" ok1 ok2 no1 no2
sleep 3
# fa_logs: the probers' logs so far, in $CL_LOGS/faults-POD.log (a pod gone keeps its last copy).
fa_logs() { local p; for p in ok1 ok2 no1 no2; do pr_log "$F" "$p" >"$CL_LOGS/faults-$p.log.new" 2>/dev/null && [ -s "$CL_LOGS/faults-$p.log.new" ] && mv "$CL_LOGS/faults-$p.log.new" "$CL_LOGS/faults-$p.log"; rm -f "$CL_LOGS/faults-$p.log.new"; done; return 0; }
# fa_window WHAT FROM TO: the probers' verdicts in [FROM, TO).
fa_window() {
  local what=$1 a=$2 b=$3 L=$CL_LOGS/faults
  echo "   ($what: $(($3 - $2)) s, $(pr_count "$L-ok2.log" "$a" "$b") requests from ok2)"
  check "$what: ok1 ($N1) -> srv2 ($N2): every request answered" pr_judge "$L-ok1.log" "$SRV2:8080" 0 "$a" "$b"
  check "$what: ok1 ($N1) -> srv1 ($N1): every request answered" pr_judge "$L-ok1.log" "$SRV1:8080" 0 "$a" "$b"
  check "$what: ok2 ($N2) -> srv1 ($N1): every request answered" pr_judge "$L-ok2.log" "$SRV1:8080" 0 "$a" "$b"
  check "$what: no1 ($N1) -> open2: every request answered (control)" pr_judge "$L-no1.log" "$OPEN2:8080" 0 "$a" "$b"
  check "$what: no2 ($N2) -> open1: every request answered (control)" pr_judge "$L-no2.log" "$OPEN1:8080" 0 "$a" "$b"
  check "$what: no1 ($N1) -> srv2 ($N2): every request dropped" pr_judge "$L-no1.log" "$SRV2:8080" 28 "$a" "$b"
  check "$what: no2 ($N2) -> srv1 ($N1): every request dropped" pr_judge "$L-no2.log" "$SRV1:8080" 28 "$a" "$b"
}

echo "  -- the API server stopped and started"
T0=$(date +%s)
cl_use_node 1
cl_stop kube-apiserver 10
api_down() { ! kc get --raw /readyz >/dev/null 2>&1; }
check "kube-apiserver stopped (the API does not answer)" api_down
sleep 20
T1=$(date +%s)
cl_start_apiserver
check "kube-apiserver started again and ready" wait_for 90 "the API server" kc get --raw /readyz

fa_logs
fa_window "API server down" "$T0" "$T1"
# A new policy after the restart, on both nodes: the open servers admit role=allowed only.
kc apply -f - >/dev/null <<EOT
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: open-from-allowed, namespace: $F}
spec:
  podSelector: {matchLabels: {app: fa-open}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {role: allowed}}
EOT
T3=$(date +%s)
# Both nodes polled at once from the apply; each one's delay is printed.
fa_enforced() { # CLIENT TARGET-IP: seconds from the apply until CLIENT is dropped at TARGET-IP
  local end=$((T3 + 60))
  while [ "$(date +%s)" -lt "$end" ]; do
    if dropped "$F" "$1" "$2" 8080 >/dev/null 2>&1; then echo "$(($(date +%s) - T3))"; return 0; fi
    sleep 1
  done
  dropped "$F" "$1" "$2" 8080 || return 1
  echo "$(($(date +%s) - T3))"
}
fa_enforced no1 "$OPEN2" >"$CL_LOGS/faults-enforced2" 2>&1 &
fa_e2=$!
fa_enforced no2 "$OPEN1" >"$CL_LOGS/faults-enforced1" 2>&1 &
fa_e1=$!
wait "$fa_e2"; r2=$?
wait "$fa_e1"; r1=$?
if [ "$r2" = 0 ]; then
  ck_pass "after the restart a new NetworkPolicy is enforced on $N2 within 60 s ($(tail -1 "$CL_LOGS/faults-enforced2") s): no1 ($N1) dropped at open2"
else
  ck_fail "after the restart a new NetworkPolicy is enforced on $N2 within 60 s: no1 ($N1) dropped at open2" "$(cat "$CL_LOGS/faults-enforced2")"
fi
if [ "$r1" = 0 ]; then
  ck_pass "... and on $N1 within 60 s ($(tail -1 "$CL_LOGS/faults-enforced1") s): no2 ($N2) dropped at open1"
else
  ck_fail "... and on $N1 within 60 s: no2 ($N2) dropped at open1" "$(cat "$CL_LOGS/faults-enforced1")"
fi
check "... while ok1 ($N1) still reaches open2 and ok2 ($N2) open1 (allowed by it)" eval \
  'reaches "$F" ok1 "$OPEN2" 8080 && reaches "$F" ok2 "$OPEN1" 8080'
kc -n "$F" delete networkpolicy open-from-allowed >/dev/null
check "that policy deleted: no1 reaches open2, no2 reaches open1 again" eval \
  'within 60 reaches "$F" no1 "$OPEN2" 8080 && within 60 reaches "$F" no2 "$OPEN1" 8080'


echo "  -- $N2 partitioned from the API server"
sleep 2
T5=$(date +%s)
partitioned=1
for r in "${FA_RULES[@]}"; do
  # shellcheck disable=SC2086
  ip netns exec "$N2" iptables -w -I $r || partitioned=0
done
check "netfilter rules in $N2's netns drop its traffic with $CL_API_IP:6443" test "$partitioned" = 1
kubelet2_cut() { ! ip netns exec "$N2" timeout 3 bash -c "exec 3<>/dev/tcp/$CL_API_IP/6443" 2>/dev/null; }
check "$N2 cannot connect to the API server (and node 1 can: control)" eval \
  'kubelet2_cut && ip netns exec "$N1" timeout 3 bash -c "exec 3<>/dev/tcp/$CL_API_IP/6443"'
sleep 10
# A change while partitioned: role=denied admitted by the servers too.
TP=$(date +%s)
kc apply -f - >/dev/null <<EOT
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: srv-from-denied, namespace: $F}
spec:
  podSelector: {matchLabels: {app: fa-srv}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {role: denied}}
EOT
check "partitioned: the change is enforced on $N1 at once: no2 ($N2) reaches srv1" within 30 reaches "$F" no2 "$SRV1" 8080
sleep 10
check "partitioned: $N2 cannot know it: no1 ($N1) is still dropped at srv2" dropped "$F" no1 "$SRV2" 8080
TL=$(date +%s)
fa_unpartition
check "partition lifted: $N2 connects to the API server again" eval '! kubelet2_cut'
check "converged: the change reaches $N2 after the partition: no1 ($N1) reaches srv2" within 120 reaches "$F" no1 "$SRV2" 8080
TC=$(date +%s)
kc -n "$F" delete networkpolicy srv-from-denied >/dev/null
check "the change deleted: no1 dropped at srv2 and no2 dropped at srv1 again" eval \
  'within 60 dropped "$F" no1 "$SRV2" 8080 && within 60 dropped "$F" no2 "$SRV1" 8080'
echo "   (converged $((TC - TL)) s after the partition was lifted)"
fa_logs
L=$CL_LOGS/faults
echo "   (partition: $((TL - T5)) s, $(pr_count "$L-ok2.log" "$T5" "$TL") requests from ok2)"
check "partition: ok1 ($N1) -> srv2 ($N2): every request answered" pr_judge "$L-ok1.log" "$SRV2:8080" 0 "$T5" "$TL"
check "partition: ok2 ($N2) -> srv1 ($N1): every request answered" pr_judge "$L-ok2.log" "$SRV1:8080" 0 "$T5" "$TL"
check "partition: no1 ($N1) -> open2: every request answered (control)" pr_judge "$L-no1.log" "$OPEN2:8080" 0 "$T5" "$TL"
check "partition: no2 ($N2) -> open1: every request answered (control)" pr_judge "$L-no2.log" "$OPEN1:8080" 0 "$T5" "$TL"
check "partition: no1 ($N1) -> srv2 ($N2, partitioned): every request dropped" pr_judge "$L-no1.log" "$SRV2:8080" 28 "$T5" "$TL"
check "partition: no2 ($N2) -> srv1 ($N1): every request dropped until the change" pr_judge "$L-no2.log" "$SRV1:8080" 28 "$T5" "$TP"

echo "  -- $N2's kubelet and manager stopped, its Node deleted, brought back"
sleep 2
T6=$(date +%s)
cl_use_node 2
cl_stop kubelet 10
kubelet_down() { ! cl_pid kubelet >/dev/null; }
check "$N2's kubelet stopped" kubelet_down
mpids=$(manager_pids)
if [ -n "$mpids" ]; then
  # shellcheck disable=SC2086
  kill $mpids
  gone() { [ -z "$(manager_pids)" ]; }
  check "$N2's weft-manager stopped (SIGTERM to $mpids; no kubelet to restart it)" eventually 30 gone
else
  ck_fail "$N2's weft-manager: no process found in its netns"
fi
cl_use_node 1
sleep 15
check "with $N2's agents down: ok1 -> srv1 on $N1 (same node) answered" reaches "$F" ok1 "$SRV1" 8080
check "... and node 1's pods still reach $N2's pods (its datapath stays): ok1 -> srv2" reaches "$F" ok1 "$SRV2" 8080
CIDR2=$(kc get node "$N2" -o jsonpath='{.spec.podCIDR}')
route2() { ip -n "$N1" route show "$CIDR2" | grep .; }
# cached2 IP...: node 1's ipcache has an entry for one of the IPs (prints them).
ipcache1() { weftctl_ -o json map dump ipcache; }
cached2() {
  local d ip found=
  d=$(ipcache1) || { echo "$d"; return 2; }
  for ip in "$@"; do
    jq -e --arg p "$ip/32" 'any(.[]; .prefix == $p)' <<<"$d" >/dev/null && found="$found $ip"
  done
  [ -n "$found" ] && echo "in $N1's ipcache:$found"
  [ -n "$found" ]
}
not_cached2() { local out rc; out=$(cached2 "$@"); rc=$?; [ "$rc" = 1 ] || { echo "${out:-no dump}"; return 1; }; }
no_route2() { ! route2 >/dev/null || { echo "$N1: $(route2)"; return 1; }; }
check "before the Node's deletion: $N1 routes $CIDR2 ($N2's pod CIDR) (control)" route2
check "before the Node's deletion: $N1's ipcache has $N2's pods (control)" cached2 "$SRV2" "$OPEN2"
TD=$(date +%s)
kc delete node "$N2" --wait=true --timeout=60s >/dev/null
# stays CMD...: CMD holds at three looks over two seconds (gone, and not put back).
stays() { "$@" && sleep 1 && "$@" && sleep 1 && "$@"; }
check "Node $N2 deleted: $N1's route to $CIDR2 is gone (and stays gone)" within 30 stays no_route2
check "Node $N2 deleted: $N1's ipcache entries of $N2's pods are gone (and stay gone)" within 30 stays not_cached2 "$SRV2" "$OPEN2" "$(pod_ip "$F" ok2 2>/dev/null || true)"
check "... while ok1 -> srv1 on $N1 is still answered" reaches "$F" ok1 "$SRV1" 8080
fa_logs
check "node down: ok1 ($N1) -> srv1 ($N1): every request answered" pr_judge "$L-ok1.log" "$SRV1:8080" 0 "$T6" 99999999999
check "node down: ok1 ($N1) -> srv2 ($N2): every request answered until the Node was deleted" pr_judge "$L-ok1.log" "$SRV2:8080" 0 "$T6" "$TD"
check "node down: no1 ($N1) -> srv2: every request dropped until the Node was deleted" pr_judge "$L-no1.log" "$SRV2:8080" 28 "$T6" "$TD"

# The node is dead and gone: its pods are garbage-collected (the Pod GC deletes pods bound to a
# Node that no longer exists), their WeftEndpoints with them; then the machine comes back.
no_pods2() { local p; p=$(kc get pods -A --field-selector "spec.nodeName=$N2" -o name 2>&1); [ -z "$p" ] || { echo "$p"; return 1; }; }
check "the Pod GC deletes $N2's pods (their Node is gone)" within 150 no_pods2
no_weps2() { local w; w=$(kc get wep -A -l "weft.io/node=$N2" -o name 2>&1); [ -z "$w" ] || { echo "$w"; return 1; }; }
check "... and their WeftEndpoints go with them" within 60 no_weps2
TB=$(date +%s)
fa_restart_kubelet2
n2_ready() { [ "$(kc get node "$N2" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
check "$N2's kubelet started again: the Node registers and turns Ready" within 120 n2_ready
# ds_all: a ready weft pod on every node (else the last line of the log of node 2's manager).
ds_all() {
  [ "$(kc -n kube-system get ds weft -o jsonpath='{.status.numberReady}')" = "$FA_NODES" ] && return 0
  local p
  p=$(kc -n kube-system get pods -l k8s-app=weft --field-selector "spec.nodeName=$N2" -o jsonpath='{.items[0].metadata.name}')
  echo "weft pod on $N2: ${p:-none}: $(kc -n kube-system logs "$p" -c weft-manager --tail 1 2>&1 | cut -c1-600)"
  return 1
}
CIDR2=$(kc get node "$N2" -o jsonpath='{.spec.podCIDR}')
check "$N1 routes $N2's pod CIDR ($CIDR2, given to the Node registered again) again" within 60 route2
fa_before=$CK_FAILED
check "the weft DaemonSet is ready on all $FA_NODES nodes again (its manager on $N2 running)" within 120 ds_all
if [ "$CK_FAILED" != "$fa_before" ]; then
  ck_fail "$N2 back: cross-node traffic to its new pods not judged (no manager on $N2: above)"
else
  {
    pr_server "$F" back2 "$N2" "app: fa-srv, role: allowed"
    pr_server "$F" bopen2 "$N2" "app: fa-open"
  } | kc apply -f - >/dev/null
  back_ready() { kc -n "$F" wait --for=condition=Ready pod/back2 pod/bopen2 --timeout=120s >/dev/null; }
  check "new pods on $N2 are Ready" back_ready
  BACK2=$(pod_ip "$F" back2) BOPEN2=$(pod_ip "$F" bopen2)
  check "cross-node again: no1 ($N1) reaches bopen2 ($BOPEN2 on $N2, selected by no policy)" within 60 reaches "$F" no1 "$BOPEN2" 8080
  check "cross-node again: ok1 ($N1, role=allowed) reaches back2 ($BACK2 on $N2, app=fa-srv)" within 60 reaches "$F" ok1 "$BACK2" 8080
  check "cross-node again, policy in force on $N2: no1 ($N1, role=denied) dropped at back2" within 30 dropped "$F" no1 "$BACK2" 8080
  check "cross-node again: back2 ($N2, role=allowed) reaches srv1 ($N1) through its policy" within 60 reaches "$F" back2 "$SRV1" 8080
  echo "   ($N2 back: Ready and its manager serving $(( $(date +%s) - TB )) s after its kubelet started)"
  fa_verified() { local out; out=$(weftctl_on_node "$1" map verify 2>&1) && grep -q consistent <<<"$out" || { echo "$out"; return 1; }; }
  weftctl_on_node() { local n=$1 p; shift; p=$(kc -n kube-system get pods -l k8s-app=weft --field-selector "spec.nodeName=$n" -o jsonpath='{.items[0].metadata.name}'); [ -n "$p" ] || { echo "no weft pod on $n"; return 1; }; kc -n kube-system exec "$p" -c weft-manager -- /usr/local/bin/weftctl "$@"; }
  check "$N1: weftctl map verify says consistent after it all" within 30 fa_verified "$N1"
  check "$N2: weftctl map verify says consistent after it all" within 30 fa_verified "$N2"
fi
kc delete namespace "$F" --wait=false >/dev/null 2>&1
