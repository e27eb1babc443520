#!/usr/bin/env bash
# Kubernetes mode end to end, the NetworkPolicy defects of issue 25, through the real kube
# client against weft-k8s-replay as scripts/e2e/k8s.sh does, with real TCP between pods in three
# namespaces: an egress rule on a named port (upstream "should allow egress access on one named
# port"); a CIDR with host bits set (upstream's `<podIP>/4` with an except); `ipBlock 0.0.0.0/0`
# matching pods, in egress and ingress, alone and next to an unrelated /24 policy; a `NotIn`
# namespaceSelector that must select pods only (not `world`); and a
# NetworkPolicy and a CiliumNetworkPolicy with a rule Weft cannot express, which must still
# isolate their pods (fail closed) and say what was left out.
#
# Every drop is a check_dropped (scripts/lib.sh): the server accepts the connection from its own
# netns, the client's connect times out (neither refused nor unreachable), and the datapath's
# policy-drop counter for that flow (server ingress or client egress) moved meanwhile, so a tool
# error cannot pass for a drop; and each has a positive control beside it, the same client
# reaching another port or pod.
source "$(dirname "$0")/../lib.sh"
weft_need_replay
weft_plan 54
command -v curl >/dev/null || die "curl is missing: run scripts/setup"

NODE=$WEFT_P
NP=/apis/networking.k8s.io/v1/networkpolicies
CNP=/apis/cilium.io/v2/ciliumnetworkpolicies
CCNP=/apis/cilium.io/v2/ciliumclusterwidenetworkpolicies
ns() { # NAME
  jq -nc --arg n "$1" '{apiVersion:"v1",kind:"Namespace",
    metadata:{name:$n,resourceVersion:"10",uid:("uid-ns-"+$n),labels:{"kubernetes.io/metadata.name":$n}},
    spec:{finalizers:["kubernetes"]},status:{phase:"Active"}}'
}
# Every pod serves 80 and 81 under upstream's port names.
PORTS='[{"name":"serve-80-tcp","containerPort":80,"protocol":"TCP"},{"name":"serve-81-tcp","containerPort":81,"protocol":"TCP"}]'
pod() { # NS NAME APP
  jq -nc --arg ns "$1" --arg n "$WEFT_P-$2" --arg app "$3" --arg node "$NODE" --argjson ports "$PORTS" \
    '{apiVersion:"v1",kind:"Pod",metadata:{name:$n,namespace:$ns,uid:("uid-"+$n),resourceVersion:"100",labels:{app:$app}},
      spec:{nodeName:$node,serviceAccountName:"default",containers:[{name:"c",image:"agnhost",ports:$ports}]},
      status:{phase:"Pending"}}'
}
list() { # API_VERSION KIND ITEM...
  local av=$1 kind=$2; shift 2
  printf '%s\n' "$@" | jq -sc --arg av "$av" --arg k "${kind}List" '{apiVersion:$av,kind:$k,metadata:{resourceVersion:"100"},items:.}'
}
empty() { jq -nc --arg av "$1" --arg k "${2}List" '{apiVersion:$av,kind:$k,metadata:{resourceVersion:"100"},items:[]}'; }
node_obj=$(jq -nc --arg n "$NODE" '{apiVersion:"v1",kind:"Node",metadata:{name:$n,uid:"uid-node",resourceVersion:"5"},
  spec:{podCIDR:"10.0.16.0/24",podCIDRs:["10.0.16.0/24"]}}')
jq -n \
  --argjson node "$node_obj" \
  --argjson nodes "$(list v1 Node "$node_obj")" \
  --argjson pods "$(list v1 Pod "$(pod x a a)" "$(pod y b b)" "$(pod y c c)" "$(pod z d d)")" \
  --argjson nss "$(list v1 Namespace "$(ns x)" "$(ns y)" "$(ns z)")" \
  --argjson nps "$(empty networking.k8s.io/v1 NetworkPolicy)" \
  --argjson cnps "$(empty cilium.io/v2 CiliumNetworkPolicy)" \
  --argjson ccnps "$(empty cilium.io/v2 CiliumClusterwideNetworkPolicy)" \
  --argjson svcs "$(empty v1 Service)" \
  --argjson slices "$(empty discovery.k8s.io/v1 EndpointSlice)" \
  --arg nodepath "/api/v1/nodes/$NODE" --arg np "$NP" --arg cnp "$CNP" --arg ccnp "$CCNP" \
  '{objects:{($nodepath):$node},
    lists:{"/api/v1/nodes":[$nodes],"/api/v1/pods":[$pods],"/api/v1/namespaces":[$nss],
           ($np):[$nps],($cnp):[$cnps],($ccnp):[$ccnps],
           "/api/v1/services":[$svcs],"/apis/discovery.k8s.io/v1/endpointslices":[$slices]}}' >"$WEFT_TMP/replay.json"

