# A real Prometheus finds the manager's metrics port through the DaemonSet pod's prometheus.io
# annotations with Kubernetes service discovery (role pod), and its query API returns Weft's series
# with the values the manager reports (sourced by checks). The Prometheus is upstream's release
# built by scripts/cluster/build ($PROMETHEUS_VERSION): Debian's package has no Kubernetes SD.
#
# Prometheus runs as an operator outside the cluster would run it: its own process in the node's
# netns (127.0.0.1:$PROM_PORT, data and config in $CL_STATE/prometheus), talking to the API server
# over TLS (the cluster CA) with the token of a ServiceAccount whose ClusterRole may only get,
# list and watch pods. Its scrape job is the common `kubernetes-pods` one: keep pods annotated
# prometheus.io/scrape "true", address from the pod IP and prometheus.io/port, path from
# prometheus.io/path when set, the pod's labels, namespace and name as target labels.
# shellcheck shell=bash
A=$CK_NS_A
PROM_NS=wck-prom
PROM_PORT=19090
PROM_DIR=$CL_STATE/prometheus
PROM=http://127.0.0.1:$PROM_PORT
PROM_JOB=kubernetes-pods

PROM_BIN=$CLUSTER_BIN/prometheus
if ! [ -x "$PROM_BIN" ]; then
  ck_fail "$PROM_BIN is missing: run scripts/cluster/build prometheus"
  return 0
fi
echo "   ($("$PROM_BIN" --version 2>&1 | head -1))"

# Cleanup (ck_cleanup, also after a failure): the process by its pid file (cl_stop checks it is
# still the one started in the node's netns), its directory, and the API objects made here.
CK_RESTORE+=("cl_stop prometheus 10" "rm -rf '$PROM_DIR'"
  "kc delete clusterrolebinding $PROM_NS --ignore-not-found"
  "kc delete clusterrole $PROM_NS --ignore-not-found"
  "kc delete namespace $PROM_NS --ignore-not-found --wait=true --timeout=60s")
cl_stop prometheus 10
rm -rf "$PROM_DIR"
mkdir -p "$PROM_DIR/data"

kc apply -f - >/dev/null <<EOT
apiVersion: v1
kind: Namespace
metadata: {name: $PROM_NS}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: prometheus, namespace: $PROM_NS}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: $PROM_NS}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: $PROM_NS}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: $PROM_NS}
subjects:
- {kind: ServiceAccount, name: prometheus, namespace: $PROM_NS}
EOT
# A bound token from the TokenRequest API (what `kubectl create token` asks for).
(umask 077 && kc -n "$PROM_NS" create token prometheus --duration=1h >"$PROM_DIR/token") ||
  ck_fail "kubectl create token for $PROM_NS/prometheus"
cp "$CL_PKI/ca.crt" "$PROM_DIR/ca.crt"

cat >"$PROM_DIR/prometheus.yml" <<EOT
global:
  scrape_interval: 2s
  scrape_timeout: 2s
scrape_configs:
- job_name: $PROM_JOB
  kubernetes_sd_configs:
  - role: pod
    api_server: $CL_API
    tls_config: {ca_file: $PROM_DIR/ca.crt}
    authorization: {credentials_file: $PROM_DIR/token}
  relabel_configs:
  - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scrape]
    action: keep
    regex: "true"
  - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scheme]
    action: replace
    regex: (https?)
    target_label: __scheme__
  - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_path]
    action: replace
    regex: (.+)
    target_label: __metrics_path__
  - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_port, __meta_kubernetes_pod_ip]
    action: replace
    regex: (\d+);(([A-Fa-f0-9]{1,4}::?){1,7}[A-Fa-f0-9]{1,4})
    replacement: '[\$2]:\$1'
    target_label: __address__
  - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_port, __meta_kubernetes_pod_ip]
    action: replace
    regex: (\d+);((([0-9]+?)(\.|$)){4})
    replacement: '\$2:\$1'
    target_label: __address__
  - action: labelmap
    regex: __meta_kubernetes_pod_label_(.+)
  - source_labels: [__meta_kubernetes_namespace]
    target_label: namespace
  - source_labels: [__meta_kubernetes_pod_name]
    target_label: pod
