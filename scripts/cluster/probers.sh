# shellcheck shell=bash
# Continuous probers for the checks that disturb a cluster while traffic flows (checks.d/
# upgrade.sh, checks.d/faults.sh); sourced after checks-lib.sh.
#
# A prober is an agnhost pod pinned to a node that, once started (pr_go), sends one HTTP
# request (curl, a new TCP connection, 1 s limit) to each of its targets in turn, about 10 a
# second, and logs one line per request: "N EPOCH-SECONDS TARGET CODE CONNECT TOTAL", CODE being
# curl's exit status: 0 answered, 28 timed out (what a policy drop looks like: the SYN went
# unanswered), anything else a failure of the probe itself (7: refused or no route, 6: ...),
# which is never counted as a drop; CONNECT and TOTAL are curl's time_connect and time_total in
# seconds (CONNECT 0 on a timeout: no SYN-ACK came back within the second; a timeout after a
# connect is a late answer, not a lost packet). The log is read at the end (pr_log), the pods stay running until their
# namespace goes.

# pr_server NS NAME NODE LABELS: the YAML of an agnhost HTTP server on port 8080.
pr_server() {
  cat <<EOT
---
apiVersion: v1
kind: Pod
metadata: {name: $2, namespace: $1, labels: {$4}}
spec:
  nodeName: $3
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: $AGNHOST_IMAGE
    args: [netexec, --http-port=8080]
EOT
}

# pr_fixture NS APP [own]: namespace NS with, on each of nodes 1 and 2, a server srvI (app:
# APP-srv) selected by a NetworkPolicy admitting `role: allowed` only and a server openI (app:
# APP-open) selected by none (sets SRV1 SRV2 OPEN1 OPEN2 to their addresses), then the probers:
# okI (`role: allowed`) probing the other node's srv (with `own`, ok1 also srv1 on its own
# node), noI (`role: denied`) probing the other node's srv and open in turn (each answer of open
# is the control of the drops at srv). Waits until every pod is Ready. Not in a subshell (it
# sets variables): its output goes to $CL_LOGS/NS-fixture.txt, and `check ... pr_ready NS`
# judges it.
pr_fixture() {
  PR_FIXTURE_RC=0
  pr_fixture_make "$@" >"$CL_LOGS/$1-fixture.txt" 2>&1 || PR_FIXTURE_RC=1
}
pr_ready() { [ "$PR_FIXTURE_RC" = 0 ] || { cat "$CL_LOGS/$1-fixture.txt"; return 1; }; }
pr_fixture_make() {
  local ns=$1 app=$2 own=${3:-} extra='' i
  kc delete namespace "$ns" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1
  {
    echo "apiVersion: v1"
    echo "kind: Namespace"
    echo "metadata: {name: $ns}"
    for i in 1 2; do
      pr_server "$ns" "srv$i" "$(ck_node "$i")" "app: $app-srv"
      pr_server "$ns" "open$i" "$(ck_node "$i")" "app: $app-open"
    done
  } | kc apply -f - >/dev/null || return 1
  kc -n "$ns" wait --for=condition=Ready pod --all --timeout=120s >/dev/null || { kc -n "$ns" get pods -o wide; return 1; }
  SRV1=$(pod_ip "$ns" srv1) SRV2=$(pod_ip "$ns" srv2) OPEN1=$(pod_ip "$ns" open1) OPEN2=$(pod_ip "$ns" open2)
  kc apply -f - >/dev/null <<EOT || return 1
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: srv-from-allowed, namespace: $ns}
spec:
  podSelector: {matchLabels: {app: $app-srv}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {role: allowed}}
