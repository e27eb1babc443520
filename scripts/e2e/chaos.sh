#!/usr/bin/env bash
# Chaos: 8-way parallel ADD/DEL churn while weft-manager is killed -9 at random moments and
# restarted; the churn retries code-11 failures as a runtime would (and DELs after other ADD
# failures, as containerd does). At the end the four views must agree:
#   IPAM allocations == live endpoints == host veths == endpoints-map entries,
# no ipcache entry for a dead pod, no endpoint stuck outside `ready`, and every live pod
# reachable by the allowed peer and unreachable by the denied one.
# PODS (default 304) pods at least, KILLS (default 10) kill -9 restarts at least.
source "$(dirname "$0")/../lib.sh"
weft_plan 11
PODS=${PODS:-304}
KILLS=${KILLS:-10}
WORKERS=8
START=(--pod-cidr 10.0.16.0/22 --pod-cidr fd00:10:16::/64)

weft_make_node
weft_start_manager "${START[@]}"
weft_add_pod prober '[{"key":"role","value":"prober"}]' >/dev/null || die "ADD prober failed"
weft_add_pod blocked '[{"key":"role","value":"blocked"}]' >/dev/null || die "ADD blocked failed"
cat >"$WEFT_TMP/policy.json" <<'P'
[{"labels":[{"key":"name","value":"chaos"}],"endpointSelector":{"matchLabels":{"chaos":"yes"}},
  "ingress":[{"fromEndpoints":[{"matchLabels":{"role":"prober"}}]}]}]
P
weftctl policy import "$WEFT_TMP/policy.json" --wait >/dev/null || die "policy import failed"

CONF=$(weft_netconf 1.0.0 '[{"key":"chaos","value":"yes"}]')
cni() { weft_cni "$1" "$WEFT_P-c$2" "$3" eth0 <<<"$CONF"; }
# A runtime's ADD: retry "try again later"; after any other failure DEL, then retry.
add_until_ok() {
  local i=$1 ns=/run/netns/${WEFT_P}-c$1 out rc n
  for n in $(seq 400); do
    out=$(cni ADD "$i" "$ns" 2>/dev/null); rc=$?
    [ "$rc" = 0 ] && return 0
    [ "$(jq -r '.code' <<<"$out" 2>/dev/null)" = 11 ] || cni DEL "$i" "$ns" >/dev/null 2>&1
    sleep 0.05
  done
  echo "pod $i: ADD never succeeded: $out" >&2; return 1
}
del_until_ok() {
  local n
  for n in $(seq 400); do cni DEL "$1" "/run/netns/${WEFT_P}-c$1" >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "pod $1: DEL never succeeded" >&2; return 1
}
worker() { # every 8th pod from $1; every other one of them is deleted again, the rest stay
  local i=$1
  while [ "$i" -lt "$PODS" ] || [ ! -f "$WEFT_TMP/stop" ]; do
    ip netns add "${WEFT_P}-c$i"
    add_until_ok "$i" || return 1
    if [ $(((i / WORKERS) % 2)) = 0 ]; then
      del_until_ok "$i" || return 1
      ip netns del "${WEFT_P}-c$i"
    fi
    echo "$i" >>"$WEFT_TMP/done.$1"
    i=$((i + WORKERS))
  done
}

pids=()
for w in $(seq 0 $((WORKERS - 1))); do worker "$w" & pids+=($!); done
kills=0
while [ "$kills" -lt "$KILLS" ]; do
  sleep "0.$((RANDOM % 6 + 2))"
  weft_kill9_manager
  kills=$((kills + 1))
  sleep "0.0$((RANDOM % 9 + 1))"
  weft_start_manager "${START[@]}"
done
touch "$WEFT_TMP/stop"
failed=0; for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
churned=$(cat "$WEFT_TMP"/done.* | wc -l)
echo "   $churned pods churned by $WORKERS workers through $kills kill -9 restarts"
check "every worker finished" test "$failed" = 0
check "at least $PODS pods churned" test "$churned" -ge "$PODS"
# DELs queued in the last start-up window are completed by the manager's housekeeping (2 s).
sleep 3

live=$(ip netns list | awk '{print $1}' | grep -c "^${WEFT_P}-c")
eps=$(weftctl -o json endpoint list | jq '[.[] | select(.labels | any(.value == "yes"))] | length')
allocs=$(weftctl -o json ipam list | jq '[.[] | select(.address | test(":") | not)] | length')
veths=$(in_node ip -o link show | grep -c ' weft[0-9a-f]\{11\}@')
mapents=$(weftctl -o json map dump endpoints | jq length)
echo "   live pods $live | chaos endpoints $eps | IPv4 allocations $allocs (incl. 2 probes) | host veths $veths | endpoints-map entries $mapents"
check "live endpoints == live pods" test "$eps" = "$live"
check "IPAM allocations == endpoints" test "$allocs" = "$((eps + 2))"
check "host veths == endpoints" test "$veths" = "$((eps + 2))"
check "endpoints-map entries == endpoints" test "$mapents" = "$((eps + 2))"
all_ready() { weftctl -o json endpoint list | jq -e 'all(.[]; .state == "ready")'; }
check "no endpoint stuck outside ready" all_ready
ipcache_exact() {
  local want got
  want=$(weftctl -o json endpoint list | jq -r '.[].ips[].address' | sort)
  got=$(weftctl -o json map dump ipcache | jq -r '.[] | select(.identity >= 256) | .prefix | sub("/(32|128)$"; "")' | sort)
  [ "$want" = "$got" ] || { diff <(echo "$want") <(echo "$got"); return 1; }
}
check "ipcache holds exactly the live pods' addresses" ipcache_exact

# Reachability and enforcement on every live pod, pings in parallel.
ips=$(weftctl -o json endpoint list | jq -r '.[] | select(.labels | any(.value == "yes")) | .ips[0].address')
: >"$WEFT_TMP/reach"
drops_before=$(total_policy_drops) || die "cannot read the drop counters"
ppids=()
for ip in $ips; do
  ( in_pod prober ping -c1 -W2 -q "$ip" >/dev/null 2>&1 && echo "ok $ip" || echo "unreachable $ip"
    in_pod blocked ping -c1 -W1 -q "$ip" >/dev/null 2>&1 && echo "leak $ip" || echo "denied $ip" ) >>"$WEFT_TMP/reach" &
  ppids+=($!)
done
[ ${#ppids[@]} -gt 0 ] && wait "${ppids[@]}"
check "every live pod reachable from the allowed peer" test "$(grep -c '^ok' "$WEFT_TMP/reach")" = "$live"
check "every live pod enforcing its policy (denied peer dropped)" test "$(grep -c '^denied' "$WEFT_TMP/reach")" = "$live"
drops=$(( $(total_policy_drops) - drops_before ))
check "... by policy: $drops policy drops counted for $live denied pings" test "$live" -gt 0 -a "$drops" -ge "$live"
weft_summary
