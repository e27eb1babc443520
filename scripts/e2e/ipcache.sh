#!/usr/bin/env bash
# ipcache owners and Kubernetes ipBlock semantics (issue #13), with real traffic:
# - the reproduction: a NetworkPolicy whose ipBlock `except` names pod B's /32 is imported and
#   deleted; B's own ipcache entry must survive, so a later policy allowing C -> B by labels
#   works in the datapath exactly as `policy trace` says;
# - a Kubernetes ipBlock matches pods by IP: {cidr: <pod CIDR>, except: [B/32]} on A admits C
#   and drops B; the same block as a Cilium CIDR rule matches no managed pod.
source "$(dirname "$0")/../lib.sh"
weft_plan 13

CIDR=10.0.70.0/24
weft_make_node
weft_start_manager --pod-cidr "$CIDR"
for p in a b c; do
  weft_add_pod "$p" '[{"key":"pod","value":"'$p'"}]' >/dev/null || die "ADD $p failed"
done
A=$(pod_ip a) B=$(pod_ip b) C=$(pod_ip c)
ep_id() { weftctl -o json endpoint list | jq -r --arg c "$WEFT_P-$1" '.[] | select(.container_id == $c) | .id'; }

# flow SRC DST PORT allow|deny: a real TCP connect and `policy trace` (by IP) must both say it;
# a deny must be a policy drop (tcp_dropped: server up, SYN timed out, drop counted).
flow() {
  local src=$1 dst=$2 port=$3 want=$4 got traced why
  if [ "$want" = deny ]; then
    if why=$(tcp_dropped "$dst" "$src" "$(pod_ip "$dst")" "$port"); then got=deny; else got="not a policy drop: $why"; fi
  elif tcp_ok "$dst" "$src" "$(pod_ip "$dst")" "$port"; then got=allow; else got=deny; fi
  traced=$(weftctl -o json policy trace --src "$(pod_ip "$src")" --dst "$(pod_ip "$dst")" --dport "$port" --proto tcp | jq -r .verdict)
  [ "$got" = "$want" ] && [ "$traced" = "$want" ] || { echo "datapath: $got, trace: $traced, want: $want"; return 1; }
}
ipcache_identity() { weftctl -o json map dump ipcache | jq -r --arg p "$1/32" '.[] | select(.prefix == $p) | .identity'; }
ep_identity() { weftctl -o json endpoint get "$(ep_id "$1")" | jq -r .identity; }
ipcache_is_endpoint() { [ "$(ipcache_identity "$2")" = "$(ep_identity "$1")" ]; }

netpol() { # NAME POD-LABEL YAML-FOR-SPEC...
  local f=$WEFT_TMP/$1.yaml
  printf 'apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: %s\n  namespace: default\nspec:\n  podSelector:\n    matchLabels:\n      pod: %s\n%s\n' "$1" "$2" "$3" >"$f"
  echo "$f"
}

# Pod A admits the pod CIDR except B's /32.
EXCEPT_B="  policyTypes: [Ingress]
  ingress:
  - from:
    - ipBlock:
        cidr: $CIDR
        except: [$B/32]"
import() { weftctl policy import "$1" --wait >/dev/null || die "import of $1 failed"; }

echo "== reproduction: an ipBlock except equal to a pod's /32, imported then deleted"
f=$(netpol except-b a "$EXCEPT_B")
import "$f"
check "B's ipcache entry is still B's endpoint identity while the /32 is referenced" ipcache_is_endpoint b "$B"
weftctl policy delete --all >/dev/null || die "delete failed"
check "B's ipcache entry survives the /32 CIDR identity's release" ipcache_is_endpoint b "$B"
f=$(netpol c-to-b c "  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector: {}
      podSelector:
        matchLabels:
          pod: b
    ports:
    - {protocol: TCP, port: 80}")
import "$f"
check "C -> B:80 allowed (datapath and trace agree)" flow c b 80 allow
check "C -> A:80 dropped (datapath and trace agree)" flow c a 80 deny
weftctl policy delete --all >/dev/null

echo "== a Kubernetes ipBlock matches pods by IP"
f=$(netpol block-b a "$EXCEPT_B")
import "$f"
check "C -> A:80 allowed: C's IP is in the block" flow c a 80 allow
check "B -> A:80 dropped: B's IP is excepted" flow b a 80 deny
has_cidr_identity() { weftctl -o json map dump ipcache | jq -e --arg p "$C/32" '.[] | select(.prefix == $p) | .cidr_identity > 0'; }
check "C's ipcache entry carries the block's CIDR identity" has_cidr_identity
# B and C have different identities here; give C B's labels too: still admitted by IP only.
weftctl endpoint labels "$(ep_id c)" --add pod=b >/dev/null 2>&1 || true
check "a pod sharing B's labels is still admitted by its own IP" flow c a 80 allow
check "B -> A:80 still dropped" flow b a 80 deny
weftctl policy delete --all >/dev/null

echo "== the same block as a Cilium CIDR rule matches no managed pod"
cat >"$WEFT_TMP/cilium-cidr.json" <<EOF
[{"endpointSelector": {"matchLabels": {"pod": "a"}},
  "ingress": [{"fromCIDRSet": [{"cidr": "$CIDR", "except": ["$B/32"]}]}],
  "labels": [{"key": "name", "value": "cidr-block"}]}]
EOF
import "$WEFT_TMP/cilium-cidr.json"
check "C -> A:80 dropped (Cilium CIDR rules select no pod)" flow c a 80 deny
weftctl policy delete --all >/dev/null

echo "== restart keeps owners: the pod's entry survives a CIDR rule for its /32 across kill -9"
f=$(netpol pin-b a "  policyTypes: [Ingress]
  ingress:
  - from:
    - ipBlock:
        cidr: $B/32")
import "$f"
weft_kill9_manager
weft_start_manager --pod-cidr "$CIDR"
check "after kill -9 + restart B's entry is B's endpoint" ipcache_is_endpoint b "$B"
weftctl policy delete --all >/dev/null
check "and survives deleting the rule after the restart" ipcache_is_endpoint b "$B"
check "B -> C:80 allowed with no policy" flow b c 80 allow
weft_summary
