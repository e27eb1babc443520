# Pods on different nodes of a cluster of two or three (scripts/cluster/up --nodes N), sourced by
# checks: one Weft manager per node holding its own pods, same-node and cross-node pod-to-pod TCP
# and UDP, a NetworkPolicy judging a client on node 2 by its pod label at a server on node 1
# (allowed) and another client of node 2 (dropped), and a ClusterIP whose backend is on another
# node. Pods are pinned with spec.nodeName. Routes between the nodes' pod CIDRs are the network
# plugin's job (never made here): without them every cross-node check fails with a TIMEOUT.
# Every drop has its positive control, and a drop whose control failed is a failure (it would
# say nothing about the policy). On a single-node cluster the group is skipped.
# shellcheck shell=bash
MN_NODES=$(cl_node_count)
api_nodes=$(kc get nodes -o name 2>/dev/null | wc -l)
if [ "$MN_NODES" -lt 2 ]; then
  echo "  skip multinode: cluster $CL_NAME has $MN_NODES node ($api_nodes in the API); bring up several with scripts/cluster/up --nodes 2 (or 3)"
  return 0
fi
M=wck-mn
N1=$(ck_node 1) N2=$(ck_node 2)
check "the API has the $MN_NODES nodes up recorded" test "$api_nodes" = "$MN_NODES"
CK_RESTORE+=("kc delete namespace $M --ignore-not-found --wait=true --timeout=120s")
kc delete namespace "$M" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1

# mn_pod NAME NODE LABELS ARGS: an agnhost pod pinned to NODE.
mn_pod() {
  cat <<EOT
---
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: $M, labels: {$3}}
spec:
  nodeName: $2
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: $AGNHOST_IMAGE
    args: [$4]
EOT
}
{
  echo "apiVersion: v1"
  echo "kind: Namespace"
  echo "metadata: {name: $M}"
  # A server on every node; a client on node 1; two clients on node 2, told apart by role.
  for i in $(seq "$MN_NODES"); do
    mn_pod "srv$i" "$(ck_node "$i")" "app: mn-server, mn: srv$i" "netexec, --http-port=8080, --udp-port=9080"
  done
  mn_pod cli1 "$N1" "role: mn-client" pause
  mn_pod cli2 "$N2" "role: allowed" pause
  mn_pod other2 "$N2" "role: denied" pause
} | kc apply -f - >/dev/null
pods_ready() { kc -n "$M" wait --for=condition=Ready pod --all --timeout=120s >/dev/null || { kc -n "$M" get pods -o wide; return 1; }; }
if ! check "the test pods are Ready, each on its node" pods_ready; then
  return 0
fi

# Each pod where it was pinned, with an address from its node's podCIDR (the controller's).
in_cidr() { python3 -c 'import ipaddress,sys; sys.exit(ipaddress.ip_address(sys.argv[1]) not in ipaddress.ip_network(sys.argv[2]))' "$1" "$2"; }
on_node_cidr() { # POD NODE
  local node ip cidr
  node=$(kc -n "$M" get pod "$1" -o jsonpath='{.spec.nodeName}')
  ip=$(pod_ip "$M" "$1")
  cidr=$(kc get node "$2" -o jsonpath='{.spec.podCIDR}')
  [ "$node" = "$2" ] && in_cidr "$ip" "$cidr" || { echo "$1: node $node, IP $ip; wanted node $2, podCIDR $cidr"; return 1; }
}
for i in $(seq "$MN_NODES"); do
  check "srv$i runs on $(ck_node "$i") with an IP of its podCIDR ($(kc get node "$(ck_node "$i")" -o jsonpath='{.spec.podCIDR}'))" on_node_cidr "srv$i" "$(ck_node "$i")"
done
check "cli2 and other2 run on $N2 with IPs of its podCIDR" eval 'on_node_cidr cli2 "$N2" && on_node_cidr other2 "$N2"'

