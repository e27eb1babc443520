#!/usr/bin/env bash
# The real runtime: containerd 1.6's CRI drives weft-cni (chained with portmap)
# end to end, over the CRI gRPC API (weft-cri), the way kubelet does. containerd and weft-manager
# run inside the private node netns; see scripts/containerd/lib.sh for what is created and how it
# is all removed. Pods are sandboxes (pause only): traffic "from inside a pod" is
# nsenter --net=<the netns path containerd reports>.
#
# Part 1 (cniVersion 1.0.0): IPs, traffic, a policy selecting pods by weft.io/label.* annotations,
# Stop+Remove, containerd restart, kill -9 of the manager, 20 pods 4-way in parallel, hostPort,
# ingress and egress bandwidth enforced by Weft (iperf3). Then cniVersion 0.4.0: run, status,
# traffic, stop, remove. 1.1.0's STATUS and GC are covered by direct invocations (versions.sh).
source "$(dirname "$0")/../lib.sh"
weft_plan 43
source "$WEFT_ROOT/scripts/containerd/lib.sh"
command -v iperf3 >/dev/null || die "iperf3 is missing: run scripts/setup"

MGR_FLAGS=(--pod-cidr 10.0.31.0/24)
ctrd_setup
weft_make_node
weft_start_manager "${MGR_FLAGS[@]}"
PORTMAP='{"type":"portmap","capabilities":{"portMappings":true},"snat":true}'
ctrd_conflist 1.0.0 "$PORTMAP"
ctrd_start

# An "outside" client netns wired to the node, for hostPort: node 192.0.2.1/24, client .2.
CLIENT=${WEFT_P}-client
ip netns add "$CLIENT" || die "cannot create $CLIENT"
ip link add "${WEFT_P}x" netns "$CLIENT" type veth peer name "${WEFT_P}n" netns "$WEFT_NODE" ||
  die "cannot create the client veth"
ip -n "$CLIENT" addr add 192.0.2.2/24 dev "${WEFT_P}x" && ip -n "$CLIENT" link set "${WEFT_P}x" up &&
  ip -n "$CLIENT" link set lo up && in_node ip addr add 192.0.2.1/24 dev "${WEFT_P}n" &&
  in_node ip link set "${WEFT_P}n" up || die "cannot address the client veth"

ep_of() { weftctl -o json endpoint list | jq -c --arg c "$1" '.[] | select(.container_id == $c)'; }
ip_matches() { local s e; s=$(pod_sip "$1"); e=$(ep_of "$1" | jq -r '.ips[0].address'); [ -n "$s" ] && [ "$s" = "$e" ] || { echo "CRI $s, weft $e"; return 1; }; }
sb_ping() { in_sandbox "$1" ping -c1 -W2 -q "$(pod_sip "$2")" >/dev/null; }
# ns_tcp SERVER_NETNS SERVER_IP CLIENT_NETNS PORT: a TCP connect between two netns paths (works
# while containerd is down, when PodSandboxStatus cannot answer).
ns_tcp() {
  local ns=$1 ip=$2 cns=$3 port=$4 rc i
  nsenter --net="$ns" timeout 5 nc -l "$port" >/dev/null 2>&1 &
  local spid=$!
  for i in $(seq 50); do listening "$port" nsenter --net="$ns" && break; sleep 0.02; done
  nsenter --net="$cns" nc -v -z -w 2 "$ip" "$port"; rc=$?
  kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
  return $rc
}
# sb_tcp SERVER_ID CLIENT_ID PORT: a TCP connect from the client sandbox to the server's pod IP.
sb_tcp() { ns_tcp "$(pod_netns "$1")" "$(pod_sip "$1")" "$(pod_netns "$2")" "$3"; }
has_label() { ep_of "$1" | jq -e --arg k "$2" --arg v "$3" 'any(.labels[]; (.key == $k or (.key | endswith(":" + $k))) and .value == $v)' >/dev/null; }
counts() { # endpoints, IPAM allocations, host veths, ipcache entries
  echo "$(weftctl -o json endpoint list | jq length) $(weftctl -o json ipam list | jq length)" \
    "$(in_node ip -o link show type veth | grep -c ': weft[0-9a-f]')" \
    "$(weftctl -o json map dump ipcache | jq length)"
}

