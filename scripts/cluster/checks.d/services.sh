# Services (sourced by checks): a ClusterIP Service in front of web, reached from pods through
# Weft's own translation (docs/DATAPATH.md, "Services") beside kube-proxy's, with egress
# NetworkPolicy judging the backend pod rather than the ClusterIP: what the upstream egress tests
# probe. Every drop has its positive control.
A=$CK_NS_A B=$CK_NS_B
kc apply -f - >/dev/null <<EOT
apiVersion: v1
kind: Service
metadata: {name: web, namespace: $A}
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080, protocol: TCP}
  - {name: udp, port: 90, targetPort: 9080, protocol: UDP}
EOT
SVC_IP=$(kc -n "$A" get service web -o jsonpath='{.spec.clusterIP}')
echo "   (Service $A/web: $SVC_IP:80 -> web:8080, :90/UDP -> web:9080)"
svc_listed() { # the manager lists the frontend with web as its backend
  weftctl_ -o json service list | jq -e --arg s "$A/web" --arg ip "$SVC_IP" --arg web "$WEB_IP" \
    'any(.[]; .name == $s and any(.frontends[]; .frontend.addr == $ip and .frontend.port == 80
       and any(.backends[]; .addr == $web and .port == 8080)))' >/dev/null ||
    { weftctl_ service list; return 1; }
}
check "weftctl service list: $SVC_IP:80/TCP -> $WEB_IP:8080 (from the Service and its EndpointSlice)" eventually 20 svc_listed
check "no policy: $B/client reaches $A/web's ClusterIP :80 (control)" reaches "$B" client "$SVC_IP" 80
check "no policy: $B/client reaches the ClusterIP :90/UDP" reaches "$B" client "$SVC_IP" 90 udp

# Egress from B's role=client pods only to app=web pods in team=blue namespaces on 8080: the
# pod port; the ClusterIP's port 80 appears nowhere in the policy.
kc apply -f - >/dev/null <<EOT
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: clients-to-web-pods, namespace: $B}
spec:
  podSelector: {matchLabels: {role: client}}
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector: {matchLabels: {team: blue}}
      podSelector: {matchLabels: {app: web}}
    ports: [{port: 8080, protocol: TCP}]
EOT
check "egress to web pods on 8080: $B/client is dropped at web:8081 (policy in force)" eventually 20 dropped "$B" client "$WEB_IP" 8081
check "egress to web pods on 8080: $B/client reaches web through its ClusterIP :80" reaches "$B" client "$SVC_IP" 80
check "egress to web pods on 8080: $B/client is dropped at the ClusterIP :90/UDP (9080 not allowed)" dropped "$B" client "$SVC_IP" 90 udp
check "$B/intruder (not selected) reaches the ClusterIP :80 (control)" reaches "$B" intruder "$SVC_IP" 80
kc -n "$B" delete networkpolicy clients-to-web-pods >/dev/null

# Egress by ipBlock: web's own /32 allowed, so its ClusterIP is; with web's address in the
# except, it is not.
np_ipblock() { # EXCEPT-JSON
  kc apply -f - >/dev/null <<EOT
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: clients-ipblock, namespace: $B}
spec:
  podSelector: {matchLabels: {role: client}}
  policyTypes: [Egress]
  egress:
  - to:
    - ipBlock: {cidr: ${WEB_IP%.*}.0/24, except: $1}
EOT
}
np_ipblock '[]'
check "egress ipBlock containing web: $B/client reaches the ClusterIP :80" eventually 20 reaches "$B" client "$SVC_IP" 80
np_ipblock "[\"$WEB_IP/32\"]"
check "egress ipBlock with web in its except: $B/client is dropped at the ClusterIP :80" eventually 20 dropped "$B" client "$SVC_IP" 80
check "... while the ClusterIP still answers $B/intruder (control)" reaches "$B" intruder "$SVC_IP" 80
kc -n "$B" delete networkpolicy clients-ipblock >/dev/null
check "policy deleted: $B/client reaches the ClusterIP :80 again" eventually 20 reaches "$B" client "$SVC_IP" 80
check "hairpin: $A/web reaches its own ClusterIP :80" reaches "$A" web "$SVC_IP" 80
kc -n "$A" delete service web >/dev/null
svc_gone() {
  local l
  l=$(weftctl_ -o json service list) || { echo "weftctl service list failed: $l"; return 1; }
  ! jq -e --arg s "$A/web" 'any(.[]; .name == $s)' <<<"$l" >/dev/null || { echo "$l"; return 1; }
}
check "Service deleted: weftctl service list no longer has it" eventually 20 svc_gone
