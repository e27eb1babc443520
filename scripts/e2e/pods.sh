#!/usr/bin/env bash
# Three pods from a Node with spec.podCIDR 10.0.1.0/24 and an annotation 10.99.0.0/24: distinct
# IPs from the podCIDR, full ping matrix, TCP pod<->pod and host<->pod; then the same over IPv6
# with a dual-stack spec.podCIDRs Node.
source "$(dirname "$0")/../lib.sh"
weft_plan 42

run_matrix() { # family flag ("" or -6)
  local fam=$1 a b
  for a in p1 p2 p3; do
    for b in p1 p2 p3; do
      [ "$a" = "$b" ] && continue
      check "ping$fam $a -> $b" ping_ok in_pod "$a" "$(pod_ip $fam "$b")"
    done
    check "ping$fam node -> $a" ping_ok in_node "$(pod_ip $fam "$a")"
  done
  check "tcp$fam p1 -> p2:8080" tcp_ok p2 p1 "$(pod_ip $fam p2)" 8080
  check "tcp$fam p3 -> p1:9090" tcp_ok p1 p3 "$(pod_ip $fam p1)" 9090
  check "tcp$fam node -> p2:8081" tcp_ok p2 node "$(pod_ip $fam p2)" 8081
}

echo "== IPv4, spec.podCIDR beats the annotation"
weft_make_node
weft_start_manager --node-manifest "$WEFT_ROOT/testdata/nodes/podcidr-and-annotation.json"
for p in p1 p2 p3; do weft_add_pod "$p" '[{"key":"app","value":"'$p'"}]' >/dev/null || die "ADD $p failed"; done
ips=$(for p in p1 p2 p3; do pod_ip "$p"; done | sort -u)
check "three distinct IPs" test "$(echo "$ips" | wc -l)" = 3
check "all in 10.0.1.0/24" test -z "$(grep -v '^10\.0\.1\.' <<<"$ips")"
status_is() { weftctl -o json status | jq -e "$1"; }
check "status says spec.podCIDR won" status_is '.pools[0].source == "spec.podCIDR" and .pools[0].cidr == "10.0.1.0/24"'
run_matrix ""
node_pid_tcp() { tcp_ok node p1 "$(weftctl -o json status | jq -r '.pools[0].router_ip')" 7070; }
check "tcp p1 -> node (router IP):7070" node_pid_tcp
for p in p1 p2 p3; do weft_del_pod "$p" >/dev/null; ip netns del "${WEFT_P}-$p"; done
weft_stop_manager; ip netns del "$WEFT_NODE"; rm -rf "$WEFT_STATE"

echo "== dual stack from spec.podCIDRs"
weft_make_node
weft_start_manager --node-manifest "$WEFT_ROOT/testdata/nodes/podcidrs-dual-stack.json"
for p in p1 p2 p3; do weft_add_pod "$p" >/dev/null || die "ADD $p failed"; done
check "status: both pools from spec.podCIDRs" status_is '[.pools[].source] == ["spec.podCIDRs","spec.podCIDRs"]'
v6_in_pool() { local p; for p in p1 p2 p3; do [[ $(pod_ip -6 $p) == fd00:10:2::* ]] || return 1; done; }
check "IPv6 addresses in fd00:10:2::/64" v6_in_pool
run_matrix ""
run_matrix -6
weft_summary