EOT
cl_start prometheus "$PROM_BIN" --config.file="$PROM_DIR/prometheus.yml" \
  --storage.tsdb.path="$PROM_DIR/data" --web.listen-address="127.0.0.1:$PROM_PORT" \
  --storage.tsdb.retention.time=1h --log.level=info
prom_get() { in_node curl -sfS --max-time 5 "$PROM$1"; }
prom_ready() { prom_get /-/ready >/dev/null; }
check "prometheus runs in the node, ready on 127.0.0.1:$PROM_PORT (pid $(cat "$CL_PIDS/prometheus.pid"))" eventually 60 prom_ready
if ! prom_ready; then
  ck_fail "prometheus is not serving: the other checks of this group are skipped" "$(tail -15 "$CL_LOGS/prometheus.log")"
  return 0
fi

WP=$(weft_pod)
WP_IP=$(pod_ip kube-system "$WP")
# The port the manager serves metrics on: the container port named "prometheus" (the annotation
# must name the same one for the scrape to work).
WP_PORT=$(kc -n kube-system get pod "$WP" -o jsonpath='{.spec.containers[0].ports[?(@.name=="prometheus")].containerPort}')
targets() { prom_get "/api/v1/targets?state=$1"; }
# The job's active targets, as "namespace/pod health scrapeUrl" lines.
active_list() {
  targets active | jq -r --arg j "$PROM_JOB" \
    '.data.activeTargets[] | select(.labels.job == $j) | "\(.labels.namespace)/\(.labels.pod) \(.health) \(.scrapeUrl)"'
}
weft_only_target() {
  local l
  l=$(active_list) || return 1
  [ "$(awk '{print $1 " " $3}' <<<"$l")" = "kube-system/$WP http://$WP_IP:$WP_PORT/metrics" ] ||
    { echo "active targets of $PROM_JOB: ${l:-none}"; return 1; }
}
check "SD: the job's one active target is kube-system/$WP at http://$WP_IP:$WP_PORT/metrics (pod IP + prometheus.io/port = the container port 'prometheus')" \
  eventually 60 weft_only_target
weft_target() {
  targets active | jq -ce --arg j "$PROM_JOB" --arg p "$WP" \
    '[.data.activeTargets[] | select(.labels.job == $j and .labels.pod == $p)] | if length == 1 then .[0] else error("\(length) targets for pod \($p)") end'
}
target_up() {
  local t
  t=$(weft_target) || return 1
  jq -e '.health == "up"' <<<"$t" >/dev/null || { jq -c '{health, lastError, scrapeUrl}' <<<"$t"; return 1; }
}
check "... scraped: health up" eventually 30 target_up
target_labels() {
  local t
  t=$(weft_target) || return 1
  jq -e '.labels.namespace == "kube-system" and .labels.k8s_app == "weft" and
    .discoveredLabels.__meta_kubernetes_pod_container_port_name == "prometheus" and
    .discoveredLabels.__meta_kubernetes_pod_annotation_prometheus_io_scrape == "true"' <<<"$t" >/dev/null ||
    { jq -c '.labels' <<<"$t"; return 1; }
}
check "... with its SD labels (namespace=kube-system, pod=$WP, k8s_app=weft; container port 'prometheus')" target_labels

