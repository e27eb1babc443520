#!/usr/bin/env bash
# Service translation in the datapath (docs/DATAPATH.md, "Services"), in Kubernetes mode against
# weft-k8s-replay as scripts/e2e/k8s.sh does: Services and EndpointSlices pushed through the
# watches, real TCP and UDP between pods. The node netns has no kube-proxy and no route for the
# ClusterIPs, so a connection to a ClusterIP works only if Weft's own datapath translates it (the
# negative control before the Service exists shows that), and the handshake completes only if
# the replies come back from the ClusterIP (reverse translation). Then what issue 26's upstream
# failures were about: egress policy judges the backend pod, not the ClusterIP (pod selector and
# ipBlock allow; another pod's Service dropped by policy); a pod reaching its own Service
# (hairpin) under its own ingress policy; a backend change; the Service deleted; a restart that
# keeps the frontends and their ids.
source "$(dirname "$0")/../lib.sh"
weft_need_replay
weft_plan 37
command -v curl >/dev/null || die "curl is missing: run scripts/setup"

NODE=$WEFT_P
NP=/apis/networking.k8s.io/v1/networkpolicies
SVC=/api/v1/services
EPS=/apis/discovery.k8s.io/v1/endpointslices
VIP_B=10.96.0.10 VIP_BX=10.96.0.11 VIP_C=10.96.0.12 VIP_U=10.96.0.13
ns() { # NAME
  jq -nc --arg n "$1" '{apiVersion:"v1",kind:"Namespace",
    metadata:{name:$n,resourceVersion:"10",uid:("uid-ns-"+$n),labels:{"kubernetes.io/metadata.name":$n}},
    spec:{finalizers:["kubernetes"]},status:{phase:"Active"}}'
}
pod() { # NS NAME APP
  jq -nc --arg ns "$1" --arg n "$WEFT_P-$2" --arg app "$3" --arg node "$NODE" \
    '{apiVersion:"v1",kind:"Pod",metadata:{name:$n,namespace:$ns,uid:("uid-"+$n),resourceVersion:"100",labels:{app:$app}},
      spec:{nodeName:$node,containers:[{name:"c",image:"agnhost"}]},status:{phase:"Pending"}}'
}
list() { # API_VERSION KIND ITEM...
  local av=$1 kind=$2; shift 2
  printf '%s\n' "$@" | jq -sc --arg av "$av" --arg k "${kind}List" '{apiVersion:$av,kind:$k,metadata:{resourceVersion:"100"},items:.}'
}
empty() { jq -nc --arg av "$1" --arg k "${2}List" '{apiVersion:$av,kind:$k,metadata:{resourceVersion:"100"},items:[]}'; }
node_obj=$(jq -nc --arg n "$NODE" '{apiVersion:"v1",kind:"Node",metadata:{name:$n,uid:"uid-node",resourceVersion:"5"},
  spec:{podCIDR:"10.0.16.0/24",podCIDRs:["10.0.16.0/24"]}}')
write_replay() {
  jq -n \
    --argjson node "$node_obj" \
    --argjson nodes "$(list v1 Node "$node_obj")" \
    --argjson pods "$(list v1 Pod "$(pod x a a)" "$(pod y b b)" "$(pod y c c)")" \
    --argjson nss "$(list v1 Namespace "$(ns x)" "$(ns y)")" \
    --argjson nps "$(empty networking.k8s.io/v1 NetworkPolicy)" \
    --argjson svcs "$1" --argjson slices "$2" \
    --arg nodepath "/api/v1/nodes/$NODE" --arg np "$NP" --arg svc "$SVC" --arg eps "$EPS" \
    '{objects:{($nodepath):$node},
      lists:{"/api/v1/nodes":[$nodes],"/api/v1/pods":[$pods],"/api/v1/namespaces":[$nss],
             ($np):[$nps],($svc):[$svcs],($eps):[$slices]}}' >"$WEFT_TMP/replay.json"
}
write_replay "$(empty v1 Service)" "$(empty discovery.k8s.io/v1 EndpointSlice)"

