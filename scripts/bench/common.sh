# Helpers shared by the benchmark scripts (bench-cni, bench-churn, bench-policy, bench-restart).
# Source it after scripts/lib.sh: it relies on lib.sh's netns, manager and cleanup helpers and
# only adds timing, statistics, the 250-pod fleet and the policy generator.

# Bash's own clock (no fork): `$(date +%s%N)` forks a subshell and execs date, 2–15 ms on a loaded
# 2-vCPU VM, and that lands inside every interval it measures.
now_us() { local t=${EPOCHREALTIME/./}; echo $((10#$t)); }

# stats FILE [scale]: "min median p90 max" of one number per line, divided by scale (default 1).
# Nearest-rank percentiles; an empty file gives "- - - -".
stats() {
  sort -n "$1" | awk -v s="${2:-1}" '{a[NR]=$1}
    END {
      if (NR == 0) { print "- - - -"; exit }
      p = int(NR * 0.9 + 0.5); if (p < 1) p = 1
      printf "%.2f %.2f %.2f %.2f\n", a[1]/s, a[int((NR+1)/2)]/s, a[p]/s, a[NR]/s
    }'
}
median() { read -r _ m _ _ <<<"$(stats "$@")"; echo "$m"; }

# installed_plugin PATH NAME: copies a built weft-cni into this run's CNI bin dir
# ($WEFT_TMP/cni-bin/NAME) and prints the copy's path. A plugin runs from where it was
# installed by a copy (`weft-manager --install-cni-bin`, an image's init step), as ptp runs from
# /usr/lib/cni where dpkg put it; never from cargo's target dir. The same bytes exec'd from the
# linker's output (written piecewise) took 158 page faults per ADD against 140 for a copy, and
# 0.3 ms more CPU and wall time, interleaved in one run (2026-11-25, Intel Xeon host).
installed_plugin() {
  mkdir -p "$WEFT_TMP/cni-bin" || die "cannot create $WEFT_TMP/cni-bin"
  cp "$1" "$WEFT_TMP/cni-bin/$2" || die "cannot install $1 into $WEFT_TMP/cni-bin"
  echo "$WEFT_TMP/cni-bin/$2"
}

# Pod i's labels. MIX=mixed (default): 25 apps, 3 tiers, 2 zones -> up to 150 label sets
# (identities) for 250 pods, so selectors match several identities. MIX=deployment: 25
# deployments whose replicas share all labels (tier and zone follow the app) -> 25 identities,
# 10 replicas each at 250 pods: the common shape of a real node.
# scripts/bench/all calls the default mix "today".
MIX=${MIX:-mixed}
case $MIX in today) MIX=mixed ;; mixed | deployment) ;; *) die "MIX must be mixed or deployment, not $MIX" ;; esac
bench_pod_labels() {
  local i=$1
  if [ "$MIX" = deployment ]; then
    local d=$((i % 25))
    printf '[{"key":"app","value":"a%d"},{"key":"tier","value":"t%d"},{"key":"zone","value":"z%d"}]' \
      "$d" $((d % 3)) $((d % 2))
    return
  fi
  printf '[{"key":"app","value":"a%d"},{"key":"tier","value":"t%d"},{"key":"zone","value":"z%d"}]' \
    $((i % 25)) $((i % 3)) $(((i / 25) % 2))
}


# bench_make_pods N: pods p1..pN in their own netns via weft_add_pod (so lib.sh's cleanup trap
# removes them). Sequential: this is set-up, not what is measured.
bench_make_pods() {
  local n=$1 i
  for i in $(seq "$n"); do
    weft_add_pod "p$i" "$(bench_pod_labels "$i")" >/dev/null || die "ADD p$i failed"
  done
}

# The endpoint id of pod NAME.
bench_ep_id() {
  weftctl -o json endpoint list | jq -r --arg c "$WEFT_P-$1" '.[] | select(.container_id == $c) | .id'
}

