# The manager with the Cilium CRDs absent and with its ClusterRole missing a verb: a clear
# status and log, never a crash loop, ready again once fixed (sourced by checks).
A=$CK_NS_A B=$CK_NS_B
CRDS=$CL_ROOT/conf/k8s/00-crds.yaml
RBAC=$CL_ROOT/conf/k8s/01-rbac.yaml
warning_matches() { # ERE: a line of the manager's status warnings matches
  local w
  w=$(weftctl_ -o json status | jq -r '.warnings[]?') || return 1
  grep -qE "$1" <<<"$w" || { echo "warnings: ${w:-none}"; return 1; }
}
no_warnings() { local w; w=$(weftctl_ -o json status | jq -r '.warnings[]?'); [ -z "$w" ] || { echo "warnings: $w"; return 1; }; }
log_has() { weft_log | grep -F "$1" >/dev/null || { weft_log | tail -5; return 1; }; }
# restart_manager: a new pod of the DaemonSet (the kubelet starts it at once).
weft_running() {
  [ -n "$(weft_pods_ -o jsonpath='{.items[0].status.containerStatuses[0].state.running}')" ]
}
restart_manager() {
  kc -n kube-system delete pod -l k8s-app=weft --wait=true --timeout=60s >/dev/null
  eventually 60 weft_running >/dev/null
}
kc apply -f - >/dev/null <<EOT
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-clients, namespace: $A}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from:
    - namespaceSelector: {}
      podSelector: {matchLabels: {role: client}}
EOT
check "a NetworkPolicy in force: $B/intruder is dropped at web:8080" eventually 20 dropped "$B" intruder "$WEB_IP" 8080

echo "   -- the Cilium CRDs deleted"
CK_RESTORE+=("kc apply -f '$CRDS'")
kc delete -f "$CRDS" --wait=true >/dev/null
check "the running manager's status says the CRD is not installed" \
  eventually 60 warning_matches '^CiliumNetworkPolicy: its CRD is not installed'
check "... and its log names the CRD and the fix" log_has 'CRD ciliumnetworkpolicies.cilium.io is not installed'
restart_manager
check "restarted without the CRDs, the manager turns ready" eventually 90 weft_ready
check "... its status names both missing CRDs" \
  warning_matches '^CiliumClusterwideNetworkPolicy: its CRD is not installed'
check "... NetworkPolicy is enforced meanwhile: $B/intruder dropped" eventually 20 dropped "$B" intruder "$WEB_IP" 8080
check "... $B/client reaches web:8080 (control)" reaches "$B" client "$WEB_IP" 8080
kc apply -f "$CRDS" >/dev/null
kc wait --for=condition=Established crd/ciliumnetworkpolicies.cilium.io --timeout=30s >/dev/null
# Rules add up: a CiliumNetworkPolicy letting role=intruder in shows in the intruder's reach.
kc apply -f - >/dev/null <<EOT
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: web-from-intruders, namespace: $A}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress:
  # A namespaced rule selects peers of its own namespace unless it names another (as in Cilium).
  - fromEndpoints: [{matchLabels: {role: intruder, k8s:io.kubernetes.pod.namespace: $B}}]
EOT
check "CRDs installed again: a CiliumNetworkPolicy is followed without a restart ($B/intruder reaches web:8080)" \
  eventually 90 reaches "$B" intruder "$WEB_IP" 8080
kc -n "$A" delete ciliumnetworkpolicy web-from-intruders >/dev/null
check "... and its deletion ($B/intruder dropped again)" eventually 20 dropped "$B" intruder "$WEB_IP" 8080
check "... the status warnings are gone" eventually 30 no_warnings
check "no restart of the manager's container throughout" test "$(weft_restarts)" = 0

echo "   -- the ClusterRole without 'list' on networkpolicies"
CK_RESTORE+=("kc apply -f '$RBAC'")
idx=$(kc get clusterrole weft -o json | jq '.rules | map(.resources | index("networkpolicies") != null) | index(true)')
kc patch clusterrole weft --type json -p "[{\"op\":\"replace\",\"path\":\"/rules/$idx/verbs\",\"value\":[\"watch\"]}]" >/dev/null
restart_manager
started_at=$(date +%s)
check "the manager serves and its status names the denied list" \
  eventually 60 warning_matches '^NetworkPolicy: initial list not complete: .*(forbidden|Forbidden|403)'
check "... its log says it waits, with the ClusterRole hint" eventually 60 log_has 'ClusterRole of conf/k8s/01-rbac.yaml'
not_ready_by_weft() {
  [ "$(node_ready)" = False ] && node_ready_msg | grep 'weft-manager at /run/weft/manager.sock is not ready' >/dev/null ||
    { echo "Ready=$(node_ready): $(node_ready_msg)"; return 1; }
}
check "the Node's network is NotReady with Weft's STATUS error" eventually 60 not_ready_by_weft
check "running pods keep their policy: $B/intruder dropped" dropped "$B" intruder "$WEB_IP" 8080
# The old behaviour gave up after 60 s and exited: stay past that before judging.
while [ $(($(date +%s) - started_at)) -lt 80 ]; do sleep 5; done
check "no crash loop: the container was not restarted in 80 s" test "$(weft_restarts)" = 0
kc apply -f "$RBAC" >/dev/null
check "ClusterRole fixed: the manager turns ready, without a restart" eventually 90 weft_ready
check "... restart count still 0" test "$(weft_restarts)" = 0
node_is_ready() { [ "$(node_ready)" = True ] || { echo "Ready=$(node_ready): $(node_ready_msg)"; return 1; }; }
check "... and the Node Ready" eventually 60 node_is_ready
kc -n "$A" delete networkpolicy web-from-clients >/dev/null
