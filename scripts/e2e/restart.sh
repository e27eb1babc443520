#!/usr/bin/env bash
# Restart recovery: kill -9 under traffic (no lost ping of the allowed flow, the denied flow
# never passes, same ids/identities/revision, same pinned maps), a pod whose netns vanished
# while the manager was down, DEL while the manager is down, and lost or corrupt state.
# RESTARTS=N (default 3) kill -9 cycles.
source "$(dirname "$0")/../lib.sh"
weft_plan 38
RESTARTS=${RESTARTS:-3}

weft_make_node
weft_start_manager --pod-cidr 10.0.15.0/24 --pod-cidr fd00:10:15::/64
for app in app1 app2 app3; do
  weft_add_pod "$app" '[{"key":"id","value":"'$app'"}]' >/dev/null || die "ADD $app failed"
done
# app1 accepts anything from app2 and nothing else.
cat >"$WEFT_TMP/policy.json" <<'P'
[{"labels":[{"key":"name","value":"restart"}],"endpointSelector":{"matchLabels":{"id":"app1"}},
  "ingress":[{"fromEndpoints":[{"matchLabels":{"id":"app2"}}]}]}]
P
weftctl policy import "$WEFT_TMP/policy.json" --wait >/dev/null || die "policy import failed"
snapshot() { weftctl -o json endpoint list | jq -c '[.[] | {id, identity, policy_revision, ips}] | sort_by(.id)'; }
map_ids() { for m in endpoints ipcache policy ct; do bpftool map show pinned "$WEFT_BPFFS/$m" | awk -F: 'NR==1 {print $1}'; done | tr '\n' ' '; }
before=$(snapshot)
maps_before=$(map_ids)
APP1=$(pod_ip app1)

echo "== kill -9 x$RESTARTS under traffic"
# `ip netns exec` execs timeout(1), so $! is the listener itself (with the in_pod function it
# would be a subshell, and the kill below would leave the listener running into later checks).
ip netns exec "${WEFT_P}-app1" timeout 60 nc -lk 80 >/dev/null 2>&1 &
LISTENER=$!
count=$((RESTARTS * 100 + 150))
in_pod app2 ping -i 0.02 -c "$count" -q "$APP1" >"$WEFT_TMP/ping.out" 2>&1 &
PING=$!
probe_log=$WEFT_TMP/probes
drops_before=$(flow_drops app1 app3) || die "cannot read the drop counters"
( while kill -0 "$PING" 2>/dev/null; do
    echo denied-probe >>"$probe_log"
    in_pod app3 nc -z -w 1 "$APP1" 80 >/dev/null 2>&1 && echo denied-passed >>"$probe_log"
    in_pod app2 nc -z -w 1 "$APP1" 80 >/dev/null 2>&1 && echo allowed-ok >>"$probe_log" || echo allowed-failed >>"$probe_log"
    sleep 0.2
  done ) &
PROBES=$!
sleep 0.5
for i in $(seq "$RESTARTS"); do
  weft_kill9_manager
  sleep 0.3
  weft_start_manager --pod-cidr 10.0.15.0/24 --pod-cidr fd00:10:15::/64
  sleep 0.5
done
wait "$PING"; wait "$PROBES"; kill "$LISTENER" 2>/dev/null; wait "$LISTENER" 2>/dev/null
sent=$(grep -o '[0-9]* packets transmitted' "$WEFT_TMP/ping.out" | awk '{print $1}')
got=$(grep -o '[0-9]* received' "$WEFT_TMP/ping.out" | awk '{print $1}')
echo "   ping app2 -> app1 every 20 ms: $sent sent, $got received across $RESTARTS kill -9 restarts"
check "0 lost pings of the allowed flow" test "${sent:-0}" -gt 0 -a "$sent" = "$got"
check "the denied flow never got through" test "$(grep -c denied-passed "$probe_log")" = 0
denied_probes=$(grep -c denied-probe "$probe_log")
drops_after=$(flow_drops app1 app3)
echo "   $denied_probes denied connects app3 -> app1:80; policy drops counted for them: $((drops_after - drops_before))"
check "... because the datapath dropped each of them (a drop counted per attempt)" \
  test "$denied_probes" -gt 0 -a "$((drops_after - drops_before))" -ge "$denied_probes"