# bench_gen_policy RULES VARIANT: a Cilium policy file (JSON array, RULES rules in all) on stdout. Every rule has
# its own labels (bench=policy, rule=rN), so re-importing a file with another VARIANT replaces
# each rule (Cilium's label-subset replacement) and changes every port: all rules really change.
# Mix (by N % 10): 6/10 ingress allow fromEndpoints + ports (1/3 of them endPort ranges),
# 1/10 egress toEndpoints UDP ranges, 1/10 egress toCIDRSet with except, 1/10 ingress fromCIDR,
# 1/10 ingressDeny fromEndpoints. Deny rules always carry toPorts, so ICMP is never denied by
# them (bench-restart pings through this policy). Selectors vary over app/tier/zone, matchLabels
# and matchExpressions. Plus two fixed rules:
#  - "probe": apps a0..a9 accept TCP 9090 from role=probe (bench-policy's label change moves a
#    pod into that selector, so the ~100 a0..a9 endpoints must regenerate);
#  - "ping": a1 -> a0 allowed at L3 both ways (egress of a1, ingress of a0), for bench-restart.
bench_gen_policy() {
  jq -n --argjson n "$1" --argjson v "$2" '
    def sel($i):
      ($i % 5) as $k
      | if $k == 0 then {matchLabels: {app: "a\($i % 25)"}}
        elif $k == 1 then {matchLabels: {tier: "t\($i % 3)"}}
        elif $k == 2 then {matchLabels: {app: "a\($i % 25)", zone: "z\($i % 2)"}}
        elif $k == 3 then {matchExpressions: [{key: "app", operator: "In", values: ["a\($i % 25)", "a\(($i + 1) % 25)"]}]}
        else {matchLabels: {tier: "t\($i % 3)", zone: "z\($i % 2)"}} end;
    def port($i): 1024 + (($i * 37 + $v * 101) % 30000);
    def ports($i; $proto):
      [{ports: [{port: "\(port($i))", protocol: $proto}
                + (if $i % 3 == 0 then {endPort: (port($i) + ($i % 16) + 1)} else {} end)]}];
    [range(0; $n - 3) as $i
     | ($i % 10) as $m
     | {labels: [{key: "bench", value: "policy"}, {key: "rule", value: "r\($i)"}],
        endpointSelector: sel($i)}
       + if $m <= 5 then {ingress: [{fromEndpoints: [{matchLabels: {app: "a\(($i * 7) % 25)"}}], toPorts: ports($i; "TCP")}]}
         elif $m == 6 then {egress: [{toEndpoints: [{matchLabels: {tier: "t\(($i / 3 | floor) % 3)"}}], toPorts: ports($i + 1; "UDP")}]}
         elif $m == 7 then {egress: [{toCIDRSet: [{cidr: "172.\(16 + $i % 16).\(($i / 16 | floor) % 256).0/24",
                                                   except: ["172.\(16 + $i % 16).\(($i / 16 | floor) % 256).128/25"]}],
                                      toPorts: ports($i; "TCP")}]}
         elif $m == 8 then {ingress: [{fromCIDR: ["192.168.\($i % 256).0/24"], toPorts: ports($i; "TCP")}]}
         else {ingressDeny: [{fromEndpoints: [{matchLabels: {app: "a\(($i * 3) % 25)"}}], toPorts: ports($i; "TCP")}]} end
    ]
    + [{labels: [{key: "bench", value: "policy"}, {key: "rule", value: "probe"}],
        endpointSelector: {matchExpressions: [{key: "app", operator: "In", values: [range(0; 10) | "a\(.)"]}]},
        ingress: [{fromEndpoints: [{matchLabels: {role: "probe"}}], toPorts: [{ports: [{port: "9090", protocol: "TCP"}]}]}]},
       {labels: [{key: "bench", value: "policy"}, {key: "rule", value: "ping-in"}],
        endpointSelector: {matchLabels: {app: "a0"}},
        ingress: [{fromEndpoints: [{matchLabels: {app: "a1"}}]}]},
       {labels: [{key: "bench", value: "policy"}, {key: "rule", value: "ping-out"}],
        endpointSelector: {matchLabels: {app: "a1"}},
        egress: [{toEndpoints: [{matchLabels: {app: "a0"}}]}]}]'
}

# The weft-manager process's resident set in KiB (lib.sh starts it with nsenter, which execs it:
# the PID is the manager's own).
manager_rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$WEFT_MANAGER_PID/status"; }

# result NAME FILE [scale] [key=value...]: the machine-readable line scripts/bench/all collects,
#   RESULT name=NAME key=value... median=M p10=P p90=Q n=N
# from one number per line in FILE, divided by scale. Nearest-rank percentiles, as `stats`.
# An empty FILE prints nothing: the suite reports the missing figure instead of a fake one.
result() {
  local name=$1 file=$2 scale=${3:-1}
  shift 3 2>/dev/null || shift $#
  [ -s "$file" ] || return 0
  sort -g "$file" | awk -v s="$scale" -v name="$name" -v extra="$*" '{a[NR]=$1}
    END {
      p10 = int(NR * 0.1 + 0.5); if (p10 < 1) p10 = 1
      p90 = int(NR * 0.9 + 0.5); if (p90 < 1) p90 = 1
      printf "RESULT name=%s%s median=%.4g p10=%.4g p90=%.4g n=%d\n", name, (extra == "" ? "" : " " extra),
        a[int((NR+1)/2)]/s, a[p10]/s, a[p90]/s, NR
    }'
}