counts_are() { [ "$(counts)" = "$1" ] || { echo "now: $(counts)"; return 1; }; }

echo "== pods in two namespaces, labels from annotations"
WEB=$(pod_run web shop --annotation weft.io/label.app=web --label app=web) || die "RunPodSandbox web failed"
CLI=$(pod_run client shop --annotation weft.io/label.role=client) || die "RunPodSandbox client failed"
BAD=$(pod_run intruder lab --annotation weft.io/label.role=intruder) || die "RunPodSandbox intruder failed"
TMP_POD=$(pod_run temp lab) || die "RunPodSandbox temp failed"
for id in "$WEB" "$CLI" "$BAD" "$TMP_POD"; do
  check "$(pod_status "$id" | jq -r '.namespace + "/" + .name'): PodSandboxStatus IP == weft endpoint IP" ip_matches "$id"
done
check "endpoint labels from annotations (app=web)" has_label "$WEB" app web
check "namespace label from CNI_ARGS (shop)" has_label "$WEB" io.kubernetes.pod.namespace shop
check "ping client -> web" sb_ping "$CLI" "$WEB"
check "ping intruder (lab) -> client (shop)" sb_ping "$BAD" "$CLI"
check "tcp intruder -> web:80 before policy" sb_tcp "$WEB" "$BAD" 80

