# A rolling upgrade of the weft DaemonSet under continuous cross-node traffic with policy in
# force (issue 30, item 4), sourced by checks. The other build is scripts/cluster/upgrade-image's
# (WEFT_UPGRADE_IMAGE=FILE picks another archive): the same policy encoded into other map
# entries under another encoding version, so every slot must be read back and rewritten.
#
# Pods, per node I (J the other node): srvI (app=up-srv, selected by a NetworkPolicy that admits
# role=allowed only), openI (app=up-open, selected by none), okI (role=allowed, probing srvJ) and
# noI (role=denied, probing srvJ and openJ in turn). The probers (scripts/cluster/probers.sh)
# run from before the roll to after the roll back, one new TCP connection per request:
#   - every request of okI answered (0 lost across both rolls),
#   - every request of noI to srvJ dropped (no pod unprotected at any moment), each told from a
#     probe error, and every one of its requests to openJ answered (the positive control: the
#     prober, its network and its node work all along),
#   - no WeftEndpoint of the fixture's pods withdrawn during the rolls (a watch of them that saw
#     their listing saw no DELETED event): a manager starting in a new pod once withdrew its
#     node's objects until its pod watch listed, and the other node dropped those pods' requests
#     as the world's for that moment,
# then, after the roll to the other build and after the roll back: every weft pod runs the
# image rolled to and is ready, `weftctl map verify` says consistent on every node, and each
# manager's log says it found slots another policy compiler wrote (the other encoding version)
# and read them back. Restores the DaemonSet's image on failure. Skipped on one node and when
# the other build's archive is absent.
# shellcheck shell=bash
source "$CL_ROOT/scripts/cluster/probers.sh"
UP_NODES=$(cl_node_count)
UP_TAR=${WEFT_UPGRADE_IMAGE:-$CL_ROOT/target/weft-image-upgrade-test.tar}
if [ "$UP_NODES" -lt 2 ]; then
  echo "  skip upgrade: cluster $CL_NAME has $UP_NODES node; a rolling upgrade needs several: scripts/cluster/up --nodes 2"
  return 0
fi
if [ ! -f "$UP_TAR" ]; then
  echo "  skip upgrade: the other build's image $UP_TAR is absent: make it with scripts/cluster/upgrade-image"
  return 0
fi
U=wck-up
ds_image() { kc -n kube-system get ds weft -o jsonpath='{.spec.template.spec.containers[0].image}'; }
IMG_A=$(ds_image)
IMG_B=$(tar -xOf "$UP_TAR" ./index.json | jq -r '.manifests[0].annotations["io.containerd.image.name"]')
echo "   (rolling $IMG_A -> $IMG_B -> $IMG_A on $UP_NODES nodes)"
imported() {
  local i
  for i in $(seq "$UP_NODES"); do
    cl_use_node "$i"
    cl_import_image "$UP_TAR" "$IMG_B" || { cl_use_node 1; return 1; }
  done
  cl_use_node 1
}
check "the other build ($IMG_B) imported into every node's containerd" imported
[ "$IMG_A" != "$IMG_B" ] || ck_fail "the DaemonSet runs $IMG_B already: set it back to the first build first"

CK_RESTORE+=("kc delete namespace $U --ignore-not-found --wait=true --timeout=120s")
CK_RESTORE+=("[ \"\$(ds_image)\" = '$IMG_A' ] || { kc -n kube-system set image ds/weft weft-manager='$IMG_A'; kc -n kube-system rollout status ds/weft --timeout=300s; }")
pr_fixture "$U" up
check "servers and probers Ready on both nodes (srv1 $SRV1, srv2 $SRV2)" pr_ready "$U"
# The policy in force before the probers start: the denied clients' first request must
# already be dropped (each told from a probe error by its control to the open server).
check "before the roll: no1 ($(ck_node 1)) reaches open2, is dropped at srv2" eval \
  'within 20 reaches "$U" no1 "$OPEN2" 8080 && within 20 dropped "$U" no1 "$SRV2" 8080'
check "before the roll: no2 ($(ck_node 2)) reaches open1, is dropped at srv1" eval \
  'within 20 reaches "$U" no2 "$OPEN1" 8080 && within 20 dropped "$U" no2 "$SRV1" 8080'
check "before the roll: ok1 reaches srv2, ok2 reaches srv1 (allowed by pod label)" eval \
  'within 20 reaches "$U" ok1 "$SRV2" 8080 && within 20 reaches "$U" ok2 "$SRV1" 8080'