# probe_change SERVER CLIENT SERVER_IP PORT COMMAND...: times COMMAND, which must make the policy
# let UDP CLIENT -> SERVER:PORT through, to the first packet whose verdict changed
# (scripts/bench/verdict_probe.py: the client sends a datagram carrying its send time every
# PROBE_US µs, default 200; the server reports the first it receives). Before COMMAND the flow
# must be counted as policy drops on SERVER's ingress (a drop, not a broken prober), or the
# script dies. Sets PROBE_DELAY (µs from COMMAND's start to that packet's send time),
# PROBE_FIRST (that send time, µs since the epoch) and PROBE_CMD (µs until COMMAND returned);
# returns 1 with PROBE_ERROR when nothing arrives within
# 10 s, and dies when COMMAND fails.
probe_change() {
  local srv=$1 cli=$2 ip=$3 port=$4 rp sp d0 d1 t0 t1 first out
  shift 4
  local probe=$WEFT_ROOT/scripts/bench/verdict_probe.py
  ip netns exec "${WEFT_P}-$srv" python3 "$probe" recv "$port" 10 >"$WEFT_TMP/recv.out" 2>&1 &
  rp=$!
  for _ in $(seq 100); do grep -q ready "$WEFT_TMP/recv.out" && break; sleep 0.05; done
  grep -q ready "$WEFT_TMP/recv.out" || die "the receiver in $srv did not start: $(cat "$WEFT_TMP/recv.out")"
  d0=$(policy_drops "$srv" ingress) || die "cannot read $srv's drop counters"
  ip netns exec "${WEFT_P}-$cli" python3 "$probe" send "$ip" "$port" "${PROBE_US:-200}" >"$WEFT_TMP/send.out" 2>&1 &
  sp=$!
  for _ in $(seq 100); do grep -q sending "$WEFT_TMP/send.out" && break; sleep 0.05; done
  # The flow is dropped by policy (the server's ingress drop counter grows), not lost to a tool error.
  for _ in $(seq 50); do
    sleep 0.1
    d1=$(policy_drops "$srv" ingress) || die "cannot read $srv's drop counters"
    [ "$d1" -gt "$d0" ] && break
  done
  if ! kill -0 "$rp" 2>/dev/null || [ "$d1" -le "$d0" ]; then
    kill "$sp" "$rp" 2>/dev/null; wait "$sp" "$rp" 2>/dev/null
    die "$cli -> $srv udp/$port is not denied by policy before the change (receiver: $(cat "$WEFT_TMP/recv.out"); sender: $(cat "$WEFT_TMP/send.out"); $srv ingress policy drops $d0 -> $d1)"
  fi
  # The clock read in place: `$(now_us)` would put a subshell's fork and exit in the interval.
  t0=${EPOCHREALTIME/./}
  out=$("$@" 2>&1) || { kill "$sp" "$rp" 2>/dev/null; wait "$sp" "$rp" 2>/dev/null; die "$* failed: $out"; }
  t1=${EPOCHREALTIME/./}
  wait "$rp"
  kill "$sp" 2>/dev/null; wait "$sp" 2>/dev/null
  first=$(tail -1 "$WEFT_TMP/recv.out")
  PROBE_CMD=$((10#$t1 - 10#$t0))
  if [[ $first =~ ^[0-9]+$ ]]; then
    PROBE_FIRST=$first
    PROBE_DELAY=$((first - 10#$t0))
    return 0
  fi
  PROBE_ERROR="no packet through 10 s after the change ($first)"
  return 1
}

# bench_gen_cnps N VARIANT: N ClusterNetworkPolicies (policy.networking.k8s.io/v1beta1, a YAML
# List) on stdout, named bench-cnp-I. Mixed tiers (3/5 Admin, 2/5 Baseline), priorities spread
# over 0..99 (+ VARIANT: another VARIANT moves every priority), subjects by app over the bench
# pods' labels, three rules each: Admin — Deny TCP 2000+I from one app, Pass from one tier,
# Accept from every namespace on TCP 8080; Baseline — Deny egress to a /24 outside the pod CIDR,
# Accept egress to one app, Deny ingress from one zone on UDP 5000-5099. No rule names TCP 9090,
# ICMP or the srv/cli pair (role=bsrv/bcli) of bench-policy's one-rule change.
bench_gen_cnps() {
  python3 - "$1" "$2" <<'PY'
import sys, yaml
n, v = int(sys.argv[1]), int(sys.argv[2])
def pods(sel):
    return {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": sel}}}
def tcp(p):
    return [{"tcp": {"destinationPort": {"number": p}}}]
items = []
for i in range(n):
    admin = i % 5 < 3
    spec = {"tier": "Admin" if admin else "Baseline",
            "priority": (i * 7) % 100 + v,
            "subject": pods({"app": f"a{i % 25}"})}
    if admin:
        spec["ingress"] = [
            {"name": "deny-app", "action": "Deny", "from": [pods({"app": f"a{(i * 3) % 25}"})], "protocols": tcp(2000 + i)},
            {"name": "pass-tier", "action": "Pass", "from": [pods({"tier": f"t{i % 3}"})]},
            {"name": "accept-ns", "action": "Accept", "from": [{"namespaces": {}}], "protocols": tcp(8080)},
        ]
    else:
        spec["egress"] = [
            {"name": "deny-net", "action": "Deny", "to": [{"networks": [f"172.31.{i % 256}.0/24"]}]},
            {"name": "accept-app", "action": "Accept", "to": [pods({"app": f"a{(i * 7) % 25}"})]},
        ]
        spec["ingress"] = [
            {"name": "deny-zone", "action": "Deny", "from": [pods({"zone": f"z{i % 2}"})],
             "protocols": [{"udp": {"destinationPort": {"range": {"start": 5000, "end": 5099}}}}]},
        ]
    items.append({"apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
                  "metadata": {"name": f"bench-cnp-{i}"}, "spec": spec})
yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout, sort_keys=False)
PY
}
