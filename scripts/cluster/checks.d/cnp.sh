# ClusterNetworkPolicy (policy.networking.k8s.io/v1beta1, the CRD of conf/k8s/) through the real
# API server, enforced by Weft (sourced by checks): what the network-policy-api conformance suite
# does not look at — the object's status, `policy trace` naming the tier rule, a priority patch
# flipping a flow, the Admin tier over a NetworkPolicy, Pass into a NetworkPolicy, the Baseline
# tier only for pods no NetworkPolicy selects, a ClusterIP judged on its backend, enforcement
# kept across a manager restart. Every drop has its positive control.
A=$CK_NS_A B=$CK_NS_B
apply() { kc apply -f - >/dev/null; }
cnp_cleanup() { kc delete clusternetworkpolicies.policy.networking.k8s.io --all >/dev/null 2>&1; }
CK_RESTORE+=("cnp_cleanup")
B_CLIENT_IP=$(pod_ip "$B" client)

check "no policy: $B/client reaches web:8080 (control)" reaches "$B" client "$WEB_IP" 8080
check "no policy: $B/intruder reaches web:8081 (control)" reaches "$B" intruder "$WEB_IP" 8081

# Admin: deny team=red namespaces into app=web, above a NetworkPolicy that allows them.
apply <<EOT
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-red, namespace: $A}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: red}}
EOT
check "NetworkPolicy allows $B (team=red) into web:8080 (control)" eventually 20 reaches "$B" client "$WEB_IP" 8080
apply <<EOT
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: weft-ck-deny-red}
spec:
  tier: Admin
  priority: 30
  subject:
    pods:
      namespaceSelector: {matchLabels: {team: blue}}
      podSelector: {matchLabels: {app: web}}
  ingress:
  - name: pass-intruder-8081
    action: Pass
    from:
    - pods:
        namespaceSelector: {matchLabels: {team: red}}
        podSelector: {matchLabels: {role: intruder}}
    protocols: [{tcp: {destinationPort: {number: 8081}}}]
  - name: deny-red
    action: Deny
    from:
    - namespaces: {matchLabels: {team: red}}
EOT
check "Admin Deny beats the NetworkPolicy: $B/client is dropped at web:8080" eventually 20 dropped "$B" client "$WEB_IP" 8080
check "Admin Pass (rule 0) hands $B/intruder:8081 to the NetworkPolicy, which allows it" reaches "$B" intruder "$WEB_IP" 8081
check "... and the Deny (rule 1) still drops $B/intruder at 8080" dropped "$B" intruder "$WEB_IP" 8080
check "$A/client (team=blue) is dropped by the NetworkPolicy's default deny (not selected by the tier rule)" dropped "$A" client "$WEB_IP" 8080
accepted() { # NAME STATUS: the object's Accepted condition has that status, for its generation
  local j
  j=$(kc get clusternetworkpolicies.policy.networking.k8s.io "$1" -o json) || return 1
  jq -e --arg s "$2" '.metadata.generation as $g | any(.status.conditions[]?; .type == "Accepted" and .status == $s and .observedGeneration == $g)' <<<"$j" >/dev/null ||
    { jq -c '.status' <<<"$j"; return 1; }
}
check "status: Accepted=True, at the object's generation" eventually 20 accepted weft-ck-deny-red True
traced() { # SRC_IP DPORT WORDS...: the ingress decision of SRC -> web:DPORT names them all
  local out w
  out=$(weftctl_ -o json policy trace --src "$1" --dst "$WEB_IP" --dport "$2" --proto tcp) || return 1
  shift 2
  for w in "$@"; do grep -F -- "$w" <<<"$(jq -r .ingress <<<"$out")" >/dev/null || { echo "$out"; return 1; }; done
}
check "policy trace names the tier, the rule, the priority and the object" traced "$B_CLIENT_IP" 8080 "denied by Admin tier rule 1" '"deny-red"' "priority 30" weft-ck-deny-red
cnp_listed() {
  local l
  l=$(weftctl_ policy list) || return 1
  grep weft-ck-deny-red <<<"$l" >/dev/null || { echo "$l" | head -20; return 1; }
}
check "the object's rules are in weftctl policy list" eventually 5 cnp_listed

# A priority patch: an Accept for team=red at priority 20 comes before the Deny at 30; moved to
# 40 it comes after.
apply <<EOT
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: weft-ck-accept-red}
spec:
  tier: Admin
  priority: 20
  subject:
    namespaces: {matchLabels: {team: blue}}
  ingress:
  - action: Accept
    from:
    - namespaces: {matchLabels: {team: red}}
    protocols: [{tcp: {destinationPort: {number: 8080}}}]