# query EXPR: the value of the one series EXPR selects, in Prometheus's answer.
query() {
  local r
  r=$(prom_get "/api/v1/query?query=$(jq -rn --arg q "$1" '$q | @uri')") || return 1
  jq -re --arg q "$1" '.data.result | if length == 1 then .[0].value[1] else error("\(length) series for \($q)") end' <<<"$r"
}
sel="job=\"$PROM_JOB\",namespace=\"kube-system\",pod=\"$WP\""
up_is_1() { local v; v=$(query "up{$sel}") || return 1; [ "$v" = 1 ] || { echo "up = $v"; return 1; }; }
check "query: up{$sel} is 1" eventually 30 up_is_1
# Pods of the node on the pod network (not hostNetwork), running: what Weft has endpoints for.
api_pods() {
  kc get pods -A --field-selector "spec.nodeName=$CL_NODE,status.phase=Running" -o json |
    jq '[.items[] | select(.spec.hostNetwork != true and .metadata.deletionTimestamp == null)] | length'
}
# endpoints_agree: weft_endpoint_state{state="ready"} in Prometheus = `weftctl status`'s
# endpoints = the ready endpoints of `weftctl endpoint list` = the API's running pod-network pods.
endpoints_agree() {
  local p s l a
  p=$(query "weft_endpoint_state{$sel,state=\"ready\"}") || return 1
  s=$(weftctl_ -o json status | jq -r .endpoints) || return 1
  l=$(weftctl_ -o json endpoint list | jq '[.[] | select(.state == "ready")] | length') || return 1
  a=$(api_pods) || return 1
  if [ "$p" != "$s" ] || [ "$s" != "$l" ] || [ "$l" != "$a" ]; then
    echo "prometheus $p, weftctl status $s, weftctl endpoint list $l ready, API $a pods"
    return 1
  fi
  echo "$p"
}
ipam_agrees() {
  local cidr p s
  cidr=$(kc get node "$CL_NODE" -o jsonpath='{.spec.podCIDR}')
  p=$(query "weft_ipam_used{$sel,cidr=\"$cidr\"}") || return 1
  s=$(weftctl_ -o json status | jq -r --arg c "$cidr" '.pools[] | select(.cidr == $c) | .used') || return 1
  [ "$p" = "$s" ] || { echo "prometheus $p, weftctl status $s"; return 1; }
}
endpoints_are() { local m; m=$(endpoints_agree) || { echo "$m"; return 1; }; [ "$m" = "$1" ] || { echo "all agree on $m"; return 1; }; }
n=$(api_pods)
check "query: weft_endpoint_state{state=\"ready\"} = weftctl status endpoints = the node's pods ($n)" \
  eventually 30 endpoints_are "$n"
check "query: weft_ipam_used = weftctl status's pool used" eventually 30 ipam_agrees
kc apply -f - >/dev/null <<EOT
apiVersion: v1
kind: Pod
metadata: {name: counted, namespace: $A, labels: {role: counted}}
spec:
$(ck_pin)
  terminationGracePeriodSeconds: 1
  containers: [{name: c, image: $AGNHOST_IMAGE, args: [pause]}]
EOT
kc -n "$A" wait --for=condition=Ready pod/counted --timeout=60s >/dev/null
check "a new pod ($A/counted): the series follows to $((n + 1)), all agreeing" \
  eventually 30 endpoints_are "$((n + 1))"
kc -n "$A" delete pod counted --wait=false >/dev/null

# The pods without the annotation: discovered (positive control) and dropped by the keep rule.
dropped_web() {
  targets dropped | jq -e --arg ns "$A" \
    '[.data.droppedTargets[].discoveredLabels | select(.__meta_kubernetes_namespace == $ns and .__meta_kubernetes_pod_name == "web")
      | .__meta_kubernetes_pod_container_port_number] | sort == ["8080", "8081"]' >/dev/null ||
    { echo "dropped targets: $(targets dropped | jq -c '[.data.droppedTargets[].discoveredLabels | "\(.__meta_kubernetes_namespace)/\(.__meta_kubernetes_pod_name):\(.__meta_kubernetes_pod_container_port_number)"]')"; return 1; }
}
check "$A/web (no annotation) is discovered by SD: its ports 8080 and 8081 are among the dropped targets" \
  eventually 30 dropped_web
not_active() {
  local l
  l=$(active_list) || return 1
  ! grep "^$1/$2 " <<<"$l"
}
check "... and it is not an active target" not_active "$A" web
