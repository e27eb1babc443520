# containerd 2.x's CNI STATUS with the manager stopped and started again, running pods' traffic
# and policy meanwhile, and a pod deleted while the manager is down (sourced by checks).
A=$CK_NS_A B=$CK_NS_B
STATUS_ERR="weft-manager at /run/weft/manager.sock is not available"
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
check "policy in force: $B/intruder is dropped at web:8080" eventually 20 dropped "$B" intruder "$WEB_IP" 8080
check "policy in force: $B/client reaches web:8080 (control)" reaches "$B" client "$WEB_IP" 8080
check "Node Ready before the stop" test "$(node_ready)" = True
check "$A/client has its endpoint before the stop (control)" endpoint_of "$A" client

# Stopping the manager the Kubernetes way: a nodeSelector no node has takes the DaemonSet's pod
# off the node (SIGTERM, a graceful stop); removing it brings the pod back.
unpin='[{"op":"remove","path":"/spec/template/spec/nodeSelector"}]'
kc -n kube-system patch ds weft --type merge \
  -p '{"spec":{"template":{"spec":{"nodeSelector":{"weft.io/checks":"manager-stopped"}}}}}' >/dev/null
CK_RESTORE+=("kc -n kube-system patch ds weft --type json -p '$unpin'")
no_weft_pod() { [ -z "$(kc -n kube-system get pods -l k8s-app=weft -o name)" ]; }
check "manager stopped (the DaemonSet's pod is gone)" eventually 60 no_weft_pod
not_ready_by_status() {
  [ "$(node_ready)" = False ] && node_ready_msg | grep -F "$STATUS_ERR" >/dev/null ||
    { echo "Ready=$(node_ready): $(node_ready_msg)"; return 1; }
}
check "manager down: the Node turns NotReady with Weft's STATUS error" eventually 60 not_ready_by_status
echo "       ($(node_ready_msg))"
check "manager down: $B/client still reaches web:8080" reaches "$B" client "$WEB_IP" 8080
check "manager down: $B/intruder is still dropped at web:8080" dropped "$B" intruder "$WEB_IP" 8080

gone_ip=$(pod_ip "$A" client)
kc -n "$A" delete pod client --wait=false >/dev/null
pod_gone() { ! kc -n "$1" get pod "$2" >/dev/null 2>&1; }
check "manager down: a deleted pod ($A/client, $gone_ip) goes (weft-cni queues its DEL)" eventually 60 pod_gone "$A" client

kc -n kube-system patch ds weft --type json -p "$unpin" >/dev/null
check "manager started again: its pod is ready" eventually 120 weft_ready
node_is_ready() { [ "$(node_ready)" = True ] || { echo "Ready=$(node_ready): $(node_ready_msg)"; return 1; }; }
check "manager started again: the Node turns Ready" eventually 60 node_is_ready
no_endpoint() {
  local l
  l=$(weftctl_ -o json endpoint list) || return 1
  ! jq -e --arg ns "$1" --arg p "$2" 'any(.[]; .pod_namespace == $ns and .pod_name == $p)' <<<"$l" >/dev/null
}
check "the pod deleted meanwhile has no endpoint left" eventually 20 no_endpoint "$A" client
ip_free() {
  local l
  l=$(weftctl_ -o json ipam list) || return 1
  ! jq -e --arg ip "$1" 'any(.[]; .address == $ip)' <<<"$l" >/dev/null
}
check "... and its IP $gone_ip is free again" ip_free "$gone_ip"
check "after: $B/client reaches web:8080" reaches "$B" client "$WEB_IP" 8080
check "after: $B/intruder is dropped at web:8080" dropped "$B" intruder "$WEB_IP" 8080
kc -n "$A" delete networkpolicy web-from-clients >/dev/null
# The pod back for the groups after this one.
ck_pods_yaml | kc apply -f - >/dev/null
kc -n "$A" wait --for=condition=Ready pod/client --timeout=120s >/dev/null
