#!/usr/bin/env bash
# DEL semantics: idempotent, works without a netns, never frees another container's IP, answers
# before the veth teardown with no route left to the freed IP.
source "$(dirname "$0")/../lib.sh"
weft_plan 14

del_empty_netns() { weft_netconf | weft_cni DEL "$1" "" eth0; }
y_holds() { weftctl -o json ipam list | jq -e --arg c "$WEFT_P-y" --arg ip "$1" '.[0].container_id == $c and .[0].address == $ip'; }

weft_make_node
# A /30 pool has one pod address: whoever ADDs next gets exactly the address just freed.
weft_start_manager --pod-cidr 10.0.8.0/30
weft_add_pod x >/dev/null || die "ADD x failed"
x_ip=$(pod_ip x)
x_veth=$(weftctl -o json endpoint list | jq -r '.[0].host_ifname')
no_route() { ! in_node ip route show | matches "^$1 "; }
no_link() { ! in_node ip link show "$1" >/dev/null 2>&1; }
check "DEL x" weft_del_pod x
# DEL answers before the kernel's veth teardown; nothing may point at the freed IP by then.
check "no route to x's IP once DEL has returned" no_route "$x_ip"
check "x's host veth is deleted after DEL" eventually no_link "$x_veth"
weft_add_pod_again() { weft_netconf | weft_cni ADD "$WEFT_P-x" "/run/netns/${WEFT_P}-x" eth0 >/dev/null; }
weft_del_pod x >/dev/null
check "ADD of x right after its DEL (same host veth name) waits for the old veth and works" weft_add_pod_again
check "x reachable after the re-ADD" ping_ok in_node "$x_ip"
check "DEL x" weft_del_pod x
check "second DEL x succeeds" weft_del_pod x
check "DEL x with empty CNI_NETNS succeeds" del_empty_netns "$WEFT_P-x"
check "DEL of an unknown container succeeds" del_empty_netns never-existed

# A manager killed before its background deletion ran leaves a host veth no endpoint owns; the
# next start deletes it (and only such links).
ORPHAN=weftdeadbeef123
in_node ip link add "$ORPHAN" type veth peer name "${WEFT_P}op" || die "cannot create the orphan veth"
weft_kill9_manager
weft_start_manager --pod-cidr 10.0.8.0/30
check "a host veth without an endpoint is deleted at start" eventually no_link "$ORPHAN"
check "weft_host is kept" in_node ip link show weft_host

weft_add_pod y >/dev/null || die "ADD y failed"
y_ip=$(pod_ip y)
check "y got x's old address (pool of one)" test "$y_ip" = "$x_ip"
weft_del_pod x >/dev/null 2>&1
del_empty_netns "$WEFT_P-x" >/dev/null 2>&1
check "stale DELs for x left y's allocation alone" y_holds "$y_ip"
check "y still reachable after the stale DELs" ping_ok in_node "$y_ip"
weft_summary
