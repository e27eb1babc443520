#!/usr/bin/env bash
# The bounded part of the real-cluster tests that the README's test command runs: a cluster of
# its own (scripts/cluster/up, named after this run), a handful of the upstream NetworkPolicy
# and Networking e2e tests (Kubernetes' e2e.test, unmodified), three of the network-policy-api
# ClusterNetworkPolicy conformance tests, the real-cluster checks
# (scripts/cluster/checks) and scripts/cluster/down, which runs even when a step fails. The
# components and images come from scripts/cluster/build and scripts/cluster/images, cached under
# /var/cache/weft-cluster (the first run on a machine builds them). The whole upstream suite is
# `scripts/cluster/e2e` (docs/KUBERNETES.md).
#
#   scripts/e2e/cluster.sh [--nodes 2]
# With --nodes 2 (scripts/e2e/cluster_nodes.sh) the cluster has two nodes and the tests are those
# that judge traffic and policy between them: the upstream tests whose pods land on both nodes,
# the network-policy-api suite's own test binary (unmodified: it needs two nodes), and the checks
# groups of several nodes.
#
# Prints "cluster: N passed, M failed" ("cluster-2-nodes: ..." with --nodes 2): each upstream
# test and each check is one.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
nodes=1
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    *) echo "cluster.sh: unknown argument $1 (--nodes 1|2)" >&2; exit 2 ;;
  esac
done
case $nodes in
  1) label=cluster ;;
  2) label=cluster-2-nodes ;;
  *) echo "cluster.sh: --nodes $nodes: 1 or 2 (scripts/cluster/up takes up to 3 itself)" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "cluster.sh: needs root" >&2; exit 1; }
export WEFT_CLUSTER=c$(printf '%04x' $((RANDOM ^ $$ & 0xffff)))
out=$(mktemp -d "/tmp/weft-cluster-$WEFT_CLUSTER.XXXX")
passed=0 failed=0

finish() {
  local rc=$?
  if [ "$failed" != 0 ] || [ "$rc" != 0 ]; then
    bash "$root/scripts/cluster/down" --keep-logs "$out/logs" >&2
    echo "cluster.sh: logs kept in $out/logs" >&2
  else
    bash "$root/scripts/cluster/down" >&2
    rm -rf "$out"
  fi
  echo "$label: $passed passed, $failed failed"
  [ "$failed" = 0 ] && [ "$rc" = 0 ]
}
trap finish EXIT
trap 'exit 130' INT TERM
fatal() { echo "cluster.sh: $*" >&2; failed=$((failed + 1)); exit 1; }

t0=$(date +%s)
step() { echo "-- $1 ($(($(date +%s) - t0)) s)"; }
step "components and images (scripts/cluster/build, scripts/cluster/images)"
bash "$root/scripts/cluster/build" >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; fatal "scripts/cluster/build failed"; }
bash "$root/scripts/cluster/images" >"$out/images.log" 2>&1 || { tail -20 "$out/images.log"; fatal "scripts/cluster/images failed"; }

# Weft's image from the binaries scripts/test built (scripts/image --no-build): building them
# again with scripts/image's narrower package selection would resolve other features and
# recompile the manager. The statically linked plugin it prefers is brought up to date first.
step "scripts/build-cni, scripts/cluster/up --no-build --nodes $nodes (cluster $WEFT_CLUSTER)"
bash "$root/scripts/build-cni" --quiet >"$out/build-cni.log" 2>&1 || { tail -20 "$out/build-cni.log"; fatal "scripts/build-cni failed"; }
bash "$root/scripts/cluster/up" --no-build --nodes "$nodes" || fatal "scripts/cluster/up failed"
passed=$((passed + 1))
echo "  ok   cluster up ($nodes node(s)), Weft installed with kubectl apply -f conf/k8s/, every Node Ready after the conflist"