check "probers started" pr_go "$U" ok1 ok2 no1 no2
# Every WeftEndpoint event of the fixture's pods during the rolls: a manager starting in a new
# pod must not withdraw its node's objects (every other node would drop the pods' addresses
# and identities from its ipcache, and its policy would see them as the world until they are
# published again); the probers catch that only when a request falls in the gap.
kc -n "$U" get weftendpoints -w --output-watch-events -o jsonpath='{.type} {.object.metadata.name}{"\n"}' \
  >"$CL_LOGS/upgrade-weftendpoints.txt" 2>&1 &
UP_WATCH=$!
# The function's subshell and its kubectl (nsenter execs it), so no watch outlives the group; the
# subshell ends when kubectl does, so it being alive says the watch still runs.
up_unwatch() { pkill -P "$UP_WATCH" 2>/dev/null; kill "$UP_WATCH" 2>/dev/null; }
CK_RESTORE+=("up_unwatch")
sleep 5

weft_pod_on() { kc -n kube-system get pods -l k8s-app=weft --field-selector "spec.nodeName=$1" -o jsonpath='{.items[0].metadata.name}'; }
weftctl_node() { local n=$1 p; shift; p=$(weft_pod_on "$n"); [ -n "$p" ] || { echo "no weft pod on $n"; return 1; }; kc -n kube-system exec "$p" -c weft-manager -- /usr/local/bin/weftctl "$@"; }
# runs_image NODE IMAGE: the node's weft pod is of IMAGE, its container started from it and ready.
runs_image() {
  local p j
  p=$(weft_pod_on "$1")
  j=$(kc -n kube-system get pod "$p" -o json) || return 1
  jq -e --arg i "$2" '.spec.containers[0].image == $i and .status.containerStatuses[0].image == $i and .status.containerStatuses[0].ready' <<<"$j" >/dev/null ||
    { echo "$1: pod $p $(jq -c '{spec: .spec.containers[0].image, status: [.status.containerStatuses[0] | .image, .ready]}' <<<"$j")"; return 1; }
}
verified() { local out; out=$(weftctl_node "$1" map verify 2>&1) && grep -q consistent <<<"$out" && ! grep -qi inconsistent <<<"$out" || { echo "$out"; return 1; }; }
# rewrote NODE [BY]: the manager's log says it found slots another policy compiler wrote
# (written_by, BY when given) than its own (this_build), and read them back (read_back > 0).
rewrote() {
  local l by this
  l=$(kc -n kube-system logs "$(weft_pod_on "$1")" -c weft-manager 2>&1 | grep 'written by another policy compiler' | tail -1)
  [ -n "$l" ] || { echo "$1: no 'written by another policy compiler' line in the manager's log"; return 1; }
  # JSON lines (WEFT_LOG's format in the DaemonSet), fields under .fields.
  by=$(jq -r '.fields.written_by // empty' <<<"$l" 2>/dev/null)
  this=$(jq -r '.fields.this_build // empty' <<<"$l" 2>/dev/null)
  [ -n "$by" ] && [ -n "$this" ] && [ "$by" != "$this" ] && { [ -z "${2:-}" ] || [ "$by" = "$2" ]; } &&
    jq -e '.fields.read_back > 0' <<<"$l" >/dev/null ||
    { echo "$1: $l (wanted written_by=${2:-another build} != this_build, read_back > 0)"; return 1; }
  echo "$1: $this read back slots of $by"
}
# compiler_of NODE: the compiler of the manager running on NODE, as it logged it.
compiler_of() {
  kc -n kube-system logs "$(weft_pod_on "$1")" -c weft-manager 2>&1 | grep 'written by another policy compiler' |
    tail -1 | jq -r '.fields.this_build // empty' 2>/dev/null
}
# roll IMAGE: the DaemonSet's image set to IMAGE and rolled node by node (RollingUpdate,
# maxUnavailable 1, conf/k8s/03-daemonset.yaml); prints the seconds it took.
roll() {
  local t0=$SECONDS
  kc -n kube-system set image ds/weft weft-manager="$1" >/dev/null &&
    kc -n kube-system rollout status ds/weft --timeout=300s >/dev/null || return 1
  echo $((SECONDS - t0))
}
strategy=$(kc -n kube-system get ds weft -o jsonpath='{.spec.updateStrategy.type}/{.spec.updateStrategy.rollingUpdate.maxUnavailable}')
check "the DaemonSet rolls node by node (RollingUpdate/1: $strategy)" test "$strategy" = RollingUpdate/1