weft_make_node
REPLAY_PID=
trap 'rc=$?; kill $REPLAY_PID 2>/dev/null; (exit $rc); weft_cleanup' EXIT
weft_start_replay
RV=30
# apply PATH TYPE OBJECT: pushes the event with a fresh resourceVersion, then waits until the
# manager's revision moved (the object's rules are in, or out).
apply() {
  local path=$1 type=$2 obj=$3 rev i
  rev=$(weftctl -o json status | jq .policy_revision)
  RV=$((RV + 1))
  replay_push "$path" "$(jq -nc --arg t "$type" --arg rv "$RV" --argjson o "$obj" '{type:$t,object:($o | .metadata.resourceVersion=$rv)}')" || return 1
  for i in $(seq 100); do
    [ "$(weftctl -o json status | jq .policy_revision)" -gt "$rev" ] && return 0
    sleep 0.05
  done
  echo "the revision stayed at $rev"; return 1
}
np() { # NS NAME SPEC-JSON
  jq -nc --arg ns "$1" --arg n "$2" --argjson spec "$3" \
    '{apiVersion:"networking.k8s.io/v1",kind:"NetworkPolicy",metadata:{name:$n,namespace:$ns,uid:("uid-np-"+$n),generation:1},spec:$spec}'
}

weft_start_manager --k8s --kubeconfig "$WEFT_TMP/kubeconfig"
k8s_pod() { # NS POD: CNI ADD with the kubelet's CNI_ARGS
  ip netns add "${WEFT_P}-$2" || return 1
  WEFT_PODS+=("$2")
  weft_netconf | weft_cni ADD "$WEFT_P-$2" "/run/netns/${WEFT_P}-$2" eth0 \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=$1;K8S_POD_NAME=$WEFT_P-$2"
}
for p in "x a" "y b" "y c" "z d"; do
  set -- $p
  k8s_pod "$1" "$2" >/dev/null || die "ADD $2 failed"
done
A=$(pod_ip a) B=$(pod_ip b) C=$(pod_ip c) D=$(pod_ip d)

