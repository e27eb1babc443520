#!/usr/bin/env bash
# Three nodes through a real etcd (docs/KVSTORE.md): each node a private netns with its own
# weft-manager, state dir, socket and pin dir, joined by an underlay bridge in its own netns;
# etcd in a fourth netns on the underlay, started here and stopped at the end. Cross-node
# traffic before and after a policy on node B, label change and pod delete on A reaching B,
# and the faults: etcd down (SIGTERM) and back, etcd killed -9 and back, one node partitioned
# from etcd alone (a blackhole route in its netns; pod traffic still flows), kill -9 of a manager
# within its lease, a node gone for good. Every check "while etcd is down" is bracketed by a
# check that no node reaches etcd at that moment, and a comparison of two look-ups requires
# them non-empty (two failed look-ups are equal too).
source "$(dirname "$0")/../lib.sh"
weft_plan 71
command -v etcd >/dev/null || die "etcd is missing: run scripts/setup (etcd-server)"

TTL=10
UL=${WEFT_P}-ul
ETCD_NS=${WEFT_P}-etcd
ETCD_URL=http://10.99.0.100:2379
declare -A MGR=()

mn_cleanup() {
  for n in "${!MGR[@]}"; do
    [ -n "${MGR[$n]}" ] && kill -9 "${MGR[$n]}" 2>/dev/null && wait "${MGR[$n]}" 2>/dev/null
  done
  [ -n "${ETCD_PID:-}" ] && kill "$ETCD_PID" 2>/dev/null && wait "$ETCD_PID" 2>/dev/null
  for n in 1 2 3; do [ -f "$WEFT_TMP/n$n/manager.log" ] && [ "$1" != 0 ] && { echo "--- node $n manager log (last 15) ---" >&2; tail -15 "$WEFT_TMP/n$n/manager.log" >&2; }; done
}
trap 'rc=$?; mn_cleanup $rc; (exit $rc); weft_cleanup' EXIT

nodens() { echo "${WEFT_P}-n$1"; }
sock() { echo "$WEFT_TMP/n$1/manager.sock"; }
ctl() { local n=$1; shift; "$WEFT_BIN/weftctl" --socket "$(sock "$n")" "$@"; }
in_n() { local n=$1; shift; nsenter --net="/run/netns/$(nodens "$n")" "$@"; }

echo "== underlay, etcd, three managers"
ip netns add "$UL" || die "cannot create netns $UL"
ip -n "$UL" link add br0 type bridge && ip -n "$UL" link set br0 up && ip -n "$UL" link set lo up
plug() { # NETNS ADDR TAG
  ip -n "$UL" link add "v$3" type veth peer name ul netns "$1" || return 1
  ip -n "$UL" link set "v$3" master br0 up && ip -n "$1" link set ul up && ip -n "$1" link set lo up &&
    ip -n "$1" addr add "$2/24" dev ul
}
ip netns add "$ETCD_NS" && plug "$ETCD_NS" 10.99.0.100 e || die "cannot plug etcd into the underlay"
start_etcd() {
  nsenter --net="/run/netns/$ETCD_NS" etcd --name e1 --data-dir "$WEFT_TMP/etcd" \
    --listen-client-urls "$ETCD_URL" --advertise-client-urls "$ETCD_URL" \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster e1=http://127.0.0.1:2380 >>"$WEFT_TMP/etcd.log" 2>&1 &
  ETCD_PID=$!
  for _ in $(seq 100); do
    nsenter --net="/run/netns/$ETCD_NS" env ETCDCTL_API=3 etcdctl --endpoints "$ETCD_URL" endpoint health >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}
stop_etcd() { kill "$ETCD_PID" 2>/dev/null; wait "$ETCD_PID" 2>/dev/null; ETCD_PID=; }
start_etcd || die "etcd did not start (log: $WEFT_TMP/etcd.log)"

