#!/usr/bin/env bash
# Prometheus metrics end to end: the real manager with --metrics-listen on 127.0.0.1 inside this
# test's node netns; pods added, a policy imported, a denied flow sent; then both the API socket
# and the TCP port are scraped and the values checked against what happened. The TCP port must
# refuse the API.
source "$(dirname "$0")/../lib.sh"
weft_plan 33
command -v curl >/dev/null || die "curl is missing: run scripts/setup"

N=3
PORT=9962
weft_make_node
weft_start_manager --pod-cidr 10.0.31.0/24 --metrics-listen "127.0.0.1:$PORT"
for i in $(seq $N); do
  weft_add_pod "app$i" '[{"key":"id","value":"app'$i'"}]' >/dev/null || die "ADD app$i failed"
done

out=$(weftctl policy import "$WEFT_ROOT/testdata/policies/cilium-l3-rule.json" --wait) || die "import failed: $out"
rev=$(sed -n 's/^revision \([0-9]*\).*/\1/p' <<<"$out")
[ -n "$rev" ] || die "policy import printed no revision: $out"
check_dropped "the denied flow app3 -> app1:80 is dropped" app1 app3 "$(pod_ip app1)" 80
check "the allowed flow app2 -> app1:80 passes" tcp_ok app1 app2 "$(pod_ip app1)" 80

curl -sf --unix-socket "$WEFT_SOCK" http://weft/metrics >"$WEFT_TMP/socket.txt" || die "scraping the socket failed"
in_node curl -sf "http://127.0.0.1:$PORT/metrics" >"$WEFT_TMP/tcp.txt" || die "scraping 127.0.0.1:$PORT failed"

# sample FILE 'name{labels}' → its value (empty if absent).
sample() { awk -v k="$2" 'substr($0, 1, length(k) + 1) == k " " {print $NF}' "$1"; }
# expect FILE KEY OP NUMBER: the sample exists and compares so.
expect() {
  local v; v=$(sample "$1" "$2")
  [ -n "$v" ] || { echo "$2 missing"; grep "^${2%%\{*}" "$1"; return 1; }
  awk -v v="$v" -v n="$4" -v op="$3" 'BEGIN { exit !((op == "=" && v == n) || (op == ">=" && v >= n) || (op == ">" && v > n)) }' \
    || { echo "$2 = $v, want $3 $4"; return 1; }
}

for src in socket tcp; do
  f=$WEFT_TMP/$src.txt
  echo "== scraped over the $src"
  check "OpenMetrics text ending in # EOF" bash -c "tail -1 '$f' | grep -qx '# EOF'"
  check "$N endpoints ready" expect "$f" 'weft_endpoint_state{state="ready"}' = $N
  check "policy revision = $rev (what import reported)" expect "$f" weft_policy_max_revision = "$rev"
  check "a policy drop of the denied flow, ingress of app1" \
    expect "$f" 'weft_drop_count_total{reason="policy-default",direction="ingress"}' '>=' 1
  check "forwards counted" expect "$f" 'weft_forward_count_total{reason="allow-policy",direction="ingress"}' '>=' 1
  check "regenerations > 0" expect "$f" 'weft_endpoint_regenerations_total{outcome="success"}' '>' 0
  check "the import's implementation delay observed" expect "$f" weft_policy_implementation_delay_count = 1
  check "$N CNI ADDs counted on the add route" \
    expect "$f" 'weft_api_requests_total{method="POST",route="/v1/endpoints",status="200"}' = $N
  check "registrations counted by route template" \
    expect "$f" 'weft_api_requests_total{method="POST",route="/v1/endpoints/{id}/ready",status="200"}' = $N
  check "IPAM: $N used in 10.0.31.0/24" expect "$f" 'weft_ipam_used{family="ipv4",cidr="10.0.31.0/24"}' = $N
  check "restore phases exported" expect "$f" 'weft_restore_duration_seconds{phase="total"}' '>' 0
done

echo "== the TCP port serves only /metrics and /healthz"
code() { in_node curl -s -o /dev/null -w '%{http_code}' "$@"; }
check "POST /v1/endpoints refused" test "$(code -X POST -d '{}' "http://127.0.0.1:$PORT/v1/endpoints")" = 404
check "GET /v1/status refused" test "$(code "http://127.0.0.1:$PORT/v1/status")" = 404
check "/healthz 200" test "$(code "http://127.0.0.1:$PORT/healthz")" = 200
check "still $N endpoints" test "$(weftctl -o json endpoint list | jq length)" = $N

echo "== a bad --metrics-listen is refused before anything starts"
bad=$("$WEFT_BIN/weft-manager" --metrics-listen nowhere --state-dir "$WEFT_TMP/never" 2>&1)
check "exit status non-zero" test $? != 0
check "the message names the flag, the value and the fix" grep -q -- '--metrics-listen "nowhere".*IP:PORT' <<<"$bad"
check "nothing created" test ! -e "$WEFT_TMP/never"
taken=$(in_node "$WEFT_BIN/weft-manager" --metrics-listen "127.0.0.1:$PORT" --state-dir "$WEFT_TMP/never" \
  --socket "$WEFT_TMP/never.sock" --bpffs "$WEFT_BPFFS-never" 2>&1)
check "a taken port is refused naming the address" grep -q "127.0.0.1:$PORT: cannot listen" <<<"$taken"
check "nothing created for it" test ! -e "$WEFT_TMP/never"
weft_summary
