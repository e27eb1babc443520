# Labels and named ports arriving through the real API server's watches (sourced by checks).
A=$CK_NS_A B=$CK_NS_B
cidr=$(kc get node "$CL_NODE" -o jsonpath='{.spec.podCIDR}')
in_cidr() { python3 -c 'import ipaddress,sys; sys.exit(ipaddress.ip_address(sys.argv[1]) not in ipaddress.ip_network(sys.argv[2]))' "$1" "$2" || { echo "$1 is not in $2"; return 1; }; }
check "pod IPs come from the Node's podCIDR ($cidr, set by kube-controller-manager)" in_cidr "$WEB_IP" "$cidr"
ep_ip_is_pod_ip() {
  local e
  e=$(endpoint_of "$1" "$2" | jq -r '.ips[0].address') || return 1
  [ "$e" = "$(pod_ip "$1" "$2")" ] || { echo "endpoint $e, pod $(pod_ip "$1" "$2")"; return 1; }
}
identity_is() { local i; i=$(endpoint_of "$1" "$2" | jq -r .identity); [ "$i" = "$3" ] || { echo "identity $i"; return 1; }; }
for p in "$A web" "$A client" "$B client" "$B intruder"; do
  # shellcheck disable=SC2086
  check "one Weft endpoint for pod ${p/ //}, with the IP the API server reports" ep_ip_is_pod_ip $p
done
check "the endpoint has the pod's label (k8s:app=web)" has_label "$A" web k8s:app web
check "... its namespace's label (team=blue)" has_label "$A" web k8s:io.cilium.k8s.namespace.labels.team blue
check "... its namespace (io.kubernetes.pod.namespace)" has_label "$A" web k8s:io.kubernetes.pod.namespace "$A"
check "... its service account" has_label "$A" web k8s:io.cilium.k8s.policy.serviceaccount default

id_before=$(endpoint_of "$A" web | jq -r .identity)
kc -n "$A" label pod web tier=front >/dev/null
check "kubectl label pod: the new label reaches the endpoint" eventually 20 has_label "$A" web k8s:tier front
id_after=$(endpoint_of "$A" web | jq -r .identity)
check "... with a new identity ($id_before -> $id_after)" test "$id_before" != "$id_after"
kc -n "$A" label pod web tier- >/dev/null
check "kubectl label pod tier-: the label leaves the endpoint" eventually 20 lacks_label_key "$A" web k8s:tier
check "... and the identity is the first one again" eventually 10 identity_is "$A" web "$id_before"

kc label namespace "$B" team=green --overwrite >/dev/null
check "kubectl label namespace: every pod of the namespace follows (client)" \
  eventually 20 has_label "$B" client k8s:io.cilium.k8s.namespace.labels.team green
check "... (intruder)" eventually 5 has_label "$B" intruder k8s:io.cilium.k8s.namespace.labels.team green
kc label namespace "$B" team=red --overwrite >/dev/null
check "... and back (team=red)" eventually 20 has_label "$B" client k8s:io.cilium.k8s.namespace.labels.team red
