#!/usr/bin/env bash
# Node CIDR priority end to end: each testdata manifest gives the documented pools, and a CIDR
# change under live endpoints refuses start with a message saying what to do.
source "$(dirname "$0")/../lib.sh"
weft_plan 12

weft_make_node
pools_are() { # manifest expected-json
  rm -rf "$WEFT_STATE"
  weft_start_manager --node-manifest "$WEFT_ROOT/testdata/nodes/$1" || return 1
  local got; got=$(weftctl -o json status | jq -c '[.pools[] | [.cidr, .source, .source_detail]]')
  weft_stop_manager
  [ "$got" = "$2" ] || { echo "got $got, want $2"; return 1; }
}
check "podCIDRs dual-stack" pools_are podcidrs-dual-stack.json '[["10.0.2.0/24","spec.podCIDRs","spec.podCIDRs"],["fd00:10:2::/64","spec.podCIDRs","spec.podCIDRs"]]'
check "podCIDR only" pools_are podcidr-only.yaml '[["10.0.3.0/24","spec.podCIDR","spec.podCIDR"]]'
check "annotation only" pools_are annotation-only.json '[["10.0.4.0/24","annotation","network.weft.io/ipv4-pod-cidr"],["fd00:10:4::/64","annotation","network.cilium.io/ipv6-pod-cidr"]]'
check "podCIDR beats annotation" pools_are podcidr-and-annotation.json '[["10.0.1.0/24","spec.podCIDR","spec.podCIDR"]]'
check "invalid podCIDR, valid annotation" pools_are invalid-podcidr-valid-annotation.yaml '[["10.0.5.0/24","annotation","io.cilium.network.ipv4-pod-cidr"]]'
refuses_no_cidr() {
  local out rc
  out=$(in_node "$WEFT_BIN/weft-manager" --state-dir "$WEFT_STATE" --socket "$WEFT_SOCK" --bpffs "$WEFT_BPFFS" \
    --node-manifest "$WEFT_ROOT/testdata/nodes/no-cidr.json" 2>&1); rc=$?
  [ "$rc" != 0 ] && grep -q 'no usable pod CIDR' <<<"$out"
}
check "no CIDR anywhere -> start-up error" refuses_no_cidr

# CIDR change with a live endpoint.
rm -rf "$WEFT_STATE"
weft_start_manager --pod-cidr 10.0.12.0/24
weft_add_pod a >/dev/null || die "ADD a failed"
weft_stop_manager
out=$(in_node timeout 10 "$WEFT_BIN/weft-manager" --state-dir "$WEFT_STATE" --socket "$WEFT_SOCK" --bpffs "$WEFT_BPFFS" --pod-cidr 10.0.13.0/24 2>&1); rc=$?
check "changed CIDR with live endpoints refuses start" test "$rc" != 0
says_what_to_do() { grep -q '10.0.12.0/24' <<<"$out" && grep -q '10.0.13.0/24' <<<"$out" && grep -q 'delete those pods' <<<"$out"; }
check "and says what to do" says_what_to_do
weft_start_manager --pod-cidr 10.0.12.0/24
check "the old CIDR starts again with the endpoint intact" ping_ok in_node "$(pod_ip a)"

# The node got another CIDR while it was away and the kubelet deleted its pods meanwhile (their
# DELs wait in the queue, no manager ran): the start takes the new CIDR and completes the DELs.
weft_stop_manager
weft_del_pod a >/dev/null 2>&1
queued() { [ -n "$(ls -A "$(dirname "$WEFT_SOCK")/delete-queue" 2>/dev/null | grep -v '^\.lock$')" ]; }
check "with the manager down, a's DEL is queued" queued
weft_start_manager --pod-cidr 10.0.13.0/24
gone() { [ "$(weftctl -o json endpoint list | jq length)" = 0 ] && ! queued; }
check "changed CIDR, the only endpoint's DEL queued: starts, the DEL completed" gone
in_new() { local out; out=$(weft_add_pod b) || return 1; [[ "$(pod_ip b)" == 10.0.13.* ]]; }
check "a new pod gets an address of the new CIDR" in_new
weft_summary