weft_make_node
REPLAY_PID=
trap 'rc=$?; kill $REPLAY_PID 2>/dev/null; (exit $rc); weft_cleanup' EXIT
weft_start_replay
RV=30
push() { # PATH TYPE OBJECT
  RV=$((RV + 1))
  replay_push "$1" "$(jq -nc --arg t "$2" --arg rv "$RV" --argjson o "$3" '{type:$t,object:($o | .metadata.resourceVersion=$rv)}')"
}
# svc NS NAME CLUSTER-IP PORT TARGET-PORT [PROTO]
svc() {
  jq -nc --arg ns "$1" --arg n "$2" --arg ip "$3" --argjson port "$4" --argjson tp "$5" --arg proto "${6:-TCP}" \
    '{apiVersion:"v1",kind:"Service",metadata:{name:$n,namespace:$ns,uid:("uid-svc-"+$n)},
      spec:{type:"ClusterIP",clusterIP:$ip,clusterIPs:[$ip],ipFamilies:["IPv4"],
            ports:[{name:"p",port:$port,targetPort:$tp,protocol:$proto}]}}'
}
# slice NS SERVICE TARGET-PORT PROTO IP...: one ready endpoint per IP.
slice() {
  local ns=$1 name=$2 port=$3 proto=$4; shift 4
  jq -nc --arg ns "$ns" --arg n "$name" --argjson port "$port" --arg proto "$proto" \
    '{apiVersion:"discovery.k8s.io/v1",kind:"EndpointSlice",
      metadata:{name:($n+"-abcde"),namespace:$ns,uid:("uid-eps-"+$n),labels:{"kubernetes.io/service-name":$n}},
      addressType:"IPv4",ports:[{name:"p",port:$port,protocol:$proto}],
      endpoints:[$ARGS.positional[] | {addresses:[.],conditions:{ready:true}}]}' --args "$@"
}
np() { # NS NAME SPEC-JSON
  jq -nc --arg ns "$1" --arg n "$2" --argjson spec "$3" \
    '{apiVersion:"networking.k8s.io/v1",kind:"NetworkPolicy",metadata:{name:$n,namespace:$ns,uid:("uid-np-"+$n),generation:1},spec:$spec}'
}
# apply_np TYPE OBJECT: pushes a NetworkPolicy event and waits until the revision moved.
apply_np() {
  local rev i
  rev=$(weftctl -o json status | jq .policy_revision)
  push "$NP" "$1" "$2" || return 1
  for i in $(seq 100); do
    [ "$(weftctl -o json status | jq .policy_revision)" -gt "$rev" ] && return 0
    sleep 0.05
  done
  echo "the revision stayed at $rev"; return 1
}
# frontend VIP:PORT/PROTO BACKENDS: weftctl service list has that row, with those backends.
frontend() {
  weftctl -o json service list | jq -e --arg a "${1%%:*}" --argjson p "$(cut -d: -f2 <<<"${1%/*}")" --arg b "$2" \
    '[.[].frontends[] | select(.frontend.addr == $a and .frontend.port == $p)
      | ([.backends[] | "\(.addr):\(.port)"] | join(","))] | index($b) != null' >/dev/null ||
    { weftctl service list; return 1; }
}
no_frontend() { # VIP
  weftctl -o json service list | jq -e --arg a "$1" '[.[].frontends[] | select(.frontend.addr == $a)] | length == 0' >/dev/null ||
    { weftctl service list; return 1; }
}

weft_start_manager --k8s --kubeconfig "$WEFT_TMP/kubeconfig" --k8s-cilium-policies false
k8s_pod() { # NS POD: CNI ADD with the kubelet's CNI_ARGS
  ip netns add "${WEFT_P}-$2" || return 1
  WEFT_PODS+=("$2")
  weft_netconf | weft_cni ADD "$WEFT_P-$2" "/run/netns/${WEFT_P}-$2" eth0 \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=$1;K8S_POD_NAME=$WEFT_P-$2"
}
for p in "x a" "y b" "y c"; do
  set -- $p
  k8s_pod "$1" "$2" >/dev/null || die "ADD $2 failed"
done
A=$(pod_ip a) B=$(pod_ip b) C=$(pod_ip c)

# svc_ok SERVER CLIENT VIP PORT TARGET-PORT: TCP client -> VIP:PORT reaches SERVER's TARGET-PORT.
svc_ok() {
  local srv=$1 cli=$2 vip=$3 port=$4 tport=$5 spid i
  ip netns exec "${WEFT_P}-$srv" timeout 5 nc -4 -l "$tport" >/dev/null 2>&1 &
  spid=$!
  for i in $(seq 50); do listening "$tport" in_pod "$srv" && break; sleep 0.02; done
  in_pod "$cli" nc -4 -z -w 2 "$vip" "$port"
  local rc=$?
  kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
  return $rc
}
# udp_echo_ok SERVER CLIENT VIP PORT TARGET-PORT: a UDP datagram to VIP:PORT reaches SERVER's
# TARGET-PORT and its echo comes back to the client's connected socket, i.e. from VIP:PORT.
udp_echo_ok() {
  local srv=$1 cli=$2 vip=$3 port=$4 tport=$5 spid out
  ip netns exec "${WEFT_P}-$srv" timeout 5 python3 -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
d, a = s.recvfrom(100)
s.sendto(b"echo:" + d, a)' "$tport" &
  spid=$!
  sleep 0.3
  out=$(in_pod "$cli" python3 -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
s.connect((sys.argv[1], int(sys.argv[2])))
s.send(b"hi")
print(s.recv(100).decode())' "$vip" "$port" 2>&1)
  kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
  [ "$out" = "echo:hi" ] || { echo "client got: $out"; return 1; }
}
# hairpin_dropped POD POD-IP VIP PORT: the pod's connection to its own Service is dropped by
# policy: it accepts on its own address (positive control), the connection to VIP:PORT times
# out, and its ingress policy drops grew (tcp_dropped's rules, with a different control address).
hairpin_dropped() {
  local pod=$1 ip=$2 vip=$3 port=$4 before after out rc spid i
  before=$(policy_drops "$pod" ingress) || return 1
  ip netns exec "${WEFT_P}-$pod" timeout 20 nc -4 -lk "$port" >/dev/null 2>&1 &
  spid=$!
  for i in $(seq 100); do listening "$port" in_pod "$pod" && break; sleep 0.02; done
  if ! in_pod "$pod" nc -4 -z -w 2 "$ip" "$port" >/dev/null 2>&1; then
    kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
    echo "positive control failed: $pod does not accept TCP on $ip:$port"; return 1
  fi
  out=$(in_pod "$pod" nc -4 -v -z -w 2 "$vip" "$port" 2>&1); rc=$?
  kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
  [ "$rc" != 0 ] || { echo "$pod -> $vip:$port connected: not dropped"; return 1; }
  grep -q 'timed out' <<<"$out" || { echo "failed, but not as a dropped SYN does: $out"; return 1; }
  after=$(policy_drops "$pod" ingress) || return 1
  [ "$after" -gt "$before" ] || { echo "timed out, but no ingress policy drop counted ($before -> $after)"; return 1; }
}
svc_flow_in_ct() { # CLIENT-IP BACKEND-IP: a conntrack entry of a translated flow between them
  weftctl -o json map dump ct | jq -e --arg c "$1" --arg b "$2" \
    '[.[] | select(.src == $c and .dst == $b and .service != null)] | length > 0' >/dev/null
}

echo "== no Service yet: nothing translates the ClusterIP (negative control)"
check "no frontends listed" no_frontend "$VIP_B"
check "x/a -> $VIP_B:80 fails without the Service" eval '! svc_ok b a '"$VIP_B"' 80 80'

echo "== Services and their EndpointSlices through the watches"
check "ADDED Service y/svc-b ($VIP_B:80 -> 80)" push "$SVC" ADDED "$(svc y svc-b "$VIP_B" 80 80)"
check "ADDED EndpointSlice of y/svc-b (b)" push "$EPS" ADDED "$(slice y svc-b 80 TCP "$B")"
check "ADDED Service y/svc-bx ($VIP_BX:8080 -> 80)" push "$SVC" ADDED "$(svc y svc-bx "$VIP_BX" 8080 80)"
check "ADDED EndpointSlice of y/svc-bx (b)" push "$EPS" ADDED "$(slice y svc-bx 80 TCP "$B")"
check "ADDED Service y/svc-c ($VIP_C:80 -> 80)" push "$SVC" ADDED "$(svc y svc-c "$VIP_C" 80 80)"
check "ADDED EndpointSlice of y/svc-c (c)" push "$EPS" ADDED "$(slice y svc-c 80 TCP "$C")"
check "ADDED Service y/svc-u ($VIP_U:53/UDP -> 5353)" push "$SVC" ADDED "$(svc y svc-u "$VIP_U" 53 5353 UDP)"
check "ADDED EndpointSlice of y/svc-u (b)" push "$EPS" ADDED "$(slice y svc-u 5353 UDP "$B")"
check "service list: $VIP_B:80 -> b:80" eventually frontend "$VIP_B:80/TCP" "$B:80"
check "service list: $VIP_U:53 -> b:5353" eventually frontend "$VIP_U:53/UDP" "$B:5353"

echo "== translation by the datapath alone (no kube-proxy here)"
check "x/a -> $VIP_B:80 reaches b:80" svc_ok b a "$VIP_B" 80 80
check "conntrack has the translated flow a -> b with its frontend" svc_flow_in_ct "$A" "$B"
check "x/a -> $VIP_BX:8080 reaches b:80 (port translated)" svc_ok b a "$VIP_BX" 8080 80
check "UDP x/a -> $VIP_U:53 reaches b:5353, the echo comes from $VIP_U:53" udp_echo_ok b a "$VIP_U" 53 5353
check "hairpin: y/b -> its own $VIP_B:80" svc_ok b b "$VIP_B" 80 80

echo "== egress policy judges the backend, not the ClusterIP (upstream's failures)"
EG=$(np x egress-to-b "$(jq -nc '{podSelector:{matchLabels:{app:"a"}},policyTypes:["Egress"],
  egress:[{to:[{namespaceSelector:{matchLabels:{"kubernetes.io/metadata.name":"y"}},podSelector:{matchLabels:{app:"b"}}}],ports:[{port:80,protocol:"TCP"}]}]}')")
check "ADDED x/egress-to-b (egress to y/app=b:80 only)" apply_np ADDED "$EG"
check "x/a -> $VIP_B:80 (backend b) allowed" svc_ok b a "$VIP_B" 80 80
check_dropped "x/a -> $VIP_C:80 (backend c) dropped by policy" c a "$VIP_C" 80
check "DELETED x/egress-to-b" apply_np DELETED "$EG"
IPB=$(np x egress-ipblock "$(jq -nc --arg b "$B/32" '{podSelector:{matchLabels:{app:"a"}},policyTypes:["Egress"],
  egress:[{to:[{ipBlock:{cidr:$b}}]}]}')")
check "ADDED x/egress-ipblock (egress to b's /32 only)" apply_np ADDED "$IPB"
check "x/a -> $VIP_B:80 (backend in the ipBlock) allowed" svc_ok b a "$VIP_B" 80 80
check_dropped "x/a -> $VIP_C:80 (backend outside it) dropped by policy" c a "$VIP_C" 80
check "DELETED x/egress-ipblock" apply_np DELETED "$IPB"

echo "== hairpin under the pod's own ingress policy"
DENY=$(np y ingress-from-b "$(jq -nc '{podSelector:{},policyTypes:["Ingress"],ingress:[{from:[{podSelector:{matchLabels:{app:"b"}}}]}]}')")
check "ADDED y/ingress-from-b (ingress in y from app=b only)" apply_np ADDED "$DENY"
check "hairpin y/b -> its own $VIP_B:80 allowed (ingress from app=b)" svc_ok b b "$VIP_B" 80 80
check "hairpin y/c -> its own $VIP_C:80 dropped by its ingress policy" hairpin_dropped c "$C" "$VIP_C" 80
check "DELETED y/ingress-from-b" apply_np DELETED "$DENY"

echo "== a backend change, the Service deleted, a restart"
check "MODIFIED EndpointSlice of y/svc-b: c instead of b" push "$EPS" MODIFIED "$(slice y svc-b 80 TCP "$C")"
check "service list: $VIP_B:80 -> c:80" eventually frontend "$VIP_B:80/TCP" "$C:80"
check "x/a -> $VIP_B:80 now reaches c" svc_ok c a "$VIP_B" 80 80
ID_C=$(weftctl -o json service list | jq --arg a "$VIP_C" '[.[].frontends[] | select(.frontend.addr == $a) | .id][0]')
# The API server's lists now hold what was pushed (the replay serves its lists from the script).
weft_stop_manager
kill "$REPLAY_PID" 2>/dev/null; wait "$REPLAY_PID" 2>/dev/null
write_replay "$(list v1 Service "$(svc y svc-b "$VIP_B" 80 80)" "$(svc y svc-bx "$VIP_BX" 8080 80)" \
    "$(svc y svc-c "$VIP_C" 80 80)" "$(svc y svc-u "$VIP_U" 53 5353 UDP)")" \
  "$(list discovery.k8s.io/v1 EndpointSlice "$(slice y svc-b 80 TCP "$C")" "$(slice y svc-bx 80 TCP "$B")" \
    "$(slice y svc-c 80 TCP "$C")" "$(slice y svc-u 5353 UDP "$B")")"
rm -f "$WEFT_TMP/kubeconfig"
weft_start_replay
weft_start_manager --k8s --kubeconfig "$WEFT_TMP/kubeconfig" --k8s-cilium-policies false
same_id() {
  local id
  id=$(weftctl -o json service list | jq --arg a "$VIP_C" '[.[].frontends[] | select(.frontend.addr == $a) | .id][0]')
  [ "$id" = "$ID_C" ] || { echo "id $id, was $ID_C"; return 1; }
}
check "after a restart $VIP_C keeps its frontend id ($ID_C)" same_id
check "after a restart x/a -> $VIP_C:80 reaches c" svc_ok c a "$VIP_C" 80 80
check "DELETED Service y/svc-c" push "$SVC" DELETED "$(svc y svc-c "$VIP_C" 80 80)"
check "service list: $VIP_C gone" eventually no_frontend "$VIP_C"
check "x/a -> $VIP_C:80 fails again" eval '! svc_ok c a '"$VIP_C"' 80 80'
weft_summary
