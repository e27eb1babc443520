#!/usr/bin/env bash
# Kubernetes mode end to end, without a kube-apiserver: weft-manager --k8s runs its real kube
# client against weft-k8s-replay (a local server playing the API server from a script, events
# pushed into its watches) and pods get real traffic. Covers the whole path watch → labels →
# identity → policy → traffic, with the upstream network-policy e2e cases that need namespace
# labels or named ports: "namespaceSelector with matchExpressions" (on a key other than the
# namespace name) and "allow ingress access on one named port". Last, a CNI ADD that comes
# before its pod's watch event: the manager waits for the pod (5 s, POD_WAIT in
# manager/src/daemon/k8s.rs), and a pod that comes later relabels its endpoint.
source "$(dirname "$0")/../lib.sh"
weft_need_replay
weft_plan 45
command -v curl >/dev/null || die "curl is missing: run scripts/setup"

NODE=$WEFT_P
ns() { # NAME TEAM
  jq -nc --arg n "$1" --arg t "$2" '{apiVersion:"v1",kind:"Namespace",
    metadata:{name:$n,resourceVersion:"10",uid:("uid-ns-"+$n),
      labels:{"kubernetes.io/metadata.name":$n,team:$t}},spec:{finalizers:["kubernetes"]},status:{phase:"Active"}}'
}
pod() { # NS NAME APP [PORTS-JSON]
  jq -nc --arg ns "$1" --arg n "$WEFT_P-$2" --arg app "$3" --arg node "$NODE" --argjson ports "${4:-[]}" \
    '{apiVersion:"v1",kind:"Pod",metadata:{name:$n,namespace:$ns,uid:("uid-"+$n),resourceVersion:"100",labels:{app:$app}},
      spec:{nodeName:$node,serviceAccountName:"default",containers:[{name:"c",image:"agnhost",ports:$ports}]},
      status:{phase:"Pending"}}'
}
np_ns_expr() {
  jq -nc '{apiVersion:"networking.k8s.io/v1",kind:"NetworkPolicy",
    metadata:{name:"allow-ns-team-billing",namespace:"srv",uid:"uid-np-1",resourceVersion:"20",generation:1},
    spec:{podSelector:{matchLabels:{app:"server"}},policyTypes:["Ingress"],
      ingress:[{from:[{namespaceSelector:{matchExpressions:[{key:"team",operator:"In",values:["billing","audit"]}]}}]}]}}'
}
np_named_port() {
  jq -nc '{apiVersion:"networking.k8s.io/v1",kind:"NetworkPolicy",
    metadata:{name:"allow-serve-80",namespace:"srv",uid:"uid-np-2",resourceVersion:"21",generation:1},
    spec:{podSelector:{matchLabels:{app:"server"}},policyTypes:["Ingress"],
      ingress:[{from:[{namespaceSelector:{}}],ports:[{port:"serve-80",protocol:"TCP"}]}]}}'
}
list() { # API_VERSION KIND ITEM...
  local av=$1 kind=$2; shift 2
  printf '%s\n' "$@" | jq -sc --arg av "$av" --arg k "${kind}List" '{apiVersion:$av,kind:$k,metadata:{resourceVersion:"100"},items:.}'
}
# Service srv/web: its EndpointSlice needs the server pod's IP, which IPAM gives at the CNI ADD
# (after this script is written): none is listed, so the frontend has no backends.
svc_web() {
  jq -nc '{apiVersion:"v1",kind:"Service",metadata:{name:"web",namespace:"srv",uid:"uid-svc-web",resourceVersion:"30"},
    spec:{type:"ClusterIP",clusterIP:"10.96.0.10",clusterIPs:["10.96.0.10"],ipFamilies:["IPv4"],ipFamilyPolicy:"SingleStack",
      selector:{app:"server"},ports:[{name:"http",port:80,protocol:"TCP",targetPort:8080}],
      sessionAffinity:"None",internalTrafficPolicy:"Cluster"},status:{loadBalancer:{}}}'
}
SERVER_PORTS='[{"name":"serve-80","containerPort":80,"protocol":"TCP"},{"name":"serve-81","containerPort":81,"protocol":"TCP"}]'
node_obj=$(jq -nc --arg n "$NODE" '{apiVersion:"v1",kind:"Node",metadata:{name:$n,uid:"uid-node",resourceVersion:"5"},
  spec:{podCIDR:"10.0.16.0/24",podCIDRs:["10.0.16.0/24"]}}')