metrics() { curl -sf --unix-socket "$WEFT_SOCK" http://weft/metrics; }
sample() { metrics | awk -v k="$1" 'substr($0, 1, length(k) + 1) == k " " {print $NF}'; }
traced() { # SRC-IP DST-IP PORT VERDICT: weftctl policy trace says VERDICT
  local got
  got=$(weftctl -o json policy trace --src "$1" --dst "$2" --dport "$3" --proto tcp | jq -r .verdict)
  [ "$got" = "$4" ] || { echo "trace says $got"; return 1; }
}
listed() { weftctl policy list | grep -F -- "$1" | matches -F -- "$2"; }

echo "== upstream: allow egress access on one named port (resolved on the destination pod)"
NAMED=$(np x egress-named "$(jq -nc '{podSelector:{matchLabels:{app:"a"}},policyTypes:["Egress"],
  egress:[{to:[{namespaceSelector:{matchLabels:{"kubernetes.io/metadata.name":"y"}}}],ports:[{port:"serve-80-tcp",protocol:"TCP"}]}]}')")
check "ADDED x/egress-named applied" apply "$NP" ADDED "$NAMED"
check "x/a -> y/b:80 (serve-80-tcp) allowed" tcp_ok b a "$B" 80
check_dropped "x/a -> y/b:81 dropped by policy" b a "$B" 81
check "x/a -> y/c:80 (serve-80-tcp) allowed" tcp_ok c a "$C" 80
check_dropped "x/a -> z/d:80 dropped by policy (not in y)" d a "$D" 80
check "trace: x/a -> y/b:80 allow" traced "$A" "$B" 80 allow
check "trace: x/a -> y/b:81 deny" traced "$A" "$B" 81 deny
fully_in_force() { # OBJECT: listed with its rules, and no "not enforced" or warning row for it
  local out
  out=$(weftctl policy list) || { echo "weftctl policy list failed"; return 1; }
  ! grep -F "$1" <<<"$out" | matches -e "not enforced" -e warning
}
check "the object is fully in force (no partial status)" fully_in_force "NetworkPolicy x/egress-named"
check "DELETED x/egress-named" apply "$NP" DELETED "$NAMED"

echo "== upstream: a CIDR with host bits (<podIP>/4) and an except for the server"
HOSTBITS=$(np x cidr-host-bits "$(jq -nc --arg c "$B/4" --arg e "$B/32" '{podSelector:{matchLabels:{app:"a"}},policyTypes:["Egress"],
  egress:[{to:[{ipBlock:{cidr:$c,except:[$e]}}]}]}')")
check "ADDED x/cidr-host-bits applied" apply "$NP" ADDED "$HOSTBITS"
check "x/a -> y/c:80 (inside the masked /4) allowed" tcp_ok c a "$C" 80
check_dropped "x/a -> y/b:80 (the except) dropped by policy" b a "$B" 80
check "trace: x/a -> y/b:80 deny" traced "$A" "$B" 80 deny
check "policy list warns about the host bits" listed cidr-host-bits "has host bits set: enforced as 0.0.0.0/4"
check "DELETED x/cidr-host-bits" apply "$NP" DELETED "$HOSTBITS"

echo "== ipBlock 0.0.0.0/0 matches pods (egress), alone and next to an unrelated /24 policy"
ALL_OUT=$(np x egress-all "$(jq -nc '{podSelector:{matchLabels:{app:"a"}},policyTypes:["Egress"],
  egress:[{to:[{ipBlock:{cidr:"0.0.0.0/0"}}],ports:[{port:80,protocol:"TCP"}]}]}')")
UNRELATED=$(np z unrelated-24 "$(jq -nc '{podSelector:{matchLabels:{app:"d"}},policyTypes:["Egress"],
  egress:[{to:[{ipBlock:{cidr:"10.0.16.0/24"}}]}]}')")
check "ADDED x/egress-all applied" apply "$NP" ADDED "$ALL_OUT"
check "x/a -> y/b:80 allowed (0.0.0.0/0 alone)" tcp_ok b a "$B" 80
check_dropped "x/a -> y/b:81 dropped by policy (the policy is in force)" b a "$B" 81
check "trace: x/a -> y/b:80 allow" traced "$A" "$B" 80 allow
check "ADDED z/unrelated-24 applied" apply "$NP" ADDED "$UNRELATED"
check "x/a -> y/b:80 allowed (with the /24 elsewhere)" tcp_ok b a "$B" 80
check_dropped "x/a -> y/b:81 still dropped by policy" b a "$B" 81
check "DELETED z/unrelated-24" apply "$NP" DELETED "$UNRELATED"
check "x/a -> y/b:80 allowed (the /24 gone again)" tcp_ok b a "$B" 80
check "trace: x/a -> y/b:80 allow" traced "$A" "$B" 80 allow
check "DELETED x/egress-all" apply "$NP" DELETED "$ALL_OUT"

echo "== ipBlock 0.0.0.0/0 matches pods (ingress)"
ALL_IN=$(np y ingress-all "$(jq -nc '{podSelector:{matchLabels:{app:"b"}},
  ingress:[{from:[{ipBlock:{cidr:"0.0.0.0/0"}}],ports:[{port:80,protocol:"TCP"}]}]}')")
check "ADDED y/ingress-all applied" apply "$NP" ADDED "$ALL_IN"
check "x/a -> y/b:80 allowed" tcp_ok b a "$B" 80
check_dropped "x/a -> y/b:81 dropped by policy" b a "$B" 81
check "trace: x/a -> y/b:80 allow" traced "$A" "$B" 80 allow
check "DELETED y/ingress-all" apply "$NP" DELETED "$ALL_IN"

echo "== upstream: egress to namespaces NotIn [y] selects pods only, never an address outside the cluster"
NOTIN=$(np x egress-not-in-y "$(jq -nc '{podSelector:{matchLabels:{app:"a"}},policyTypes:["Egress"],
  egress:[{to:[{namespaceSelector:{matchExpressions:[{key:"kubernetes.io/metadata.name",operator:"NotIn",values:["y"]}]}}]}]}')")
check "ADDED x/egress-not-in-y applied" apply "$NP" ADDED "$NOTIN"
check "x/a -> z/d:80 allowed (z is not y)" tcp_ok d a "$D" 80
check_dropped "x/a -> y/b:80 dropped by policy" b a "$B" 80
check "trace: x/a -> z/d:80 allow" traced "$A" "$D" 80 allow
check "trace: x/a -> 192.0.2.1:80 (world, no namespace) deny" traced "$A" 192.0.2.1 80 deny
check "DELETED x/egress-not-in-y" apply "$NP" DELETED "$NOTIN"

echo "== a NetworkPolicy with a rule Weft cannot express still isolates its pods"
# egress[0] names a port towards an ipBlock (not expressible); egress[1] allows 81 to x.
UNEXPR=$(np y unexpressible "$(jq -nc '{podSelector:{matchLabels:{app:"c"}},policyTypes:["Egress"],
  egress:[{to:[{ipBlock:{cidr:"10.0.16.0/24"}}],ports:[{port:"serve-80-tcp",protocol:"TCP"}]},
          {to:[{namespaceSelector:{matchLabels:{"kubernetes.io/metadata.name":"x"}}}],ports:[{port:81,protocol:"TCP"}]}]}')")
check "ADDED y/unexpressible applied" apply "$NP" ADDED "$UNEXPR"
check "y/c -> x/a:81 allowed (the rule that can be expressed)" tcp_ok a c "$A" 81
check_dropped "y/c -> x/a:80 dropped by policy (the rule left out allows nothing)" a c "$A" 80
check "trace: y/c -> x/a:80 deny" traced "$C" "$A" 80 deny
check "policy list names what is not enforced" listed "NetworkPolicy y/unexpressible" "not enforced"
check "... with its field path" listed "NetworkPolicy y/unexpressible" "spec.egress[0].ports: not supported yet: a named port (serve-80-tcp)"
check "weft_k8s_policies_partially_enforced{kind=NetworkPolicy} = 1" \
  test "$(sample 'weft_k8s_policies_partially_enforced{kind="NetworkPolicy"}')" = 1
check "weft_k8s_policies_rejected{kind=NetworkPolicy} = 0" \
  test "$(sample 'weft_k8s_policies_rejected{kind="NetworkPolicy"}')" = 0
check "DELETED y/unexpressible" apply "$NP" DELETED "$UNEXPR"
check "y/c -> x/a:80 allowed again" tcp_ok a c "$A" 80

echo "== a CiliumNetworkPolicy with a rule Weft cannot express still isolates its pods"
FQDN=$(jq -nc '{apiVersion:"cilium.io/v2",kind:"CiliumNetworkPolicy",
  metadata:{name:"fqdn",namespace:"z",uid:"uid-cnp-fqdn",generation:1},
  spec:{endpointSelector:{matchLabels:{app:"d"}},
    egress:[{toFQDNs:[{matchName:"example.com"}]},
            {toEndpoints:[{matchLabels:{"k8s:io.kubernetes.pod.namespace":"x"}}],toPorts:[{ports:[{port:"81",protocol:"TCP"}]}]}]}}')
check "ADDED z/fqdn applied" apply "$CNP" ADDED "$FQDN"
check "z/d -> x/a:81 allowed" tcp_ok a d "$A" 81
check_dropped "z/d -> x/a:80 dropped by policy" a d "$A" 80
check "policy list names the toFQDNs rule" listed "CiliumNetworkPolicy z/fqdn" 'spec.egress[0].toFQDNs: not supported yet'
check "weft_k8s_policies_partially_enforced{kind=CiliumNetworkPolicy} = 1" \
  test "$(sample 'weft_k8s_policies_partially_enforced{kind="CiliumNetworkPolicy"}')" = 1
check "DELETED z/fqdn" apply "$CNP" DELETED "$FQDN"
check "z/d -> x/a:80 allowed again" tcp_ok a d "$A" 80
weft_summary