check "the allowed TCP flow kept working" test "$(grep -c allowed-failed "$probe_log")" = 0
check "same endpoint ids, identities and revision" test "$(snapshot)" = "$before"
check "same pinned maps (ids) after restarts" test "$(map_ids)" = "$maps_before"

echo "== program pins: an unchanged binary reuses the programs, tampered pins force a reload"
programs() { weftctl -o json status | jq -r .programs; }
# "ifname dir prog-id" for every ready endpoint's host veth, as tc lists the filter at pref 1.
filter_ids() {
  local v d
  for v in $(weftctl -o json endpoint list | jq -r '.[] | select(.state == "ready") | .host_ifname' | sort); do
    for d in ingress egress; do
      echo "$v $d $(in_node tc filter show dev "$v" "$d" pref 1 | grep -o ' id [0-9]*' | awk '{print $2}')"
    done
  done
}
pins_complete() { [ -e "$WEFT_BPFFS"/progs/*/weft_from_pod ] && [ -e "$WEFT_BPFFS"/progs/*/weft_to_pod ]; }
# every line of $1 has another program id than the same line of $2
all_changed() { paste -d' ' <(echo "$1") <(echo "$2") | awk '$3 == "" || $3 == $6 {bad = 1} END {exit bad}'; }
check "after the kill -9 restarts the programs were reused" test "$(programs)" = reused
check "the programs are pinned" pins_complete
ids_before=$(filter_ids)
weft_kill9_manager
weft_start_manager --pod-cidr 10.0.15.0/24 --pod-cidr fd00:10:15::/64
check "unchanged binary: programs reused" test "$(programs)" = reused
check "unchanged binary: every veth filter runs the same programs" test "$(filter_ids)" = "$ids_before"
check "and the manager re-attached none" grep -q 'reattached=0' <(grep 'policy slots restored' "$WEFT_TMP/manager.log" | tail -1)
# A partial pin set (one program pin removed) and an object of another build (its pins under
# another digest) must both load afresh and move every veth to the new programs.
for tamper in "rm $WEFT_BPFFS/progs/*/weft_to_pod" "mv $WEFT_BPFFS/progs/* $WEFT_BPFFS/progs/0123456789abcdef0123456789abcdef"; do
  weft_kill9_manager
  eval "$tamper"
  weft_start_manager --pod-cidr 10.0.15.0/24 --pod-cidr fd00:10:15::/64
  ids_after=$(filter_ids)
  check "after '$tamper': programs loaded afresh" test "$(programs)" = loaded
  check "every veth filter runs the new programs" all_changed "$ids_after" "$ids_before"
  check "the new programs are pinned (only them)" test "$(ls "$WEFT_BPFFS/progs" | wc -l)" = 1 -a -n "$(pins_complete && echo y)"
  ids_before=$ids_after
done
check "map verify: filters and maps consistent" weftctl map verify
check "app2 -> app1 allowed with the new programs" ping_ok in_pod app2 "$APP1"
check_dropped "app3 -> app1:80 dropped with the new programs" app1 app3 "$APP1" 80
# A filter changed behind Weft's back is reported by map verify.
veth1=$(weftctl -o json endpoint list | jq -r '.[] | select(.state == "ready") | .host_ifname' | head -1)
in_node tc filter del dev "$veth1" ingress pref 1 handle 1 bpf
check_fails "map verify reports the deleted filter" "$veth1 ingress: Weft[^ ]*s filter \\(pref [0-9]+, handle 1\\) runs program None" weftctl map verify
# A restart that reuses the programs still checks each veth's filters and repairs that one.
weft_kill9_manager
weft_start_manager --pod-cidr 10.0.15.0/24 --pod-cidr fd00:10:15::/64
check "restart with reused programs re-attached only the tampered veth" grep -q 'reattached=1' <(grep 'policy slots restored' "$WEFT_TMP/manager.log" | tail -1)
check "map verify: consistent again" weftctl map verify

