# shellcheck shell=bash
# The policy and restart parts of scripts/bench-cluster (sourced by it): clusterloader2's
# network-policy enforcement shape, the daemon's cost over it, and the daemon's restart with
# those endpoints and policies in force.
#
# Namespaces: bnp-target holds the targets t0..tT-1 (agnhost netexec, labels
# net-pol-test=enforcement-latency, target=tI) and tdeny (the same labels but target=tdeny: no
# allow policy names it); bnp-client holds `prober` (type=policy-creation: the policies select
# it) and `control` (type=control: no policy selects it). The probers run
# scripts/bench/cluster_probe.py in those pods' network namespaces.

TGT_NS=bnp-target
CLI_NS=bnp-client

policy_pods_yaml() {
  local i
  for i in $(seq 0 $((TARGETS - 1))) deny; do
    cat <<EOF
---
apiVersion: v1
kind: Pod
metadata: {name: t$i, namespace: $TGT_NS, labels: {net-pol-test: enforcement-latency, target: t$i}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: netexec, image: $AGNHOST_IMAGE, args: [netexec, --http-port=8080, --udp-port=$UDP_PORT]}
EOF
  done
  for p in prober:policy-creation control:control; do
    cat <<EOF
---
apiVersion: v1
kind: Pod
metadata: {name: ${p%%:*}, namespace: $CLI_NS, labels: {type: ${p#*:}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: $AGNHOST_IMAGE, args: [pause]}
EOF
  done
}

# clusterloader2's setup policies in the client namespace: egress to the API server allowed, and
# the policy-creation clients' egress allowed only to pods labelled net-pol-test=deny-traffic
# (none exist): every flow of `prober` is denied until its allow policy.
setup_policies_yaml() {
  cat <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-egress-apiserver, namespace: $CLI_NS}
spec:
  podSelector: {matchLabels: {type: policy-creation}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: $CL_NODE_IP/32}}]
    ports: [{protocol: TCP, port: 6443}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-egress-to-target-policy-creation, namespace: $CLI_NS, labels: {type: policy-creation}}
spec:
  podSelector: {matchLabels: {type: policy-creation}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {net-pol-test: deny-traffic}}, namespaceSelector: {}}]
EOF
}

# probe_check PID TARGETS SECONDS: one check round from the pod PID's netns, a line "name answered
# sent" per target (requests every 50 ms). all_answer / none_answer: every target answered / none
# did, and the prober did send to each (a prober that failed to send proves nothing).
probe_check() {
  in_pod_net "$1" python3 "$BC_PY/cluster_probe.py" check "$2" "$UDP_PORT" --interval-ms 50 --seconds "$3" |
    grep '^{' | jq -r '"\(.name) \(.answered) \(.sent - .send_errors)"'
}
all_answer() { probe_check "$@" | awk '{n++} $2 == 0 || $3 <= 0 {bad=1} END {exit !(n > 0 && !bad)}'; }
# unanswered PID TARGETS: the raw check lines (2 s) of the targets that gave no answer, on one line.
unanswered() {
  in_pod_net "$1" python3 "$BC_PY/cluster_probe.py" check "$2" "$UDP_PORT" --interval-ms 50 --seconds 2 |
    grep '^{' | jq -c 'select(.answered == 0)' | head -5 | tr '\n' ' '
}
none_answer() { probe_check "$@" | awk '{n++} $2 != 0 || $3 <= 0 {bad=1} END {exit !(n > 0 && !bad)}'; }

# diagnose IMPL: what the daemon and the API server say about the pods, into $RUN/diag.* (kept
# with --out), before a positive control stops the run.
diagnose() {
  kc get pods -A -o wide >"$RUN/diag.pods.txt" 2>&1
  [ "$1" = cilium ] && kc -n kube-system exec ds/cilium -c cilium-agent -- cilium-dbg endpoint list >"$RUN/diag.cilium-endpoints.txt" 2>&1
  bc_log "  diagnostics in $RUN/diag.*"
}