# The DaemonSet's manager of each node holds that node's pods, and only those.
weftctl_on() { # NODE ARGS: weftctl in the weft pod of NODE
  local node=$1 pod; shift
  pod=$(kc -n kube-system get pods -l k8s-app=weft --field-selector "spec.nodeName=$node" -o jsonpath='{.items[0].metadata.name}')
  [ -n "$pod" ] || { echo "no weft pod on $node"; return 1; }
  kc -n kube-system exec "$pod" -c weft-manager -- /usr/local/bin/weftctl "$@"
}
own_endpoints() { # NODE POD... : the node's manager has an endpoint for each POD of $M, and these
  local node=$1 l p; shift
  l=$(weftctl_on "$node" -o json endpoint list) || { echo "$l"; return 1; }
  for p in "$@"; do
    jq -e --arg ns "$M" --arg p "$p" 'any(.[]; .pod_namespace == $ns and .pod_name == $p)' <<<"$l" >/dev/null ||
      { echo "the manager on $node has no endpoint for $M/$p: $(jq -c "[.[] | select(.pod_namespace == \"$M\") | .pod_name]" <<<"$l")"; return 1; }
  done
  jq -e --arg ns "$M" --argjson want "$(printf '%s\n' "$@" | jq -R . | jq -sc .)" \
    '[.[] | select(.pod_namespace == $ns) | .pod_name] - $want | length == 0' <<<"$l" >/dev/null ||
    { echo "the manager on $node has endpoints of other nodes' pods: $(jq -c "[.[] | select(.pod_namespace == \"$M\") | .pod_name]" <<<"$l")"; return 1; }
}
check "the weft DaemonSet is ready on all $MN_NODES nodes" test "$(kc -n kube-system get ds weft -o jsonpath='{.status.numberReady}')" = "$MN_NODES"
check "the manager on $N1 holds srv1 and cli1, no other node's pod" within 20 own_endpoints "$N1" srv1 cli1
check "the manager on $N2 holds srv2, cli2 and other2, no other node's pod" within 20 own_endpoints "$N2" srv2 cli2 other2
for i in $(seq 3 "$MN_NODES"); do
  check "the manager on $(ck_node "$i") holds srv$i, no other node's pod" within 20 own_endpoints "$(ck_node "$i")" "srv$i"
done

SRV1=$(pod_ip "$M" srv1) SRV2=$(pod_ip "$M" srv2)
echo "   (srv1 $SRV1 on $N1, srv2 $SRV2 on $N2)"
check "same node ($N1): cli1 reaches srv1 over TCP" reaches "$M" cli1 "$SRV1" 8080
check "same node ($N1): cli1 reaches srv1 over UDP" reaches "$M" cli1 "$SRV1" 9080 udp
check "same node ($N2): cli2 reaches srv2 over TCP" reaches "$M" cli2 "$SRV2" 8080
check "same node ($N2): cli2 reaches srv2 over UDP" reaches "$M" cli2 "$SRV2" 9080 udp
check "cross-node ($N2 -> $N1): cli2 reaches srv1 over TCP" within 30 reaches "$M" cli2 "$SRV1" 8080
check "cross-node ($N2 -> $N1): cli2 reaches srv1 over UDP" reaches "$M" cli2 "$SRV1" 9080 udp
check "cross-node ($N1 -> $N2): cli1 reaches srv2 over TCP" reaches "$M" cli1 "$SRV2" 8080
check "cross-node ($N1 -> $N2): cli1 reaches srv2 over UDP" reaches "$M" cli1 "$SRV2" 9080 udp
for i in $(seq 3 "$MN_NODES"); do
  check "cross-node ($N1 -> $(ck_node "$i")): cli1 reaches srv$i over TCP" reaches "$M" cli1 "$(pod_ip "$M" "srv$i")" 8080
  check "cross-node ($N2 -> $(ck_node "$i")): cli2 reaches srv$i over UDP" reaches "$M" cli2 "$(pod_ip "$M" "srv$i")" 9080 udp
done
# The control of the drop below: before any policy other2 reaches srv1 across the nodes.
other2_control=0
desc="no policy: other2 ($N2) reaches srv1 ($N1) over TCP (control of the drop below)"
if out=$(reaches "$M" other2 "$SRV1" 8080 2>&1); then other2_control=1; ck_pass "$desc"; else ck_fail "$desc" "$out"; fi

# Ingress to srv1 only from role=allowed pods: cli2 on node 2 is one, other2 on node 2 is not.
kc apply -f - >/dev/null <<EOT
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: srv1-from-allowed, namespace: $M}
spec:
  podSelector: {matchLabels: {mn: srv1}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {role: allowed}}
EOT
# The drop first (it is what shows the policy in force), then the allow: the allow right after
# the apply could pass before the policy is there.
mn_dropped() {
  if [ "$other2_control" = 1 ]; then
    within 20 dropped "$M" other2 "$SRV1" 8080
  else
    echo "other2 did not reach srv1 before the policy either: a drop now says nothing about the policy"
    return 1
  fi
}
check "NetworkPolicy on srv1 ($N1): other2 ($N2, role=denied) is dropped" mn_dropped
check "NetworkPolicy on srv1 ($N1): cli2 ($N2, role=allowed) reaches srv1:8080 by its pod label" within 20 reaches "$M" cli2 "$SRV1" 8080
check "NetworkPolicy on srv1 ($N1): cli1 ($N1, role=mn-client) is dropped too (same node)" dropped "$M" cli1 "$SRV1" 8080
check "... while srv2 ($N2), not selected, still answers other2 (control)" reaches "$M" other2 "$SRV2" 8080
kc -n "$M" delete networkpolicy srv1-from-allowed >/dev/null
check "policy deleted: other2 reaches srv1 again" within 20 reaches "$M" other2 "$SRV1" 8080

# A ClusterIP whose only backend is srv1 on node 1, from clients on node 2 (and the other way).
kc apply -f - >/dev/null <<EOT
apiVersion: v1
kind: Service
metadata: {name: srv1, namespace: $M}
spec:
  selector: {mn: srv1}
  ports:
  - {name: http, port: 80, targetPort: 8080, protocol: TCP}
  - {name: udp, port: 90, targetPort: 9080, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata: {name: srv2, namespace: $M}
spec:
  selector: {mn: srv2}
  ports:
  - {name: http, port: 80, targetPort: 8080, protocol: TCP}
EOT
SVC1=$(kc -n "$M" get service srv1 -o jsonpath='{.spec.clusterIP}')
SVC2=$(kc -n "$M" get service srv2 -o jsonpath='{.spec.clusterIP}')
echo "   (Service $M/srv1 $SVC1 -> srv1 on $N1, $M/srv2 $SVC2 -> srv2 on $N2)"
svc_known() { # NODE IP BACKEND: the node's manager translates IP:80 to BACKEND:8080
  weftctl_on "$1" -o json service list | jq -e --arg ip "$2" --arg b "$3" \
    'any(.[]; any(.frontends[]; .frontend.addr == $ip and .frontend.port == 80 and any(.backends[]; .addr == $b and .port == 8080)))' >/dev/null ||
    { echo "$1: $(weftctl_on "$1" service list 2>&1 | head -10)"; return 1; }
}
check "the manager on $N2 translates srv1's ClusterIP to its backend on $N1" within 20 svc_known "$N2" "$SVC1" "$SRV1"
check "cross-node through a ClusterIP: cli2 ($N2) reaches srv1 ($N1) at $SVC1:80" within 20 reaches "$M" cli2 "$SVC1" 80
check "cross-node through a ClusterIP: cli2 ($N2) reaches srv1 ($N1) at $SVC1:90/UDP" reaches "$M" cli2 "$SVC1" 90 udp
check "cross-node through a ClusterIP: cli1 ($N1) reaches srv2 ($N2) at $SVC2:80" within 20 reaches "$M" cli1 "$SVC2" 80
check "same node through a ClusterIP: cli2 ($N2) reaches srv2 at $SVC2:80 (control)" reaches "$M" cli2 "$SVC2" 80