T_ROLL1=$(date +%s)
if took=$(roll "$IMG_B" 2>&1); then ck_pass "rolled to $IMG_B node by node in ${took}s"; else ck_fail "roll to $IMG_B" "$took"; fi
T_ROLL1_END=$(date +%s)
sleep 3
for i in $(seq "$UP_NODES"); do
  n=$(ck_node "$i")
  check "$n runs $IMG_B, ready" within 60 runs_image "$n" "$IMG_B"
  check "$n: weftctl map verify says consistent (the maps equal a from-scratch computation of $IMG_B)" within 30 verified "$n"
  check "$n: the manager of $IMG_B read back and rewrote the slots $IMG_A wrote" rewrote "$n"
done
C_B=$(compiler_of "$(ck_node 1)")
echo "   ($IMG_B's manager: $C_B)"

T_ROLL2=$(date +%s)
if took=$(roll "$IMG_A" 2>&1); then ck_pass "rolled back to $IMG_A node by node in ${took}s"; else ck_fail "roll back to $IMG_A" "$took"; fi
T_ROLL2_END=$(date +%s)
sleep 3
for i in $(seq "$UP_NODES"); do
  n=$(ck_node "$i")
  check "$n runs $IMG_A again, ready" within 60 runs_image "$n" "$IMG_A"
  check "$n: weftctl map verify says consistent after the roll back" within 30 verified "$n"
  check "$n: the manager of $IMG_A read back and rewrote the slots $IMG_B wrote ($C_B)" rewrote "$n" "$C_B"
done
sleep 2
UP_WATCHED=1
kill -0 "$UP_WATCH" 2>/dev/null || UP_WATCHED=0
up_unwatch
# withdrew_none: the watch saw the 8 pods' objects listed (it worked), was still watching at the
# end, and saw no DELETED event.
withdrew_none() {
  local f=$CL_LOGS/upgrade-weftendpoints.txt
  [ "$(grep -c '^ADDED ' "$f")" -ge 8 ] || { echo "the watch of WeftEndpoints saw no listing: $(head -3 "$f")"; return 1; }
  [ "$UP_WATCHED" = 1 ] || { echo "the watch of WeftEndpoints ended before the rolls did: $(tail -3 "$f")"; return 1; }
  ! grep '^DELETED ' "$f" || { echo "(withdrawn during the rolls: $f)"; return 1; }
}
check "no pod's WeftEndpoint withdrawn across both rolls (other nodes kept its address and identity)" withdrew_none
pr_stop "$U" ok1 ok2 no1 no2
sleep 2
for p in ok1 ok2 no1 no2; do pr_log "$U" "$p" >"$CL_LOGS/upgrade-$p.log"; done
echo "   (probes during the roll to $IMG_B: $(pr_count "$CL_LOGS/upgrade-ok2.log" "$T_ROLL1" "$T_ROLL1_END") from ok2, during the roll back: $(pr_count "$CL_LOGS/upgrade-ok2.log" "$T_ROLL2" "$T_ROLL2_END"); logs $CL_LOGS/upgrade-*.log)"
check "ok1 ($(ck_node 1)) -> srv2: every request answered across both rolls" pr_judge "$CL_LOGS/upgrade-ok1.log" "$SRV2:8080" 0
check "ok2 ($(ck_node 2)) -> srv1: every request answered across both rolls" pr_judge "$CL_LOGS/upgrade-ok2.log" "$SRV1:8080" 0
check "no1 ($(ck_node 1)) -> open2: every request answered (the control of its drops)" pr_judge "$CL_LOGS/upgrade-no1.log" "$OPEN2:8080" 0
check "no2 ($(ck_node 2)) -> open1: every request answered (the control of its drops)" pr_judge "$CL_LOGS/upgrade-no2.log" "$OPEN1:8080" 0
check "no1 ($(ck_node 1)) -> srv2: every request dropped across both rolls" pr_judge "$CL_LOGS/upgrade-no1.log" "$SRV2:8080" 28
check "no2 ($(ck_node 2)) -> srv1: every request dropped across both rolls" pr_judge "$CL_LOGS/upgrade-no2.log" "$SRV1:8080" 28
check "requests were made during each roll" eval \
  '[ "$(pr_count "$CL_LOGS/upgrade-ok2.log" "$T_ROLL1" "$T_ROLL1_END")" -gt 0 ] && [ "$(pr_count "$CL_LOGS/upgrade-ok2.log" "$T_ROLL2" "$T_ROLL2_END")" -gt 0 ]'
kc delete namespace "$U" --wait=false >/dev/null 2>&1