EOT
check "Admin Accept at priority 20 before the Deny at 30: $B/client reaches web:8080" eventually 20 reaches "$B" client "$WEB_IP" 8080
kc patch clusternetworkpolicies.policy.networking.k8s.io weft-ck-accept-red --type=merge -p '{"spec":{"priority":40}}' >/dev/null
check "priority patched to 40: the Deny at 30 comes first, $B/client is dropped" eventually 20 dropped "$B" client "$WEB_IP" 8080
kc delete clusternetworkpolicies.policy.networking.k8s.io weft-ck-accept-red weft-ck-deny-red >/dev/null
check "objects deleted: the NetworkPolicy alone decides, $B/client reaches web:8080" eventually 20 reaches "$B" client "$WEB_IP" 8080
kc -n "$A" delete networkpolicy web-from-red >/dev/null

# Baseline: deny everything into team=blue namespaces; only pods no NetworkPolicy selects get it.
apply <<EOT
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: weft-ck-baseline}
spec:
  tier: Baseline
  priority: 10
  subject:
    namespaces: {matchLabels: {team: blue}}
  ingress:
  - action: Deny
    from:
    - namespaces: {}
EOT
check "Baseline Deny: $B/client is dropped at web:8081 (no NetworkPolicy selects web)" eventually 20 dropped "$B" client "$WEB_IP" 8081
apply <<EOT
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-8081, namespace: $A}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - ports: [{port: 8081}]
EOT
check "a NetworkPolicy selecting web overrides the Baseline: $B/client reaches web:8081" eventually 20 reaches "$B" client "$WEB_IP" 8081
check "... and its default deny is final: $B/client is dropped at web:8080" dropped "$B" client "$WEB_IP" 8080
kc -n "$A" delete networkpolicy web-8081 >/dev/null
kc delete clusternetworkpolicies.policy.networking.k8s.io weft-ck-baseline >/dev/null
check "Baseline deleted: $B/client reaches web:8081" eventually 20 reaches "$B" client "$WEB_IP" 8081

# Egress through a ClusterIP: the Admin rule names the backend pods, never the ClusterIP.
kc apply -f - >/dev/null <<EOT
apiVersion: v1
kind: Service
metadata: {name: web-cnp, namespace: $A}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
EOT
SVC_IP=$(kc -n "$A" get service web-cnp -o jsonpath='{.spec.clusterIP}')
check "no policy: $B/client reaches the ClusterIP $SVC_IP:80 (control)" eventually 20 reaches "$B" client "$SVC_IP" 80
apply <<EOT
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: weft-ck-egress}
spec:
  tier: Admin
  priority: 5
  subject:
    pods:
      namespaceSelector: {matchLabels: {team: red}}
      podSelector: {matchLabels: {role: client}}
  egress:
  - action: Deny
    to:
    - pods:
        namespaceSelector: {matchLabels: {team: blue}}
        podSelector: {matchLabels: {app: web}}
EOT
check "Admin egress Deny to app=web pods: $B/client is dropped at the ClusterIP :80" eventually 20 dropped "$B" client "$SVC_IP" 80
check "... and at the pod address :8080" dropped "$B" client "$WEB_IP" 8080
check "... $B/intruder (not the subject) still reaches the ClusterIP" reaches "$B" intruder "$SVC_IP" 80

# The manager restarted: the tier rules are enforced again from the API server's objects.
restarts=$(weft_restarts)
pids=$(manager_pids)
[ -n "$pids" ] && kill -9 $pids
restarted() { [ "$(weft_restarts)" -gt "$restarts" ] && weft_ready; }
check "the manager (pid ${pids:-none found}) was killed, restarted and is ready" eventually 90 restarted
check "after the restart: $B/client is still dropped at web:8080" eventually 20 dropped "$B" client "$WEB_IP" 8080
check "after the restart: $B/intruder still reaches web:8080 (control)" reaches "$B" intruder "$WEB_IP" 8080
kc delete clusternetworkpolicies.policy.networking.k8s.io weft-ck-egress >/dev/null
kc -n "$A" delete service web-cnp >/dev/null
check "all deleted: $B/client reaches web:8080 again" eventually 20 reaches "$B" client "$WEB_IP" 8080
