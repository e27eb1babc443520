#!/usr/bin/env bash
# DEL semantics: idempotent, works without a netns, never frees another container's IP.
source "$(dirname "$0")/../lib.sh"

del_empty_netns() { weft_netconf | weft_cni DEL "$1" "" eth0; }
y_holds() { weftctl -o json ipam list | jq -e --arg c "$WEFT_P-y" --arg ip "$1" '.[0].container_id == $c and .[0].address == $ip'; }

weft_make_node
# A /30 pool has one pod address: whoever ADDs next gets exactly the address just freed.
weft_start_manager --pod-cidr 10.0.8.0/30
weft_add_pod x >/dev/null || die "ADD x failed"
x_ip=$(pod_ip x)
check "DEL x" weft_del_pod x
check "second DEL x succeeds" weft_del_pod x
check "DEL x with empty CNI_NETNS succeeds" del_empty_netns "$WEFT_P-x"
check "DEL of an unknown container succeeds" del_empty_netns never-existed

weft_add_pod y >/dev/null || die "ADD y failed"
y_ip=$(pod_ip y)
check "y got x's old address (pool of one)" test "$y_ip" = "$x_ip"
weft_del_pod x >/dev/null 2>&1
del_empty_netns "$WEFT_P-x" >/dev/null 2>&1
check "stale DELs for x left y's allocation alone" y_holds "$y_ip"
check "y still reachable after the stale DELs" ping_ok in_node "$y_ip"
weft_summary