# A short identity grace period (default 60 s): the check that a freed identity leaves the
# other nodes sees it within seconds.
start_mgr() { # N [extra flags]
  local n=$1; shift
  mkdir -p "$WEFT_TMP/n$n"
  nsenter --net="/run/netns/$(nodens "$n")" "$WEFT_BIN/weft-manager" --state-dir "$WEFT_TMP/n$n/state" \
    --socket "$(sock "$n")" --bpffs "${WEFT_BPFFS}-n$n" --node-name "$(nodens "$n")" --pod-cidr "10.2$n.0.0/24" \
    --kvstore etcd --kvstore-endpoints "$ETCD_URL" --kvstore-lease-ttl "$TTL" --identity-grace-period 2 "$@" >>"$WEFT_TMP/n$n/manager.log" 2>&1 &
  MGR[$n]=$!
  ctl "$n" status --wait 20 >/dev/null
}
for n in 1 2 3; do
  ip netns add "$(nodens "$n")" && plug "$(nodens "$n")" "10.99.0.1$n" "$n" || die "cannot plug node $n"
done
start_mgr 1 --node-ip 10.99.0.11 || die "manager 1 did not start"
start_mgr 2 --node-ip 10.99.0.12 || die "manager 2 did not start"
start_mgr 3 || die "manager 3 did not start (underlay address detection)"

add_pod() { # NODE NAME APP → CNI output
  WEFT_NODE=$(nodens "$1") WEFT_SOCK=$(sock "$1") weft_add_pod "$2" '[{"key":"app","value":"'"$3"'"}]'
}
del_pod() { WEFT_NODE=$(nodens "$1") WEFT_SOCK=$(sock "$1") weft_del_pod "$2"; }
ep_id() { ctl "$1" -o json endpoint list | jq -r --arg c "$WEFT_P-$2" '.[] | select(.container_id == $c) | .id'; }
ident() { ctl "$1" -o json endpoint list | jq -r --arg c "$WEFT_P-$2" '.[] | select(.container_id == $c) | .identity'; }
# until SECS COMMAND...: polls (convergence is asynchronous), fails after SECS.
until_ok() { local end=$((SECONDS + $1)); shift; until "$@" >/dev/null 2>&1; do [ $SECONDS -ge $end ] && { "$@"; return 1; }; sleep 0.2; done; }
in_ipcache() { ctl "$1" -o json map dump ipcache | jq -e --arg p "$2/32" --argjson id "$3" 'any(.[]; .prefix == $p and .identity == $id)'; }
# not_in_ipcache N IP: node N's ipcache answers, holds entries (its own pods' at least), and not IP
# (a failed dump is not an absent entry).
not_in_ipcache() {
  local d
  d=$(ctl "$1" -o json map dump ipcache) || { echo "node $1: map dump ipcache failed: $d"; return 1; }
  jq -e 'length > 0' <<<"$d" >/dev/null || { echo "node $1: empty ipcache"; return 1; }
  ! jq -e --arg p "$2/32" 'any(.[]; .prefix == $p)' <<<"$d" >/dev/null || { echo "node $1 still maps $2"; return 1; }
}
# no_identity N ID: node N lists its identities (non-empty) and ID is not among them.
no_identity() {
  local d
  d=$(ctl "$1" -o json identity list) || { echo "node $1: identity list failed: $d"; return 1; }
  jq -e 'length > 0' <<<"$d" >/dev/null || { echo "node $1: no identity at all"; return 1; }
  ! jq -e --argjson id "$2" 'any(.[]; .id == $id)' <<<"$d" >/dev/null || { echo "node $1 still has identity $2"; return 1; }
}
nodes_are() { [ "$(ctl "$1" -o json node list | jq -r '[.[].name] | sort | join(" ")')" = "$2" ]; }
connected() { ctl "$1" -o json status | jq -e '.kvstore.connected == true'; }
# disconnected N: node N answers and says its kvstore is disconnected (a manager that does not
# answer is not "disconnected").
disconnected() { ctl "$1" -o json status | jq -e '.kvstore.connected == false'; }
# etcd_unreachable N: from node N's netns etcd does not answer, as an etcd that is down (or cut
# off) fails: unhealthy, not an etcdctl usage error. What "while etcd is down" checks rely on.
etcd_unreachable() {
  check_etcd_from "$1" && { echo "etcd answers node $1"; return 1; }
  grep -q "is unhealthy" "$WEFT_TMP/etcdctl.out" || { echo "etcdctl failed otherwise:"; cat "$WEFT_TMP/etcdctl.out"; return 1; }
}
check_etcd_from() { # N: etcd answers a health check from node N's netns
  in_n "$1" env ETCDCTL_API=3 timeout 10 etcdctl --endpoints "$ETCD_URL" --dial-timeout 1s --command-timeout 2s \
    endpoint health >"$WEFT_TMP/etcdctl.out" 2>&1
}
ping_from() { in_pod "$1" ping -c1 -W2 -q "$2"; }
# same A B: equal and not empty (two failed look-ups are equal too).
same() { [ -n "$1" ] && [ "$1" = "$2" ] || { echo "'$1' vs '$2'"; return 1; }; }
# Drops are counted by the node that has the pod: check_dropped looks on every node.
WEFT_DROP_SOCKS="$(sock 1) $(sock 2) $(sock 3)"