# A handful of the upstream tests: ingress and egress NetworkPolicy, a named port, namespace
# selectors, egress rules allowing specific peers (the suite probes them through their Services'
# ClusterIPs: Weft's Service translation), the API test, and pod-to-pod connectivity without
# policy.
if [ "$nodes" = 1 ]; then
FOCUS='\[sig-network\] (Netpol NetworkPolicy between server and client should (support a .default-deny-ingress. policy|enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector|allow ingress access on one named port|deny egress from pods based on PodSelector|allow egress access to server in CIDR block|enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector) |Netpol API should support creating NetworkPolicy API operations( |$)|Networking Granular Checks: Pods should function for intra-pod communication: http )'
FOCUS_COUNT=8
else
  # Two nodes: the Networking checks start a server on every node and probe every pair, so
  # cross-node TCP and UDP; the NetworkPolicy tests' pods are spread by the scheduler over both
  # nodes, so their verdicts are judged across nodes (CRD identities).
  FOCUS='\[sig-network\] (Netpol NetworkPolicy between server and client should (support a .default-deny-ingress. policy|enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector|deny egress from pods based on PodSelector|allow ingress access on one named port) |Networking Granular Checks: Pods should function for intra-pod communication: (http|udp) )'
  FOCUS_COUNT=6
fi
step "upstream e2e tests (scripts/cluster/e2e)"
bash "$root/scripts/cluster/e2e" --focus "$FOCUS" --out "$out/e2e" --timeout 40m | grep -E '^(PASS|FAIL|SKIP|MULTI|  )|^e2e:'
line=$(grep -E '^e2e: [0-9]+ passed, [0-9]+ failed' "$out/e2e/summary.txt" 2>/dev/null)
if [ -z "$line" ]; then
  fatal "the upstream tests gave no summary (log: $out/e2e/e2e.log)"
fi
read -r p f < <(sed -E 's/^e2e: ([0-9]+) passed, ([0-9]+) failed.*/\1 \2/' <<<"$line")
[ "$((p + f))" -ge "$FOCUS_COUNT" ] || { echo "  FAIL the focus selected $((p + f)) tests, expected $FOCUS_COUNT"; f=$((f + 1)); }
passed=$((passed + p)) failed=$((failed + f))

# A few of the network-policy-api conformance tests (ClusterNetworkPolicy, the suite's test code
# unmodified; scripts/cluster/netpol-conformance): priorities and Pass into the Baseline tier,
# Admin and Baseline tiers with NetworkPolicy between them, and TCP rules of the Baseline tier.
NETPOL_RUN='^(CNPAdminTierPriorityField|CNPAdminTierIntegration|CNPBaselineTierIngressTCP)$'
step "network-policy-api conformance tests (scripts/cluster/netpol-conformance)"
bash "$root/scripts/cluster/netpol-conformance" --run "$NETPOL_RUN" --out "$out/netpol" | grep -E '^(PASS|FAIL|SKIP|  )|^netpol-conformance:'
line=$(grep -E '^netpol-conformance: [0-9]+ passed, [0-9]+ failed' "$out/netpol/summary.txt" 2>/dev/null)
if [ -z "$line" ]; then
  fatal "the conformance tests gave no summary (output: $out/netpol)"
fi
read -r p f < <(sed -E 's/^netpol-conformance: ([0-9]+) passed, ([0-9]+) failed.*/\1 \2/' <<<"$line")
[ "$((p + f))" -ge 3 ] || { echo "  FAIL the --run selected $((p + f)) tests, expected 3"; f=$((f + 1)); }
passed=$((passed + p)) failed=$((failed + f))
# One node: every group (multinode says it is skipped). Two nodes: the groups about nodes.
groups=()
[ "$nodes" = 2 ] && groups=(multinode)
step "real-cluster checks (scripts/cluster/checks ${groups[*]})"
bash "$root/scripts/cluster/checks" "${groups[@]}" | tee "$out/checks.log"
line=$(grep -E '^checks: [0-9]+ passed, [0-9]+ failed$' "$out/checks.log")
if [ -z "$line" ]; then
  fatal "scripts/cluster/checks gave no summary"
fi
read -r p f < <(sed -E 's/^checks: ([0-9]+) passed, ([0-9]+) failed$/\1 \2/' <<<"$line")
passed=$((passed + p)) failed=$((failed + f))
step "scripts/cluster/down"