echo "== a policy selecting CRI pods by annotation labels"
cat >"$WEFT_TMP/policy.json" <<'EOF'
[{"labels":[{"key":"name","value":"cri-web"}],"endpointSelector":{"matchLabels":{"app":"web"}},
  "ingress":[{"fromEndpoints":[{"matchLabels":{"role":"client"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}]}]
EOF
weftctl policy import "$WEFT_TMP/policy.json" --wait >/dev/null || die "policy import failed"
# enforcing [--manager-down]: the policy's verdicts, from the datapath. The client reaching
# web:80 is the positive control (the same server); the intruder's connect must time out (a
# dropped SYN, not refused or unreachable) and the datapath's policy drop counters must grow.
# With the manager down the counters cannot be read (the API is gone): the caller compares
# them across the outage once it is back (they live in the pinned map).
enforcing() {
  local before='' out
  sb_tcp "$WEB" "$CLI" 80 >/dev/null 2>&1 || { echo "client -> web:80 dropped"; return 1; }
  if [ "${1:-}" != --manager-down ]; then
    before=$(total_policy_drops) || { echo "cannot read the drop counters"; return 1; }
  fi
  if out=$(sb_tcp "$WEB" "$BAD" 80 2>&1); then echo "intruder -> web:80 allowed"; return 1; fi
  grep -q 'timed out' <<<"$out" || { echo "intruder -> web:80 failed, but not as a dropped SYN does: $out"; return 1; }
  if [ -n "$before" ]; then
    [ "$(total_policy_drops)" -gt "$before" ] || { echo "intruder -> web:80 timed out without a policy drop counted"; return 1; }
  fi
  sb_ping "$BAD" "$CLI" || { echo "intruder -> client (no policy) dropped"; return 1; }
}
check "client -> web:80 allowed, intruder -> web:80 dropped, others open" enforcing

echo "== StopPodSandbox + RemovePodSandbox"
before=$(counts)
tmp_ip=$(pod_sip "$TMP_POD"); tmp_veth=$(ep_of "$TMP_POD" | jq -r .host_ifname)
check "stop + remove temp" pod_gone "$TMP_POD"
check "endpoint gone" test -z "$(ep_of "$TMP_POD")"
check "IP $tmp_ip free" bash -c "! $WEFT_BIN/weftctl --socket $WEFT_SOCK -o json ipam list | jq -e --arg a $tmp_ip 'any(.[]; .address == \$a)'"
# DEL answers before the kernel's veth teardown; the manager deletes the veth right after.
check "host veth $tmp_veth gone" eventually bash -c "! nsenter --net=/run/netns/$WEFT_NODE ip link show $tmp_veth"
check "sandbox gone from ListPodSandbox" bash -c "! $WEFT_BIN/weft-cri --socket $CTRD_SOCK list | jq -e --arg i $TMP_POD 'any(.[]; .id == \$i)'"

echo "== containerd restart"
cli_ns=$(pod_netns "$CLI"); web_ns=$(pod_netns "$WEB"); web_ip=$(pod_sip "$WEB")
ctrd_stop
# The policy admits only TCP 80 from role=client into web, so reachability is that port.
check "client -> web:80 while containerd is down" ns_tcp "$web_ns" "$web_ip" "$cli_ns" 80
ctrd_start
check "PodSandboxStatus IP unchanged after restart" ip_matches "$WEB"
check "policy still enforced after containerd restart" enforcing

echo "== kill -9 weft-manager"
drops_before_kill=$(total_policy_drops) || die "cannot read the drop counters"
weft_kill9_manager
check "pods reachable and enforcing while the manager is dead" enforcing --manager-down
weft_start_manager "${MGR_FLAGS[@]}"
check "  ... the intruder's SYNs then were policy drops (the pinned counters grew across the outage)" \
  test "$(total_policy_drops)" -gt "$drops_before_kill"
check "endpoints restored (IPs match CRI)" ip_matches "$CLI"
check "policy enforced after manager restart" enforcing

echo "== 20 pods created and removed, 4 at a time"
before=$(counts)
out=$(cri cycle --name churn --namespace lab --cgroup-parent "$CTRD_CGROUP" --count 20 --parallel 4)
rc=$?
jq -r '.laps[].id' <<<"$out" >>"$CTRD_IDS" 2>/dev/null
check "20 pods ran and were removed through CRI" test "$rc" = 0 -a "$(jq '.laps | length' <<<"$out")" = 20
check "20 distinct IPs" test "$(jq '[.laps[].ip] | unique | length' <<<"$out")" = 20
check "no leak: endpoints, IPs, veths, ipcache ($before)" eventually counts_are "$before"

echo "== chaining: hostPort through portmap"
HP=$(pod_run hp shop --port 192.0.2.1:8080:80) || die "RunPodSandbox hp failed"
hostport_ok() {
  local ns; ns=$(pod_netns "$HP")
  nsenter --net="$ns" timeout 5 nc -l 80 >/dev/null 2>&1 &
  local spid=$! i rc
  for i in $(seq 50); do listening 80 nsenter --net="$ns" && break; sleep 0.02; done
  ip netns exec "$CLIENT" nc -z -w 2 192.0.2.1 8080; rc=$?
  kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
  return $rc
}
check "client -> 192.0.2.1:8080 reaches the pod's :80" hostport_ok
hp_cache=/var/lib/cni/results/$CTRD_NET-$HP-eth0
check "libcni cached the chain's result (weft's IP)" jq -e --arg ip "$(pod_sip "$HP")" '.result.ips[0].address | startswith($ip)' "$hp_cache"
check "stop + remove hp (DEL through weft and portmap)" pod_gone "$HP"
check "portmap's DNAT rules gone" bash -c "! nsenter --net=/run/netns/$WEFT_NODE iptables-save -t nat | grep -q -- '--dport 8080'"
check "libcni cache entry gone" test ! -e "$hp_cache"

echo "== bandwidth: Weft shapes kubernetes.io/{ingress,egress}-bandwidth itself"
before=$(counts)
BW=$(pod_run bw shop --annotation kubernetes.io/ingress-bandwidth=10M \
  --annotation kubernetes.io/egress-bandwidth=10M) || die "RunPodSandbox bw failed"
bw_veth=$(ep_of "$BW" | jq -r .host_ifname)
check "ingress: tbf 10Mbit on the host veth, beside Weft's clsact" \
  bash -c "nsenter --net=/run/netns/$WEFT_NODE tc qdisc show dev $bw_veth | grep -q 'tbf.*rate 10Mbit' &&
    nsenter --net=/run/netns/$WEFT_NODE tc qdisc show dev $bw_veth | grep clsact >/dev/null"
check "egress: tbf 10Mbit on the pod's eth0" \
  bash -c "nsenter --net=$(pod_netns "$BW") tc qdisc show dev eth0 | grep -q 'tbf.*rate 10Mbit'"
# iperf3 SERVER_ID CLIENT_ID [-R] → Mbit/s received (client sends; -R: the server sends).
iperf() {
  local srv=$1 cli=$2 rev=${3:-} ns pid out
  ns=$(pod_netns "$srv")
  nsenter --net="$ns" iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 50); do listening 5201 nsenter --net="$ns" && break; sleep 0.02; done
  out=$(in_sandbox "$cli" iperf3 -c "$(pod_sip "$srv")" -p 5201 -t 3 $rev -J 2>/dev/null)
  wait "$pid" 2>/dev/null
  jq -r '.end.sum_received.bits_per_second / 1e6 | floor' <<<"$out"
}
# Limits are upper bounds: a busy machine may deliver less, never more. The anchor (two
# unlimited pods, same run) shows the limit is the shaper's, not the machine's.
free=$(iperf "$BAD" "$CLI")
egress=$(iperf "$CLI" "$BW")
ingress=$(iperf "$CLI" "$BW" -R)
echo "   iperf3 Mbit/s: unlimited $free | bw egress $egress (limit 10) | bw ingress $ingress (limit 10)"
check "anchor: unlimited pods exceed 50 Mbit/s" test "${free:-0}" -gt 50
check "egress-bandwidth 10M: the pod sends at most 11 Mbit/s (and some)" \
  test "${egress:-0}" -ge 1 -a "${egress:-99}" -le 11
check "ingress-bandwidth 10M: the pod receives at most 11 Mbit/s (and some)" \
  test "${ingress:-0}" -ge 1 -a "${ingress:-99}" -le 11
check "stop + remove bw" pod_gone "$BW"
out=$(cri run --name badbw --namespace shop --cgroup-parent "$CTRD_CGROUP" \
  --annotation kubernetes.io/egress-bandwidth=lots 2>&1); rc=$?
# containerd reads the annotations for the bandwidth capability first and refuses the pod itself
# (Weft's own check of the same annotations is unit-tested: annotations::bandwidth).
echo "   RunPodSandbox with egress-bandwidth=lots: $(tail -c 300 <<<"$out")"
check "an unreadable bandwidth annotation fails RunPodSandbox" test "$rc" != 0
check "no leak after the bandwidth pods ($before)" eventually counts_are "$before"

echo "== cniVersion 0.4.0"
ctrd_conflist 0.4.0 "$PORTMAP"
ctrd_stop; ctrd_start # containerd reads the conflist at start (its watcher would also pick it up)
V04=$(pod_run v04 lab) || die "RunPodSandbox v04 (0.4.0) failed"
check "0.4.0: PodSandboxStatus IP == weft endpoint IP" ip_matches "$V04"
check "0.4.0: ping v04 -> client" sb_ping "$V04" "$CLI"
check "0.4.0: libcni cached a 0.4.0 result" jq -e '.result.cniVersion == "0.4.0"' \
  "/var/lib/cni/results/$CTRD_NET-$V04-eth0"
check "0.4.0: stop + remove" pod_gone "$V04"
check "0.4.0: no leak ($before)" eventually counts_are "$before"

weft_summary