jq -n \
  --argjson node "$node_obj" \
  --argjson nodes "$(list v1 Node "$node_obj")" \
  --argjson pods "$(list v1 Pod "$(pod srv server server "$SERVER_PORTS")" "$(pod billing client-b client)" "$(pod ops client-c client)")" \
  --argjson nss "$(list v1 Namespace "$(ns srv platform)" "$(ns billing billing)" "$(ns ops ops)")" \
  --argjson nps "$(list networking.k8s.io/v1 NetworkPolicy "$(np_ns_expr)")" \
  --argjson svcs "$(list v1 Service "$(svc_web)")" \
  --argjson slices "$(list discovery.k8s.io/v1 EndpointSlice)" \
  --arg nodepath "/api/v1/nodes/$NODE" \
  '{objects:{($nodepath):$node},
    lists:{"/api/v1/nodes":[$nodes],"/api/v1/pods":[$pods],"/api/v1/namespaces":[$nss],
           "/apis/networking.k8s.io/v1/networkpolicies":[$nps],
           "/api/v1/services":[$svcs],"/apis/discovery.k8s.io/v1/endpointslices":[$slices]}}' >"$WEFT_TMP/replay.json"

weft_make_node
# The manager lives in the node netns: so does its API server.
REPLAY_PID=
trap 'rc=$?; kill $REPLAY_PID 2>/dev/null; (exit $rc); weft_cleanup' EXIT
weft_start_replay

weft_start_manager --k8s --kubeconfig "$WEFT_TMP/kubeconfig" --k8s-cilium-policies false
# k8s_pod NS POD: CNI ADD with the kubelet's CNI_ARGS.
k8s_pod() {
  ip netns add "${WEFT_P}-$2" || return 1
  WEFT_PODS+=("$2")
  weft_netconf | weft_cni ADD "$WEFT_P-$2" "/run/netns/${WEFT_P}-$2" eth0 \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=$1;K8S_POD_NAME=$WEFT_P-$2"
}
echo "== pods get their labels from the pod and namespace watches"
pool_is() { weftctl -o json status | jq -e --arg c "$1" '.pools[0].cidr == $c' >/dev/null; }
check "the Node's podCIDR is the pool" pool_is 10.0.16.0/24
for p in "srv server" "billing client-b" "ops client-c"; do
  set -- $p
  k8s_pod "$1" "$2" >/dev/null || die "ADD $2 failed"
done
has_label() { # POD KEY VALUE
  weftctl -o json endpoint list | jq -e --arg c "$WEFT_P-$1" --arg k "$2" --arg v "$3" \
    'any(.[] | select(.container_id == $c) | .labels[]; .key == $k and .value == $v)' >/dev/null
}
check "client-b carries its namespace's team label" has_label client-b k8s:io.cilium.k8s.namespace.labels.team billing
check "server carries its pod label" has_label server k8s:app server
SRV=$(pod_ip server)
listed() { weftctl policy list | grep "$1" | matches "$2"; }
check "the cluster's NetworkPolicy is listed with its origin" listed allow-ns-team-billing cluster

echo "== upstream: namespaceSelector with matchExpressions (key team, not the namespace name)"
check "billing (team In [billing,audit]) -> server:80 allowed" tcp_ok server client-b "$SRV" 80
check_dropped "ops -> server:80 dropped" server client-c "$SRV" 80

echo "== a namespace label change re-identifies its pods"
id_before=$(weftctl -o json endpoint list | jq -r --arg c "$WEFT_P-client-c" '.[] | select(.container_id == $c) | .identity')
check "MODIFIED namespace ops team=audit pushed" replay_push /api/v1/namespaces \
  "$(jq -nc --argjson o "$(ns ops audit | jq -c '.metadata.resourceVersion="11"')" '{type:"MODIFIED",object:$o}')"
moved() { # POD OLD-ID
  local i
  for i in $(seq 100); do
    [ "$(weftctl -o json endpoint list | jq -r --arg c "$WEFT_P-$1" '.[] | select(.container_id == $c) | .identity')" != "$2" ] && return 0
    sleep 0.05
  done
  return 1
}
check "client-c got a new identity" moved client-c "$id_before"
check "ops (now team=audit) -> server:80 allowed" tcp_ok server client-c "$SRV" 80

echo "== upstream: allow ingress access on one named port (policy replaced through the watch)"
rev=$(weftctl -o json status | jq .policy_revision)
check "DELETED the namespace policy pushed" replay_push /apis/networking.k8s.io/v1/networkpolicies \
  "$(jq -nc --argjson o "$(np_ns_expr | jq -c '.metadata.resourceVersion="22"')" '{type:"DELETED",object:$o}')"