for spec in "1 a-web web" "1 a-other other" "2 b-db db" "3 c-web web" "3 c-other other"; do
  set -- $spec
  add_pod "$1" "$2" "$3" >/dev/null || die "ADD $2 on node $1 failed"
done
A_WEB=$(pod_ip a-web); A_OTHER=$(pod_ip a-other); B_DB=$(pod_ip b-db); C_WEB=$(pod_ip c-web)
WEB_ID=$(ident 1 a-web)
ALL_NODES="$(nodens 1) $(nodens 2) $(nodens 3)"
check "every node lists the three nodes" until_ok 10 eval 'nodes_are 1 "$ALL_NODES" && nodes_are 2 "$ALL_NODES" && nodes_are 3 "$ALL_NODES"'
check "node 3 found its underlay address itself" eval 'ctl 1 -o json node list | jq -e --arg n "$(nodens 3)" "any(.[]; .name == \$n and .node_ip == \"10.99.0.13\")"'
check "weftctl status: kvstore connected" connected 2
check "app=web has the same identity on nodes 1 and 3" same "$(ident 1 a-web)" "$(ident 3 c-web)"
check "identity list on B shows web as a kvstore identity" eval 'ctl 2 -o json identity list | jq -e --argjson id "$(ident 1 a-web)" "any(.[]; .id == \$id and .source == \"kvstore\")"'
check "B's ipcache maps a-web's IP to web's identity" until_ok 10 in_ipcache 2 "$A_WEB" "$(ident 1 a-web)"
check "route on A to B's pod CIDR via B's node IP (proto 196)" eval 'in_n 1 ip route show 10.22.0.0/24 proto 196 | matches "via 10.99.0.12"'

echo "== cross-node matrix, no policy"
matrix() { # expectation lines: SRC DST allow|deny (pods; a deny must be a policy drop)
  local src dst want got why bad=0 n=0
  while read -r src dst want; do
    [ -z "$src" ] && continue
    n=$((n + 1))
    if [ "$want" = deny ]; then
      if why=$(ping_dropped "$src" "$dst" "$(pod_ip "$dst")"); then got=deny; else got="not a policy drop: $why"; fi
    elif ping_from "$src" "$(pod_ip "$dst")" >/dev/null 2>&1; then got=allow; else got=deny; fi
    [ "$got" = "$want" ] || { echo "$src -> $dst: $got, want $want"; bad=1; }
  done
  [ "$n" -gt 0 ] || { echo "no expectation read"; return 1; }
  return $bad
}
check "ping all cross-node pairs" matrix <<<"a-web b-db allow
a-other b-db allow
c-web b-db allow
b-db a-web allow
b-db c-web allow
a-web c-web allow
c-web a-other allow"
check "TCP a-other -> b-db:80" tcp_ok b-db a-other "$B_DB" 80