echo "== a pod whose netns was deleted while the manager was down"
weft_add_pod gone >/dev/null || die "ADD gone failed"
gone_ip=$(pod_ip gone)
gone_id=$(weftctl -o json endpoint list | jq -r --arg c "$WEFT_P-gone" '.[] | select(.container_id == $c) | .id')
weft_kill9_manager
ip netns del "${WEFT_P}-gone"
weft_start_manager --pod-cidr 10.0.15.0/24 --pod-cidr fd00:10:15::/64
ip_free() { ! weftctl -o json ipam list | jq -e --arg ip "$1" 'any(.[]; .address == $ip)'; }
no_ipcache_for() { weftctl -o json map dump ipcache | jq -e --arg p "$1/32" 'all(.[]; .prefix != $p)'; }
no_endpoint_entry() { weftctl -o json map dump endpoints | jq -e --argjson id "$1" 'all(.[]; .endpoint_id != $id)'; }
check "its endpoint is gone" test -z "$(weftctl -o json endpoint list | jq -r --arg c "$WEFT_P-gone" '.[] | select(.container_id == $c) | .id')"
check "its IP is free" ip_free "$gone_ip"
check "no ipcache entry for it" no_ipcache_for "$gone_ip"
check "no endpoints-map entry for it" no_endpoint_entry "$gone_id"

echo "== DEL while the manager is down"
weft_add_pod late >/dev/null || die "ADD late failed"
late_ip=$(pod_ip late)
weft_kill9_manager
check "DEL succeeds with the manager down" weft_del_pod late
check "the request waits in the delete queue" test -n "$(ls "$WEFT_TMP/delete-queue/"*.json 2>/dev/null)"
weft_start_manager --pod-cidr 10.0.15.0/24 --pod-cidr fd00:10:15::/64
check "after restart its IP is free" ip_free "$late_ip"
check "no ipcache entry for it" no_ipcache_for "$late_ip"
check "the queue is drained" test -z "$(ls "$WEFT_TMP/delete-queue/"*.json 2>/dev/null)"

echo "== lost or corrupt state is refused, not guessed"
weft_kill9_manager
mv "$WEFT_STATE" "$WEFT_STATE.bak"
out=$(in_node timeout 10 "$WEFT_BIN/weft-manager" --state-dir "$WEFT_STATE" --socket "$WEFT_SOCK" --bpffs "$WEFT_BPFFS" --pod-cidr 10.0.15.0/24 2>&1); rc=$?
check "empty state dir with live endpoints: refuses to start" test "$rc" != 0
says_recovery() { grep -q 'state was lost' <<<"$out" && grep -q 'OPERATIONS.md' <<<"$out"; }
check "and names the problem and the recovery" says_recovery
rm -rf "$WEFT_STATE"; cp -a "$WEFT_STATE.bak" "$WEFT_STATE"
head -c 65536 /dev/urandom >"$WEFT_STATE/db/db"
out=$(in_node timeout 10 "$WEFT_BIN/weft-manager" --state-dir "$WEFT_STATE" --socket "$WEFT_SOCK" --bpffs "$WEFT_BPFFS" --pod-cidr 10.0.15.0/24 2>&1); rc=$?
check "corrupt database with live endpoints: refuses to start" test "$rc" != 0
rm -rf "$WEFT_STATE"; mv "$WEFT_STATE.bak" "$WEFT_STATE"
weft_start_manager --pod-cidr 10.0.15.0/24 --pod-cidr fd00:10:15::/64
check "restored state dir: back with the same endpoints" test "$(snapshot)" = "$before"
check "app2 -> app1 still allowed" ping_ok in_pod app2 "$APP1"
check_dropped "app3 -> app1:80 still dropped" app1 app3 "$APP1" 80
weft_summary