check "ADDED the named-port policy pushed" replay_push /apis/networking.k8s.io/v1/networkpolicies \
  "$(jq -nc --argjson o "$(np_named_port | jq -c '.metadata.resourceVersion="23"')" '{type:"ADDED",object:$o}')"
applied() {
  local i
  for i in $(seq 100); do
    weftctl policy list | matches allow-serve-80 && ! weftctl policy list | matches allow-ns-team-billing && return 0
    sleep 0.05
  done
  return 1
}
check "the repository holds only the named-port policy" applied
rev_above() { [ "$(weftctl -o json status | jq .policy_revision)" -gt "$1" ]; }
check "the revision moved" rev_above "$rev"
check "ops -> server:80 (serve-80) allowed" tcp_ok server client-c "$SRV" 80
check_dropped "ops -> server:81 (serve-81, not allowed) dropped" server client-c "$SRV" 81
check "billing -> server:80 allowed" tcp_ok server client-b "$SRV" 80
check_dropped "billing -> server:81 dropped" server client-b "$SRV" 81
trace80=$(weftctl -o json policy trace --src "$(pod_ip client-b)" --dst "$SRV" --dport 80 --proto tcp | jq -r .verdict)
check "policy trace resolves the named port like the datapath" test "$trace80" = allow

echo "== the policy deleted with its object"
check "DELETED pushed" replay_push /apis/networking.k8s.io/v1/networkpolicies \
  "$(jq -nc --argjson o "$(np_named_port | jq -c '.metadata.resourceVersion="24"')" '{type:"DELETED",object:$o}')"
gone() { local i; for i in $(seq 100); do weftctl policy list | matches allow-serve-80 || return 0; sleep 0.05; done; return 1; }
check "its rules are gone" gone
check "ops -> server:81 allowed again" tcp_ok server client-c "$SRV" 81

echo "== a rejected policy is visible in policy list and the metrics"
# Only what decides whom a cluster object isolates can reject it (docs/POLICY.md, "Cluster
# objects fail closed"); the API server validates selectors, the replaying server does not.
np_bad_selector() {
  jq -nc '{apiVersion:"networking.k8s.io/v1",kind:"NetworkPolicy",
    metadata:{name:"bad-selector",namespace:"srv",uid:"uid-np-3",resourceVersion:"25",generation:1},
    spec:{podSelector:{matchExpressions:[{key:"app",operator:"Near",values:["server"]}]},policyTypes:["Egress"],
      egress:[{to:[{namespaceSelector:{}}],ports:[{port:"serve-80",protocol:"TCP"}]}]}}'
}
check "ADDED a policy with an invalid podSelector pushed" replay_push /apis/networking.k8s.io/v1/networkpolicies \
  "$(jq -nc --argjson o "$(np_bad_selector)" '{type:"ADDED",object:$o}')"
rejected() { local i; for i in $(seq 100); do weftctl policy list | matches 'bad-selector.*unknown operator "Near"' && return 0; sleep 0.05; done; return 1; }
check "policy list shows it rejected, saying why" rejected
curl -sf --unix-socket "$WEFT_SOCK" http://weft/metrics >"$WEFT_TMP/metrics.txt" || die "scraping /metrics failed"
sample() { awk -v k="$1" 'substr($0, 1, length(k) + 1) == k " " {print $NF}' "$WEFT_TMP/metrics.txt"; }
check "weft_k8s_policies_rejected{kind=NetworkPolicy} = 1" test "$(sample 'weft_k8s_policies_rejected{kind="NetworkPolicy"}')" = 1
check "weft_k8s_policy_rejections_total{kind=NetworkPolicy} = 1" test "$(sample 'weft_k8s_policy_rejections_total{kind="NetworkPolicy"}')" = 1
np_events() { sample "weft_k8s_watch_events_total{resource=\"NetworkPolicy\",type=\"$1\"}"; }
check "NetworkPolicy events: 1 listed, 2 applied, 2 deleted" test "$(np_events list) $(np_events apply) $(np_events delete)" = "1 2 2"
check "3 namespaces listed" test "$(sample 'weft_k8s_watch_events_total{resource="namespaces",type="list"}')" = 3
check "the namespace label change counted" test "$(sample 'weft_k8s_watch_events_total{resource="namespaces",type="apply"}')" -ge 1
check "lists counted" test "$(sample weft_k8s_watch_lists_total)" -ge 4

