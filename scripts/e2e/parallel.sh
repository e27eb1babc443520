#!/usr/bin/env bash
# 64 parallel ADDs -> 64 distinct IPs, all reachable; 64 parallel DELs -> nothing left.
source "$(dirname "$0")/../lib.sh"
weft_plan 9
N=${WEFT_PARALLEL_PODS:-64}

weft_make_node
weft_start_manager --pod-cidr 10.0.7.0/24 --pod-cidr fd00:10:7::/64
for i in $(seq "$N"); do ip netns add "${WEFT_P}-q$i"; done
# Wait on these PIDs only: a bare `wait` would also wait for the manager.
pids=()
for i in $(seq "$N"); do
  weft_netconf | weft_cni ADD "$WEFT_P-q$i" "/run/netns/${WEFT_P}-q$i" eth0 >"$WEFT_TMP/add$i.json" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
ok=0; for i in $(seq "$N"); do jq -e '.ips | length == 2' "$WEFT_TMP/add$i.json" >/dev/null && ok=$((ok + 1)); done
check "$N ADDs succeeded" test "$ok" = "$N"
check "$N distinct IPv4 addresses" test "$(cat "$WEFT_TMP"/add*.json | jq -r '.ips[0].address' | sort -u | wc -l)" = "$N"
check "$N distinct IPv6 addresses" test "$(cat "$WEFT_TMP"/add*.json | jq -r '.ips[1].address' | sort -u | wc -l)" = "$N"
unreach=0
for i in $(seq "$N"); do
  ip=$(jq -r '.ips[0].address' "$WEFT_TMP/add$i.json" | cut -d/ -f1)
  in_node ping -c1 -W2 -q "$ip" >/dev/null 2>&1 || unreach=$((unreach + 1))
done
check "all $N pods answer ping from the node" test "$unreach" = 0
status_is() { weftctl -o json status | jq -e "$1"; }
no_endpoints() { weftctl -o json endpoint list | jq -e 'length == 0'; }
no_host_veth() { ! in_node ip -o link show | grep ' weft[0-9a-f]\{11\}'; }
no_pod_routes() { ! in_node ip route show | grep -E '^10\.0\.7\.[0-9]+ dev weft[0-9a-f]' && ! in_node ip -6 route show | grep -E '^fd00:10:7::[0-9a-f]+ dev weft[0-9a-f]'; }
check "pool usage is $N" status_is ".pools[0].used == $N"
pids=()
for i in $(seq "$N"); do
  weft_netconf | weft_cni DEL "$WEFT_P-q$i" "/run/netns/${WEFT_P}-q$i" eth0 >/dev/null 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
check "pool usage back to 0" status_is '[.pools[].used] == [0,0]'
check "no endpoint left" no_endpoints
check "no /32 or /128 pod route left once DEL has returned" no_pod_routes
check "no host veth left (deleted after DEL answered)" eventually no_host_veth
weft_summary
