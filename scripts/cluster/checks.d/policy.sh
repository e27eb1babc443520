# NetworkPolicy, CiliumNetworkPolicy and CiliumClusterwideNetworkPolicy through the real API
# server and CRDs, enforced by Weft (sourced by checks). Every drop has its positive control.
A=$CK_NS_A B=$CK_NS_B
apply() { kc apply -f - >/dev/null; }

check "no policy: $B/intruder reaches web:8080 (control)" reaches "$B" intruder "$WEB_IP" 8080
check "no policy: $B/client reaches web:8081 (control)" reaches "$B" client "$WEB_IP" 8081
check "no policy: $A/client reaches web:8080 (control)" reaches "$A" client "$WEB_IP" 8080

# Ingress to app=web on the port named http, only from role=client pods in team=red namespaces.
apply <<EOT
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-red-clients, namespace: $A}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: red}}
      podSelector: {matchLabels: {role: client}}
    ports: [{port: http}]
EOT
check "NetworkPolicy: $B/intruder is dropped at web:8080" eventually 20 dropped "$B" intruder "$WEB_IP" 8080
check "NetworkPolicy: $B/client (team=red, role=client) reaches web:http (8080)" reaches "$B" client "$WEB_IP" 8080
check "NetworkPolicy, named port: $B/client is dropped at web:8081 (not the port named http)" dropped "$B" client "$WEB_IP" 8081
check "NetworkPolicy: $A/client (team=blue) is dropped at web:8080" dropped "$A" client "$WEB_IP" 8080
policy_listed() { # NAME: a rule of the object NAME, with origin cluster, in `weftctl policy list`
  local l
  l=$(weftctl_ policy list) || return 1
  grep "$1" <<<"$l" | grep -w cluster >/dev/null || { echo "$l" | head -20; return 1; }
}
check "the rule is in Weft's repository, origin cluster (weftctl policy list)" eventually 5 policy_listed web-from-red-clients

kc label namespace "$A" team=red --overwrite >/dev/null
check "namespace label change: $A/client (now team=red) reaches web:8080" eventually 20 reaches "$A" client "$WEB_IP" 8080
kc label namespace "$A" team=blue --overwrite >/dev/null
check "... and is dropped again when back to team=blue" eventually 20 dropped "$A" client "$WEB_IP" 8080
kc -n "$B" label pod intruder role=client --overwrite >/dev/null
check "pod label change: $B/intruder relabelled role=client reaches web:8080" eventually 20 reaches "$B" intruder "$WEB_IP" 8080
kc -n "$B" label pod intruder role=intruder --overwrite >/dev/null
check "... and is dropped again as role=intruder" eventually 20 dropped "$B" intruder "$WEB_IP" 8080

# Egress from role=client pods of B: only to app=web pods in team=blue namespaces, port 8080.
apply <<EOT
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: clients-to-blue-web, namespace: $B}
spec:
  podSelector: {matchLabels: {role: client}}
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector: {matchLabels: {team: blue}}
      podSelector: {matchLabels: {app: web}}
    ports: [{port: 8080, protocol: TCP}]
EOT
kc -n "$A" delete networkpolicy web-from-red-clients >/dev/null
check "policy deleted: $B/intruder reaches web:8080 again" eventually 20 reaches "$B" intruder "$WEB_IP" 8080
check "egress NetworkPolicy: $B/client is dropped at web:8081" eventually 20 dropped "$B" client "$WEB_IP" 8081
check "egress NetworkPolicy: $B/client reaches web:8080" reaches "$B" client "$WEB_IP" 8080
check "egress NetworkPolicy: $B/intruder (not selected) reaches web:8081" reaches "$B" intruder "$WEB_IP" 8081
kc -n "$B" delete networkpolicy clients-to-blue-web >/dev/null
check "egress policy deleted: $B/client reaches web:8081 again" eventually 20 reaches "$B" client "$WEB_IP" 8081

# CiliumNetworkPolicy (cilium.io/v2, the CRD of conf/k8s/00-crds.yaml).
apply <<EOT
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: web-from-b-clients, namespace: $A}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress:
  - fromEndpoints:
    - matchLabels: {role: client, k8s:io.kubernetes.pod.namespace: $B}
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
EOT
check "CiliumNetworkPolicy: $B/intruder is dropped at web:8080" eventually 20 dropped "$B" intruder "$WEB_IP" 8080
check "CiliumNetworkPolicy: $B/client reaches web:8080" reaches "$B" client "$WEB_IP" 8080
check "CiliumNetworkPolicy: $A/client is dropped at web:8080" dropped "$A" client "$WEB_IP" 8080
kc -n "$A" delete ciliumnetworkpolicy web-from-b-clients >/dev/null
check "CiliumNetworkPolicy deleted: $A/client reaches web:8080" eventually 20 reaches "$A" client "$WEB_IP" 8080

# CiliumClusterwideNetworkPolicy: app=web anywhere accepts only role=intruder.
apply <<EOT
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: wck-web-from-intruders}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress:
  - fromEndpoints:
    - matchLabels: {role: intruder}
EOT
check "CiliumClusterwideNetworkPolicy: $B/client is dropped at web:8080" eventually 20 dropped "$B" client "$WEB_IP" 8080
check "CiliumClusterwideNetworkPolicy: $B/intruder reaches web:8080" reaches "$B" intruder "$WEB_IP" 8080
kc delete ciliumclusterwidenetworkpolicy wck-web-from-intruders >/dev/null
check "CiliumClusterwideNetworkPolicy deleted: $B/client reaches web:8080" eventually 20 reaches "$B" client "$WEB_IP" 8080