echo "== a CNI ADD before its pod's watch event"
# The manager waits up to 5 s for the pod (POD_WAIT): a pod that comes during the wait labels the
# endpoint at once; one that comes later relabels it, and policy follows the new labels.
late_pod() { # NAME resourceVersion: the ADDED event of pod NAME (namespace ops, app=late)
  jq -nc --argjson o "$(pod ops "$1" late | jq -c --arg rv "$2" '.metadata.resourceVersion=$rv')" '{type:"ADDED",object:$o}'
}
late_add() { # NAME: CNI ADD of pod NAME in the background; sets LATE_PID
  ip netns add "${WEFT_P}-$1" || die "cannot create netns ${WEFT_P}-$1"
  WEFT_PODS+=("$1")
  weft_netconf | weft_cni ADD "$WEFT_P-$1" "/run/netns/${WEFT_P}-$1" eth0 \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=ops;K8S_POD_NAME=$WEFT_P-$1" >"$WEFT_TMP/add-$1.out" 2>&1 &
  LATE_PID=$!
}
endpoint_of() { weftctl -o json endpoint list | jq -c --arg c "$WEFT_P-$1" '.[] | select(.container_id == $c)'; }
wait_warned() { # NAME: the manager logged that the pod was not in the cache after the wait
  grep "not in the watch cache" "$WEFT_TMP/manager.log" | matches -F "ops/$WEFT_P-$1"
}
late_add late-a
# The ADD is waiting for the pod (the wait is 5 s; the pod comes 1 s into it).
sleep 1
check "late-a: the ADD is still waiting for its pod 1 s in" kill -0 "$LATE_PID"
check "late-a's pod pushed during the wait" replay_push /api/v1/pods "$(late_pod late-a 200)"
wait "$LATE_PID"; add_rc=$?
check "late-a: the ADD succeeded" test "$add_rc" = 0
# Labelled by the ADD itself: a relabel afterwards (the pod came after the wait) would log it.
relabel_logged() { grep "endpoint labels follow the pod" "$WEFT_TMP/manager.log" | matches -F "ops/$WEFT_P-$1"; }
labelled_by_add() { has_label "$1" k8s:app late && ! relabel_logged "$1"; }
check "late-a's endpoint has its pod label from the ADD itself (no relabel)" labelled_by_add late-a
not_warned() { ! wait_warned "$1"; }
check "late-a: no 'not in the watch cache' warning" not_warned late-a

late_add late-b
wait "$LATE_PID"; add_rc=$?
check "late-b: the ADD without its pod succeeded after the wait" test "$add_rc" = 0
ns_only() { has_label "$1" k8s:io.kubernetes.pod.namespace ops && ! has_label "$1" k8s:app late; }
check "late-b: namespace-only labels (its namespace, no pod label)" ns_only late-b
check "late-b: the manager logged that the wait expired" wait_warned late-b
id_b=$(endpoint_of late-b | jq -r .identity)
np_late() {
  jq -nc '{apiVersion:"networking.k8s.io/v1",kind:"NetworkPolicy",
    metadata:{name:"allow-clients-to-late",namespace:"ops",uid:"uid-np-4",resourceVersion:"26",generation:1},
    spec:{podSelector:{matchLabels:{app:"late"}},policyTypes:["Ingress"],
      ingress:[{from:[{namespaceSelector:{},podSelector:{matchLabels:{app:"client"}}}],ports:[{port:80,protocol:"TCP"}]}]}}'
}
check "ADDED a policy selecting app=late pushed" replay_push /apis/networking.k8s.io/v1/networkpolicies \
  "$(jq -nc --argjson o "$(np_late)" '{type:"ADDED",object:$o}')"
late_listed() { weftctl policy list | matches allow-clients-to-late; }
check "the policy is applied" eventually late_listed
LATE_B=$(pod_ip late-b)
check "before its pod: late-a -> late-b:80 allowed (late-b not selected yet)" tcp_ok late-b late-a "$LATE_B" 80
check "late-b's pod pushed after the wait" replay_push /api/v1/pods "$(late_pod late-b 201)"
relabelled() { local _; for _ in $(seq 100); do has_label late-b k8s:app late && return 0; sleep 0.05; done; return 1; }
check "late-b relabelled: it carries its pod label" relabelled
check "late-b has a new identity" test "$(endpoint_of late-b | jq -r .identity)" != "$id_b"
check_dropped "after the relabel: late-a (app=late) -> late-b:80 dropped" late-b late-a "$LATE_B" 80
check "after the relabel: billing (app=client) -> late-b:80 allowed" tcp_ok late-b client-b "$LATE_B" 80
weft_summary