EOT
  [ "$own" = own ] && extra=$SRV1:8080
  {
    # shellcheck disable=SC2086 # $extra: one IP:PORT or nothing
    pr_pod "$ns" ok1 "$(ck_node 1)" "role: allowed" "$SRV2:8080" $extra
    pr_pod "$ns" ok2 "$(ck_node 2)" "role: allowed" "$SRV1:8080"
    pr_pod "$ns" no1 "$(ck_node 1)" "role: denied" "$SRV2:8080" "$OPEN2:8080"
    pr_pod "$ns" no2 "$(ck_node 2)" "role: denied" "$SRV1:8080" "$OPEN1:8080"
  } | kc apply -f - >/dev/null || return 1
  kc -n "$ns" wait --for=condition=Ready pod --all --timeout=120s >/dev/null || { kc -n "$ns" get pods -o wide; return 1; }
}

# pr_pod NS NAME NODE LABELS TARGET...: the YAML of a prober (TARGET: IP:PORT).
pr_pod() {
  local ns=$1 name=$2 node=$3 labels=$4; shift 4
  cat <<EOT
---
apiVersion: v1
kind: Pod
metadata: {name: $name, namespace: $ns, labels: {$labels}}
spec:
  nodeName: $node
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  containers:
  - name: c
    image: $AGNHOST_IMAGE
    env: [{name: TARGETS, value: "$*"}]
    command: [/bin/sh, -c]
    args:
    - |
      while [ ! -e /tmp/go ]; do sleep 0.2; done
      n=0
      while [ ! -e /tmp/stop ]; do
        for t in \$TARGETS; do
          n=\`expr \$n + 1\`
          c=0
          o=\`curl -s -m 1 -o /dev/null -w '%{time_connect} %{time_total}' "http://\$t/hostname"\` || c=\$?
          echo "\$n \`date +%s\` \$t \$c \$o"
        done
        sleep 0.07
      done
      echo stopped
      # Stay: a container that exits is restarted, and its log with it.
      while :; do sleep 3600; done
EOT
}

# pr_go NS POD...: starts the probers.  pr_stop NS POD...: stops them (they finish the round).
pr_go() { local ns=$1 p; shift; for p in "$@"; do kc -n "$ns" exec "$p" -- touch /tmp/go || return 1; done; }
pr_stop() { local ns=$1 p; shift; for p in "$@"; do kc -n "$ns" exec "$p" -- touch /tmp/stop >/dev/null 2>&1; done; return 0; }

# pr_log NS POD: the prober's lines (nothing else: not the "stopped" line).
pr_log() {
  local out
  out=$(kc -n "$1" logs "$2" 2>&1) || { echo "pr_log $1/$2: $out" >&2; return 1; }
  grep -E '^[0-9]+ [0-9]+ [0-9.:]+ [0-9]+( [0-9.]+ [0-9.]+)?$' <<<"$out"
}

# pr_judge LOGFILE TARGET WANT [FROM [TO]]: every request to TARGET logged in [FROM, TO) (epoch
# seconds; default: all) ended with WANT (answered: 0, dropped: 28), and there was at least one.
# Prints the counts; fails naming what else happened (a drop where an answer was wanted is a
# loss; a code other than 0 or 28 a probe error, whatever was wanted).
pr_judge() {
  local f=$1 target=$2 want=$3 from=${4:-0} to=${5:-99999999999}
  awk -v t="$target" -v w="$want" -v a="$from" -v b="$to" '
    $3 == t && $2 >= a && $2 < b {
      n++
      if ($4 == w) ok++
      else if ($4 == 0) ans++
      else if ($4 == 28) { drop++; if (!d) d = $0 }
      else { err++; if (!e) e = $0 }
    }
    END {
      printf "%d requests to %s: %d as wanted (%s)", n, t, ok, (w == 0 ? "answered" : "dropped")
      if (ans) printf ", %d ANSWERED", ans
      if (drop) printf ", %d DROPPED (timed out; first: %s)", drop, d
      if (err) printf ", %d probe errors (first: %s)", err, e
      printf "\n"
      exit !(n > 0 && ok == n)
    }' "$f"
}

# pr_count LOGFILE FROM TO: how many requests were logged in [FROM, TO).
pr_count() { awk -v a="$2" -v b="$3" '$2 >= a && $2 < b {n++} END {print n + 0}' "$1"; }