echo "== policy on B: db accepts only app=web (from any node)"
cat >"$WEFT_TMP/db.json" <<'P'
[{"labels":[{"key":"name","value":"db-from-web"}],"endpointSelector":{"matchLabels":{"app":"db"}},
  "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"web"}}]}]}]
P
ctl 2 policy import "$WEFT_TMP/db.json" --wait >/dev/null || die "policy import on B failed"
check "after the policy" matrix <<<"a-web b-db allow
c-web b-db allow
a-other b-db deny
c-other b-db deny
b-db a-web allow
a-web c-web allow"
check "TCP a-web -> b-db:80 allowed" tcp_ok b-db a-web "$B_DB" 80
check_dropped "TCP a-other -> b-db:80 dropped" b-db a-other "$B_DB" 80

echo "== changes on A reach B"
ctl 1 endpoint labels "$(ep_id 1 a-other)" --add app=web >/dev/null || die "label change failed"
check "a-other relabelled app=web: B maps it to web's identity" until_ok 10 in_ipcache 2 "$A_OTHER" "$(ident 1 a-web)"
check "a-other (now web) -> b-db allowed" until_ok 10 ping_from a-other "$B_DB"
add_pod 1 a-tmp tmp >/dev/null || die "ADD a-tmp failed"
A_TMP=$(pod_ip a-tmp); TMP_ID=$(ident 1 a-tmp)
check "a new label set on A is known on B" until_ok 10 in_ipcache 2 "$A_TMP" "$TMP_ID"
del_pod 1 a-tmp >/dev/null
check "pod deleted on A: its IP leaves B's ipcache" until_ok 10 not_in_ipcache 2 "$A_TMP"
check "its now unused identity leaves B once A's grace period is over" until_ok 15 no_identity 2 "$TMP_ID"

echo "== masquerade: leaving the cluster with the node's address"
# An "outside" host on the underlay with no route to any pod CIDR: a pod's packet only gets an
# answer if it left with its node's address.
OUT_NS=${WEFT_P}-out
ip netns add "$OUT_NS" && plug "$OUT_NS" 10.99.0.200 o || die "cannot plug the outside host"
has_table() { local t; t=$(in_n "$1" nft list table inet weft 2>&1) && grep -q masquerade <<<"$t"; }
check "every node has its table inet weft" eval 'has_table 1 && has_table 2 && has_table 3'
exempt() { in_n "$1" nft get element inet weft exempt4 "{ $2 }" >/dev/null 2>&1; }
check "pod CIDRs of every node are exempt on A" eval 'exempt 1 10.21.0.9 && exempt 1 10.22.0.9 && exempt 1 10.23.0.9 && ! exempt 1 10.99.0.200'
check "a pod on A reaches the outside host" ping_from a-web 10.99.0.200
ip netns exec "$OUT_NS" timeout 5 nc -n -v -l 8080 >"$WEFT_TMP/outside.log" 2>&1 &
OUT_PID=$!
until_ok 5 listening 8080 ip netns exec "$OUT_NS"
in_pod a-web sh -c 'echo hi | timeout 3 nc -N 10.99.0.200 8080' >/dev/null 2>&1
wait "$OUT_PID" 2>/dev/null
check "it arrives from node A's address, not the pod's" grep -q "Connection received on 10.99.0.11 " "$WEFT_TMP/outside.log"
check "a pod on another node still sees the pod's own address (B resolves a-web by it)" tcp_ok b-db a-web "$B_DB" 80

echo "== etcd stopped"
stop_etcd
check "etcd is down: no node reaches it" eval 'etcd_unreachable 1 && etcd_unreachable 2 && etcd_unreachable 3'
check "B's status says disconnected" until_ok 15 disconnected 2
check "existing allowed traffic continues" ping_from a-web "$B_DB"
check_dropped "existing denied traffic stays denied" b-db c-other "$B_DB" 80
# The datapath needs no etcd: the checks above would pass with any kvstore code. A policy change
# during the outage does need what B learnt from etcd: the rule selects app=other, whose pods
# are all on other nodes (remote identities). Had the outage cost B them, the new rule would
# select nobody and c-other would stay dropped on 8080.
cat >"$WEFT_TMP/other.json" <<'P'
[{"labels":[{"key":"name","value":"db-from-other-8080"}],"endpointSelector":{"matchLabels":{"app":"db"}},
  "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"other"}}],"toPorts":[{"ports":[{"port":"8080","protocol":"TCP"}]}]}]}]
P
check "B imports a policy while etcd is down" ctl 2 policy import "$WEFT_TMP/other.json" --wait
check "c-other (node 3, a remote identity) -> b-db:8080 allowed by it" tcp_ok b-db c-other "$B_DB" 8080
check_dropped "c-other -> b-db:80 still dropped" b-db c-other "$B_DB" 80
out=$(add_pod 1 a-web2 web); rc=$?
check "a pod with a known label set starts" test "$rc" = 0
out=$(add_pod 1 a-new brandnew); rc=$?
check "a pod needing a new identity fails ADD with CNI code 11" eval '[ "$rc" != 0 ] && jq -e ".code == 11" <<<"$out"'
echo "$out" | jq -r .msg 2>/dev/null | sed 's/^/       /'
WEFT_NODE=$(nodens 1) WEFT_SOCK=$(sock 1) weft_netconf | WEFT_NODE=$(nodens 1) weft_cni DEL "$WEFT_P-a-new" "/run/netns/${WEFT_P}-a-new" eth0 >/dev/null 2>&1
ip netns del "${WEFT_P}-a-new" 2>/dev/null
kill -9 "${MGR[2]}"; wait "${MGR[2]}" 2>/dev/null; MGR[2]=
start_mgr 2 --node-ip 10.99.0.12 || die "manager 2 did not restart while etcd is down"
check "B restarted while etcd is down keeps A's ipcache entries" in_ipcache 2 "$A_WEB" "$WEB_ID"
check "and its policy still admits web pods of A (remote identity kept)" ping_from a-web "$B_DB"
check_dropped "and still drops other pods" b-db c-other "$B_DB" 80
check "and the rule imported during the outage still admits c-other:8080" tcp_ok b-db c-other "$B_DB" 8080
check "etcd was down throughout (B still disconnected, etcd unreachable)" eval 'disconnected 2 && etcd_unreachable 2'

echo "== etcd back"
start_etcd || die "etcd did not restart"
check "etcd answers every node again" eval 'check_etcd_from 1 && check_etcd_from 2 && check_etcd_from 3'
check "every node reconnects without a restart" until_ok 20 eval 'connected 1 && connected 2 && connected 3'
A_WEB2=$(pod_ip a-web2)
check "the pod added during the outage reaches B's ipcache" until_ok 15 in_ipcache 2 "$A_WEB2" "$(ident 1 a-web)"
check "a pod with a new label set starts now" add_pod 1 a-new2 brandnew

echo "== etcd killed -9"
connected_all() { connected 1 && connected 2 && connected 3; }
kill -9 "$ETCD_PID"; wait "$ETCD_PID" 2>/dev/null; ETCD_PID=
check "etcd is gone: no node reaches it" eval 'etcd_unreachable 1 && etcd_unreachable 2 && etcd_unreachable 3'
check "every node notices (disconnected)" until_ok 15 eval 'disconnected 1 && disconnected 2 && disconnected 3'
check "allowed traffic continues" ping_from a-web "$B_DB"
check_dropped "denied traffic stays denied" b-db c-other "$B_DB" 80
out=$(add_pod 1 a-web3 web); rc=$?
check "a pod with a known label set starts" test "$rc" = 0
out=$(add_pod 1 a-new3 brandnew3); rc=$?
check "a pod needing a new identity fails ADD with CNI code 11" eval '[ "$rc" != 0 ] && jq -e ".code == 11" <<<"$out"'
WEFT_NODE=$(nodens 1) WEFT_SOCK=$(sock 1) weft_netconf | WEFT_NODE=$(nodens 1) weft_cni DEL "$WEFT_P-a-new3" "/run/netns/${WEFT_P}-a-new3" eth0 >/dev/null 2>&1
ip netns del "${WEFT_P}-a-new3" 2>/dev/null
check "etcd still gone at the end of those checks" etcd_unreachable 1
start_etcd || die "etcd did not restart after kill -9"
check "every node reconnects" until_ok 20 connected_all
check "the pod added while etcd was dead reaches B's ipcache" until_ok 15 in_ipcache 2 "$(pod_ip a-web3)" "$WEB_ID"

echo "== node 3 partitioned from etcd (only from etcd: the underlay still carries pod traffic)"
in_n 3 ip route add blackhole 10.99.0.100/32 || die "cannot partition node 3"
check "node 3 cannot reach etcd; nodes 1 and 2 can" eval 'etcd_unreachable 3 && check_etcd_from 1 && check_etcd_from 2'
check "node 3 says disconnected" until_ok 20 disconnected 3
check "nodes 1 and 2 stay connected" eval 'connected 1 && connected 2'
check "c-web (node 3) -> b-db still allowed" ping_from c-web "$B_DB"
check_dropped "c-other (node 3) -> b-db:80 still dropped" b-db c-other "$B_DB" 80
add_pod 1 a-part web >/dev/null || die "ADD a-part failed"
A_PART=$(pod_ip a-part)
check "B learns a pod added on A during the partition" until_ok 10 in_ipcache 2 "$A_PART" "$WEB_ID"
check "node 3 does not (it cannot hear etcd)" not_in_ipcache 3 "$A_PART"
in_n 3 ip route del blackhole 10.99.0.100/32 || die "cannot heal the partition"
check "healed: node 3 reaches etcd" check_etcd_from 3
check "healed: node 3 reconnects" until_ok 20 connected 3
check "and learns the pod added meanwhile" until_ok 15 in_ipcache 3 "$A_PART" "$WEB_ID"
check "every node lists the three nodes again" until_ok 20 eval 'nodes_are 1 "$ALL_NODES" && nodes_are 2 "$ALL_NODES" && nodes_are 3 "$ALL_NODES"'
check "B maps node 3's c-web again (or still)" until_ok 15 in_ipcache 2 "$C_WEB" "$WEB_ID"

echo "== kill -9 of A's manager, back within the lease"
ids_before=$(ctl 1 -o json endpoint list | jq -c '[.[] | {container_id, identity}] | sort_by(.container_id)')
kill -9 "${MGR[1]}"; wait "${MGR[1]}" 2>/dev/null; MGR[1]=
check "B keeps A's entries while A is down" in_ipcache 2 "$A_WEB" "$WEB_ID"
check "traffic from A's pods still passes B's policy" ping_from a-web "$B_DB"
start_mgr 1 --node-ip 10.99.0.11 || die "manager 1 did not restart"
ids_after=$(ctl 1 -o json endpoint list | jq -c '[.[] | {container_id, identity}] | sort_by(.container_id)')
check "A keeps the same identities" eval 'jq -e "length >= 3" <<<"$ids_before" >/dev/null && same "$ids_before" "$ids_after"'
sleep $((TTL + 2))
check "after the old lease expired, B still has A's entries (no flap)" in_ipcache 2 "$A_WEB" "$WEB_ID"
check "and A's route is still on B" eval 'in_n 2 ip route show 10.21.0.0/24 proto 196 | matches "via 10.99.0.11"'

echo "== node 3 removed for good"
kill -9 "${MGR[3]}"; wait "${MGR[3]}" 2>/dev/null; MGR[3]=
check "its lease expires: A and B forget node 3" until_ok $((TTL + 10)) eval 'nodes_are 1 "$(nodens 1) $(nodens 2)" && nodes_are 2 "$(nodens 1) $(nodens 2)"'
check "its pod IP leaves A's and B's ipcache" eval 'not_in_ipcache 1 "$C_WEB" && not_in_ipcache 2 "$C_WEB"'
check "its route leaves A and B" eval '! in_n 1 ip route show 10.23.0.0/24 | matches . && ! in_n 2 ip route show 10.23.0.0/24 | matches .'
check "its pod CIDR leaves A's masquerade exemptions" eval '! exempt 1 10.23.0.9 && exempt 1 10.22.0.9'

echo "== uninstall"
check "weft-manager --uninstall removes node 3's table" eval 'in_n 3 "$WEFT_BIN/weft-manager" --uninstall 2>/dev/null && ! has_table 3'

weft_summary