# policy_part IMPL TAG
policy_part() {
  local impl=$1 tag=$2 l0 keys
  keys="cluster=$tag impl=$impl targets=$TARGETS policies=$POLICIES qps=$QPS"
  l0=$(loadavg)
  bc_log "policy: $TARGETS targets, $POLICIES policies at $QPS/s ($impl)"
  ensure_ns "$TGT_NS"
  ensure_ns "$CLI_NS"
  policy_pods_yaml | kc apply -f - >"$RUN/policy-pods.log" 2>&1 || bc_die "cannot create the policy part's pods: $(tail -3 "$RUN/policy-pods.log")"
  kc -n "$TGT_NS" wait --for=condition=Ready pod --all --timeout=900s >/dev/null &&
    kc -n "$CLI_NS" wait --for=condition=Ready pod --all --timeout=300s >/dev/null ||
    bc_die "the policy part's pods did not become Ready: $(kc get pods -A | grep -v Running | tail -5)"
  kc -n "$TGT_NS" get pods -o json | jq -r '.items[] | select(.metadata.name != "tdeny") | "\(.metadata.name) \(.status.podIP)"' \
    | sort -V >"$RUN/targets.$tag"
  kc -n "$TGT_NS" get pod tdeny -o json | jq -r '"tdeny \(.status.podIP)"' >"$RUN/tdeny.$tag"
  PROBER_PID=$(pod_pid "$CLI_NS" prober) && CONTROL_PID=$(pod_pid "$CLI_NS" control) ||
    bc_die "cannot find the probers' processes (ctr task ls in the node)"

  # Positive controls: before any policy both probers reach every target. A pod can be Ready
  # before its network answers (its daemon still setting up the endpoint): waited for, up to
  # 120 s, and a wait is logged; a target that never answers stops the run with what both
  # probers saw of it (answers, sends, send errors by errno).
  local w0=$SECONDS
  until all_answer "$PROBER_PID" "$RUN/targets.$tag" 3; do
    [ $((SECONDS - w0)) -lt 120 ] && continue
    diagnose "$impl"
    bc_die "before any policy, the prober does not reach every target within 120 s: a network or tool error, not a policy; prober: $(unanswered "$PROBER_PID" "$RUN/targets.$tag"); control: $(unanswered "$CONTROL_PID" "$RUN/targets.$tag")"
  done
  [ $((SECONDS - w0)) -le 4 ] || bc_log "  every target answered the prober $((SECONDS - w0)) s after the pods were Ready"
  all_answer "$PROBER_PID" "$RUN/tdeny.$tag" 3 ||
    bc_die "before any policy, the prober does not reach tdeny: $(unanswered "$PROBER_PID" "$RUN/tdeny.$tag")"
  all_answer "$CONTROL_PID" "$RUN/targets.$tag" 3 ||
    bc_die "before any policy, the control prober does not reach every target: $(unanswered "$CONTROL_PID" "$RUN/targets.$tag")"

  setup_policies_yaml | kc apply -f - >/dev/null || bc_die "cannot create clusterloader2's setup policies"
  # Now the prober is denied (a policy drop: the control, whose only difference is that no
  # policy selects it, still reaches every target; for Weft the prober's egress policy drops grow).
  local d0 d1
  [ "$impl" = weft ] && d0=$(weft_policy_drops "$CLI_NS" prober egress)
  wait_for 60 "the deny policy to hold" none_answer "$PROBER_PID" "$RUN/targets.$tag" 1 ||
    bc_die "the prober still reaches targets 60 s after the deny policy: not enforced ($(probe_check "$PROBER_PID" "$RUN/targets.$tag" 1 | awk '$2 != 0' | head -3 | tr '\n' ' '))"
  all_answer "$CONTROL_PID" "$RUN/targets.$tag" 2 ||
    bc_die "the control prober lost targets after the deny policy (it selects only the prober): a tool or network error"
  if [ "$impl" = weft ]; then
    d1=$(weft_policy_drops "$CLI_NS" prober egress)
    [ -n "$d0" ] && [ -n "$d1" ] && [ "$d1" -gt "$d0" ] ||
      bc_die "the prober's requests go unanswered but Weft counted no egress policy drop for it ($d0 -> $d1): not a policy drop"
    bc_log "  deny in force: the prober's egress policy drops $d0 -> $d1, the control reaches every target"
  fi

  # The load, with the prober running and the daemon sampled.
  local pid stop=$RUN/prober.stop.$tag mb ma hot
  rm -f "$stop"
  # The policy creator names each allow policy's target on this socket just before its create
  # request; the prober then sends to that target every HOT_MS (cluster_probe.py, --hot-socket).
  hot=$(readlink -f "$RUN")/hot.$tag
  [ ${#hot} -lt 100 ] || hot=$(mktemp -u /tmp/weft-bc-hot.XXXXXX)
  rm -f "$hot"
  pid=$(daemon_pid "$impl") || bc_die "cannot find the $impl daemon's process"
  echo 5 >"/proc/$pid/clear_refs" 2>/dev/null || bc_log "  cannot reset $impl's VmHWM (peak RSS counts from its start)"
  mb=$RUN/metrics.before.$tag ma=$RUN/metrics.after.$tag
  daemon_metrics "$impl" "$mb" || bc_log "  no /metrics from $impl on 127.0.0.1:9962"
  python3 "$BC_PY/cluster_stats.py" sample "$pid" 0.5 "$RUN/sample.$tag" &
  local sampler=$!
  in_pod_net "$PROBER_PID" python3 "$BC_PY/cluster_probe.py" first "$RUN/targets.$tag" "$UDP_PORT" \
    --interval-ms "$PROBE_MS" --hot-socket "$hot" --hot-ms "$HOT_MS" \
    --timeout "$(awk -v p="$POLICIES" -v q="$QPS" 'BEGIN {print int(p / q * 2 + 120)}')" --stop-file "$stop" >"$RUN/prober.$tag" 2>&1 &
  local prober=$!
  for _ in $(seq 100); do grep -qs ready "$RUN/prober.$tag" && break; sleep 0.1; done
  grep -q ready "$RUN/prober.$tag" || bc_die "the prober did not start: $(cat "$RUN/prober.$tag")"
  local t_load t_end
  t_load=$(bc_now)
  api policies --client-ns "$CLI_NS" --target-ns "$TGT_NS" --targets "$TARGETS" --count "$POLICIES" --qps "$QPS" \
    --hot-socket "$hot" --out "$RUN/policies.$tag" 2>"$RUN/policies.$tag.err" ||
    bc_log "  some policies were not created, or their targets not named to the prober: $(head -3 "$RUN/policies.$tag.err")"
  t_end=$(bc_now)
  # Every target answered, or 30 s after the last policy.
  for _ in $(seq 300); do kill -0 "$prober" 2>/dev/null || break; sleep 0.1; done
  touch "$stop"
  wait "$prober"
  sleep 5 # settle: the steady state after the load
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
  local hwm
  hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
  daemon_metrics "$impl" "$ma" || rm -f "$ma"
  echo "LOAD part=policy cluster=$tag impl=$impl before=\"$l0\" after=\"$(loadavg)\""

  # From each allow policy's create request to the first answered request to its target.
  local f=$RUN/fig/policy_enforcement_ms.$tag
  jq -n -r --slurpfile p "$RUN/policies.$tag" --slurpfile r <(grep '^{' "$RUN/prober.$tag") '
    ($r | map({(.name): .}) | add) as $first
    | $p[] | select(.kind == "allow" and .status == 201)
    | ($first[.target].first) as $t
    | if $t == null then "missing \(.target)"
      elif $t < .start then "early \(.target) \(($t - .start) / 1000)"
      else "ok \(.target) \(($t - .start) / 1000) \(if $first[.target].hot == null then "unnamed" else "named" end)" end' >"$RUN/enforcement.$tag"
  awk '$1 == "ok" {print $3}' "$RUN/enforcement.$tag" >"$f"
  # A flow the prober was not told of was probed only every --probe-ms: its figure is coarser.
  local unnamed
  unnamed=$(awk '$4 == "unnamed"' "$RUN/enforcement.$tag" | wc -l)
  [ "$unnamed" = 0 ] || bc_log "  $unnamed flows were not named to the prober: probed every $PROBE_MS ms, not $HOT_MS"
  jq -r 'select(.status == 201) | (.done - .start) / 1000' "$RUN/policies.$tag" >"$RUN/fig/policy_api_create_ms.$tag"
  local early missing_t
  early=$(awk '$1 == "early"' "$RUN/enforcement.$tag" | wc -l)
  missing_t=$(awk '$1 == "missing" {print $2}' "$RUN/enforcement.$tag")
  # A target never reached: a policy that was not enforced (the control still reaches it) or a
  # target or tool that failed (the control does not reach it either).
  local not_enforced=0 broken=0 t
  for t in $missing_t; do
    grep "^$t " "$RUN/targets.$tag" >"$RUN/one.$tag"
    if all_answer "$CONTROL_PID" "$RUN/one.$tag" 2; then not_enforced=$((not_enforced + 1)); else broken=$((broken + 1)); fi
  done
  local anchor=
  [ "$impl" != cilium ] && [ "$CILIUM" = 1 ] && anchor=" anchor=policy_enforcement_ms/cluster=cilium-up/impl=cilium/policies=$POLICIES/qps=$QPS/targets=$TARGETS"
  result99 policy_enforcement_ms "$f" "$keys probe_ms=$PROBE_MS hot_ms=$HOT_MS$anchor"
  result_value policy_enforcement_unnamed "$unnamed" "$keys"
  result_value policy_enforcement_not_enforced "$not_enforced" "$keys"
  result_value policy_enforcement_early "$early" "$keys"
  [ "$broken" = 0 ] || missing policy_enforcement_ms "$broken targets unreachable also from the control prober (target or tool failure)" "$keys"
  result99 policy_api_create_ms "$RUN/fig/policy_api_create_ms.$tag" "$keys"
  result_value policy_load_seconds "$(awk -v a="$t_load" -v b="$t_end" 'BEGIN {printf "%.1f", (b - a) / 1e6}')" "$keys"

  # The daemon's own histogram over the same load.
  local metric=weft_policy_implementation_delay
  [ "$impl" = cilium ] && metric=cilium_policy_implementation_delay
  if [ -s "$mb" ] && [ -s "$ma" ]; then
    local c p50 p99
    read -r c p50 p99 < <(python3 "$BC_PY/cluster_stats.py" hist "$mb" "$ma" "$metric")
    if [ -n "${c:-}" ] && [ "$c" != 0 ]; then
      echo "RESULT name=${metric}_ms $keys median=${p50#>} p10=- p90=- p99=${p99#>} n=$c$( [[ $p99 == '>'* ]] && echo " p99_above_last_bucket=1")"
    else
      missing "${metric}_ms" "the histogram recorded nothing over the load" "$keys"
    fi
  else
    missing "${metric}_ms" "no /metrics from the $impl daemon on the node's 127.0.0.1:9962" "$keys"
  fi

  # The daemon's CPU and memory over the load (from the prober's start to 5 s after the last answer).
  if [ -s "$RUN/sample.$tag" ]; then
    result_value daemon_cpu_seconds "$(awk 'NR == 1 {a = $3} {b = $3; hz = $4} END {printf "%.2f", (b - a) / hz}' "$RUN/sample.$tag")" "$keys daemon=$impl"
    result_value daemon_rss_peak_mib "$(awk '{printf "%.1f", $1 / 1024}' <<<"${hwm:-}")" "$keys daemon=$impl"
    result_value daemon_rss_sampled_max_mib "$(awk '{if ($2 > m) m = $2} END {printf "%.1f", m / 1024}' "$RUN/sample.$tag")" "$keys daemon=$impl"
    result_value daemon_rss_steady_mib "$(awk -v end="$(tail -1 "$RUN/sample.$tag" | cut -d' ' -f1)" \
      '$1 >= end - 4000000 {s += $2; n++} END {if (n) printf "%.1f", s / n / 1024}' "$RUN/sample.$tag")" "$keys daemon=$impl"
  else
    missing daemon_cpu_seconds "the $impl daemon could not be sampled" "$keys"
  fi

  # The denied target is still denied at the end (and reachable: the control gets answers).
  if none_answer "$PROBER_PID" "$RUN/tdeny.$tag" 2 && all_answer "$CONTROL_PID" "$RUN/tdeny.$tag" 2; then
    bc_log "  tdeny: still denied to the prober, reachable from the control"
  else
    echo "FAILED name=policy_tdeny $keys reason=\"tdeny is not denied to the prober, or the control cannot reach it\""
  fi
}

# restart_part IMPL TAG: kill -9 of the daemon, RESTARTS times, with the policy part's endpoints
# and policies in force. A stream of requests every 2 ms from the prober to t0 (allowed) and to
# tdeny (denied) runs across each restart, from 1.5 s before the kill to AFTER_READY s after the
# daemon is ready again: a daemon that disturbs its datapath after it reports ready (a
# regeneration in the background) loses requests there.
restart_part() {
  local impl=$1 tag=$2 k keys l0
  keys="cluster=$tag impl=$impl endpoints=$((TARGETS + 3)) policies=$POLICIES"
  l0=$(loadavg)
  head -1 "$RUN/targets.$tag" >"$RUN/stream-targets.$tag"
  cat "$RUN/tdeny.$tag" >>"$RUN/stream-targets.$tag"
  local t0name
  t0name=$(awk 'NR == 1 {print $1}' "$RUN/stream-targets.$tag")
  all_answer "$PROBER_PID" <(head -1 "$RUN/targets.$tag") 1 ||
    bc_die "restart: the prober does not reach $t0name before the kill (its allow policy should be in force)"
  for k in $(seq "$RESTARTS"); do
    local pid stop=$RUN/stream.stop.$tag.$k ready=$RUN/ready.$tag.$k stream=$RUN/stream.$tag.$k
    pid=$(daemon_pid "$impl") || { missing restart_ready_ms "no single $impl daemon process to kill" "$keys"; return; }
    rm -f "$stop"
    in_pod_net "$PROBER_PID" python3 "$BC_PY/cluster_probe.py" stream "$RUN/stream-targets.$tag" "$UDP_PORT" \
      --interval-ms 2 --stop-file "$stop" >"$stream" 2>&1 &
    local sp=$!
    # shellcheck disable=SC2046
    in_node python3 "$BC_PY/cluster_stats.py" ready $(daemon_ready_args "$impl") --timeout 400 --interval-ms 5 >"$ready" 2>&1 &
    local rp=$!
    sleep 1.5
    local t_kill
    t_kill=$(bc_now)
    kill -9 "$pid"
    bc_log "restart $k: kill -9 $impl ($pid)"
    wait "$rp"
    local t_up new start
    t_up=$(awk '$1 == "up" {print $2}' "$ready")
    new=$(daemon_pid "$impl") && start=$(python3 "$BC_PY/cluster_stats.py" pidstart "$new")
    [ -n "$t_up" ] && sleep "$AFTER_READY"
    local t_end
    t_end=$(bc_now)
    touch "$stop"
    wait "$sp"
    if [ -z "$t_up" ]; then
      missing restart_ready_ms "not ready again within 400 s ($(cat "$ready"))" "$keys restart=$k"
      continue
    fi
    echo "$(( (t_up - t_kill) / 1000 ))" >>"$RUN/fig/restart_kill_to_ready_ms.$tag"
    [ -n "${start:-}" ] && [ "$new" != "$pid" ] && echo "$(( (t_up - start) / 1000 ))" >>"$RUN/fig/restart_start_to_ready_ms.$tag"
    # Lost: requests sent from the kill until the stream stopped (each had 1 s for its answer).
    local sent lost bsent blost asent alost answered
    read -r sent lost bsent blost < <(python3 "$BC_PY/cluster_stats.py" loss "$stream" "$t0name" "$t_kill" "$t_end" $((t_kill - 1000000)))
    read -r asent alost _ _ < <(python3 "$BC_PY/cluster_stats.py" loss "$stream" "$t0name" "$t_up" "$t_end" "$t_up")
    if [ "${bsent:-0}" -gt 0 ] && [ "${blost:-1}" = 0 ]; then
      echo "$lost" >>"$RUN/fig/restart_lost.$tag"
      bc_log "  ready after $(( (t_up - t_kill) / 1000 )) ms; $lost of $sent requests to $t0name lost from the kill to $AFTER_READY s after ready, $alost of $asent after ready (0 of $bsent in the second before)"
    else
      missing restart_lost "the stream lost $blost of $bsent requests in the second before the kill: a tool or network fault" "$keys restart=$k"
    fi
    answered=$(python3 "$BC_PY/cluster_stats.py" loss "$stream" tdeny 0 0 0 | awk '{print $2}')
    echo "${answered:-missing}" >>"$RUN/fig/restart_denied_answered.$tag"
  done
  echo "LOAD part=restart cluster=$tag impl=$impl before=\"$l0\" after=\"$(loadavg)\""
  result99 restart_kill_to_ready_ms "$RUN/fig/restart_kill_to_ready_ms.$tag" "$keys"
  result99 restart_start_to_ready_ms "$RUN/fig/restart_start_to_ready_ms.$tag" "$keys"
  result99 restart_lost_packets "$RUN/fig/restart_lost.$tag" "$keys interval_ms=2 after_ready_s=$AFTER_READY"
  result99 restart_denied_answered "$RUN/fig/restart_denied_answered.$tag" "$keys"
}
