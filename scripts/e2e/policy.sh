#!/usr/bin/env bash
# Policy end to end with real traffic: Cilium's getting-started rule imported unchanged, a late
# pod picked up without re-import, drop events, deletion by label, Kubernetes default deny +
# allow, deny beats allow; and `weftctl policy trace` agrees with the datapath on every case.
source "$(dirname "$0")/../lib.sh"
weft_plan 27

weft_make_node
weft_start_manager --pod-cidr 10.0.14.0/24 --pod-cidr fd00:10:14::/64
for app in app1 app2 app3; do
  weft_add_pod "$app" '[{"key":"id","value":"'$app'"}]' >/dev/null || die "ADD $app failed"
done
ep_id() { weftctl -o json endpoint list | jq -r --arg c "$WEFT_P-$1" '.[] | select(.container_id == $c) | .id'; }

# flow SRC DST PORT allow|deny [-6]: real TCP connect and `policy trace` must both say `want`;
# a deny must be a policy drop (tcp_dropped: server up, SYN timed out, drop counted).
flow() {
  local src=$1 dst=$2 port=$3 want=$4 fam=${5:-} got traced why
  if [ "$want" = deny ]; then
    if why=$(tcp_dropped "$dst" "$src" "$(pod_ip $fam "$dst")" "$port"); then got=deny; else got="not a policy drop: $why"; fi
  elif tcp_ok "$dst" "$src" "$(pod_ip $fam "$dst")" "$port"; then got=allow; else got=deny; fi
  traced=$(weftctl -o json policy trace --src "ep:$(ep_id "$src")" --dst "ep:$(ep_id "$dst")" --dport "$port" --proto tcp | jq -r .verdict)
  [ "$got" = "$want" ] && [ "$traced" = "$want" ] || { echo "datapath: $got, trace: $traced, want: $want"; return 1; }
}
icmp() { # SRC DST allow|deny (a deny must be a policy drop: ping_dropped)
  local got traced why
  if [ "$3" = deny ]; then
    if why=$(ping_dropped "$1" "$2" "$(pod_ip "$2")"); then got=deny; else got="not a policy drop: $why"; fi
  elif ping_ok in_pod "$1" "$(pod_ip "$2")"; then got=allow; else got=deny; fi
  traced=$(weftctl -o json policy trace --src "ep:$(ep_id "$1")" --dst "ep:$(ep_id "$2")" --proto icmp | jq -r .verdict)
  [ "$got" = "$3" ] && [ "$traced" = "$3" ] || { echo "datapath: $got, trace: $traced, want: $3"; return 1; }
}

echo "== Cilium getting-started policy (imported unchanged)"
"$WEFT_BIN/weftctl" --socket "$WEFT_SOCK" -o json monitor >"$WEFT_TMP/monitor.jsonl" 2>&1 &
MON=$!
out=$(weftctl policy import "$WEFT_ROOT/testdata/policies/cilium-l3-rule.json" --wait)
check "import --wait prints the revision" grep -q '^revision [0-9]' <<<"$out"
rev=$(weftctl -o json status | jq .policy_revision)
at_rev() { weftctl -o json endpoint list | jq -e --argjson r "$rev" 'all(.[]; .policy_revision == $r)'; }
check "every endpoint at revision $rev" at_rev
check "app2 -> app1:80 allowed" flow app2 app1 80 allow
check "app2 -> app1:80 allowed over IPv6" flow app2 app1 80 allow -6
check "app3 -> app1:80 dropped" flow app3 app1 80 deny
check "app3 -> app1:80 dropped over IPv6" flow app3 app1 80 deny -6
check "app2 -> app1:81 dropped" flow app2 app1 81 deny
check "app1 -> app2:80 unaffected" flow app1 app2 80 allow
check "app3 -> app2:80 unaffected" flow app3 app2 80 allow
check "ICMP app3 -> app1 dropped" icmp app3 app1 deny
check "ICMP app1 -> app3 unaffected (replies pass)" icmp app1 app3 allow
sleep 0.3; kill "$MON" 2>/dev/null; wait "$MON" 2>/dev/null
drop_seen() {
  jq -e -s --arg s "$(pod_ip app3)" --arg d "$(pod_ip app1)" \
    'any(.[]; .src_ip == $s and .dst_ip == $d and .dst_port == 80 and .proto == 6 and .direction == "ingress")' "$WEFT_TMP/monitor.jsonl"
}
check "a drop event with app3 -> app1:80/tcp arrived" drop_seen

weft_add_pod app2b '[{"key":"id","value":"app2"}]' >/dev/null || die "ADD app2b failed"
check "a new id=app2 pod reaches app1:80 without re-import" flow app2b app1 80 allow

check "delete the policy by its label" weftctl policy delete --labels name=l3-rule
check "app3 -> app1:80 allowed again" flow app3 app1 80 allow

echo "== Kubernetes NetworkPolicy: default deny ingress + allow app2 -> app1:80"
check "import default deny" weftctl policy import "$WEFT_ROOT/testdata/policies/k8s-default-deny-ingress.yaml" --wait
check "import allow" weftctl policy import "$WEFT_ROOT/testdata/policies/k8s-allow-app2-to-app1.yaml" --wait
check "app2 -> app1:80 allowed" flow app2 app1 80 allow
check "app3 -> app1:80 dropped" flow app3 app1 80 deny
check "app2 -> app1:81 dropped" flow app2 app1 81 deny
check "app1 -> app2:80 dropped (default deny ingress)" flow app1 app2 80 deny
check "egress is not restricted: app1 -> node" tcp_ok node app1 "$(weftctl -o json status | jq -r '.pools[0].router_ip')" 7070
check "delete all" weftctl policy delete --all

echo "== deny beats allow"
check "import" weftctl policy import "$WEFT_ROOT/testdata/policies/cilium-deny-beats-allow.json" --wait
check "app2 -> app1:80 allowed" flow app2 app1 80 allow
check "app3 -> app1:80 denied although allowed from all" flow app3 app1 80 deny
check "app3 -> app1:81 allowed" flow app3 app1 81 allow
weft_summary
