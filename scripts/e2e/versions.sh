#!/usr/bin/env bash
# CNI spec conformance: ADD results per version, CHECK, VERSION, STATUS and GC.
source "$(dirname "$0")/../lib.sh"
weft_plan 13

# Shape checks from the CNI spec's result schema for each version.
SCHEMA_COMMON='
  (.cniVersion == $v) and
  (.interfaces | length == 2) and
  (.interfaces[0] | has("name") and has("mac") and (has("sandbox") | not)) and
  (.interfaces[1] | .name == "eth0" and has("mac") and (.sandbox | length > 0)) and
  (.ips | length == 2) and
  all(.ips[]; (.address | test("/(32|128)$")) and has("gateway") and .interface == 1) and
  ([.routes[].dst] | index("0.0.0.0/0") != null and index("::/0") != null) and
  all(.routes[]; has("gw"))'
SCHEMA_040="$SCHEMA_COMMON and all(.ips[]; .version == \"4\" or .version == \"6\")"
SCHEMA_1XX="$SCHEMA_COMMON and all(.ips[]; has(\"version\") | not)"

weft_make_node
weft_start_manager --pod-cidr 10.0.11.0/24 --pod-cidr fd00:10:11::/64
for v in 0.4.0 1.0.0 1.1.0; do
  pod=v${v//./}
  out=$(weft_add_pod "$pod" '[]' "$v")
  echo "$out" >"$WEFT_TMP/$pod.json"
  schema=$SCHEMA_1XX; [ "$v" = 0.4.0 ] && schema=$SCHEMA_040
  check "ADD result for $v matches the spec's shape" jq -e --arg v "$v" "$schema" "$WEFT_TMP/$pod.json"
  check_prev() { jq -c --argjson r "$(cat "$WEFT_TMP/$pod.json")" '.prevResult = $r' <<<"$(weft_netconf "$v")" | weft_cni CHECK "$WEFT_P-$pod" "/run/netns/${WEFT_P}-$pod" eth0; }
  check "CHECK $v passes on a healthy pod" check_prev
done
in_pod v110 ip route del default
check_v110() { jq -c --argjson r "$(cat "$WEFT_TMP/v110.json")" '.prevResult = $r' <<<"$(weft_netconf 1.1.0)" | weft_cni CHECK "$WEFT_P-v110" "/run/netns/${WEFT_P}-v110" eth0; }
check_fails "CHECK fails once the pod's default route is gone, naming it" "no default route via" check_v110

version_ok() { weft_netconf 1.1.0 | weft_cni VERSION x "" eth0 | jq -e '.supportedVersions | index("0.4.0") != null and index("1.0.0") != null and index("1.1.0") != null'; }
check "VERSION lists 0.4.0, 1.0.0, 1.1.0" version_ok
# STATUS: exit 0 when ready; otherwise a non-zero exit and the CNI error code in the JSON.
status_result() {
  local out rc
  out=$(weft_netconf 1.1.0 | weft_cni STATUS "" "" "" 2>/dev/null); rc=$?
  if [ "$rc" = 0 ]; then echo ok; else jq -r '.code' <<<"$out"; fi
}
check "STATUS exits 0 with the manager ready" test "$(status_result)" = ok

# GC: only v040 is still valid; v100 and v110 are released, with their host veths.
gc_conf=$(weft_netconf 1.1.0 | jq -c --arg c "$WEFT_P-v040" '.["cni.dev/valid-attachments"] = [{"containerID": $c, "ifname": "eth0"}]')
gc() { weft_cni GC "" "" "" <<<"$gc_conf"; }
check "GC succeeds" gc
gc_left() { weftctl -o json endpoint list | jq -e --arg c "$WEFT_P-v040" 'length == 1 and .[0].container_id == $c'; }
check "GC released every endpoint but the valid one" gc_left
veths() { in_node ip -o link show | grep -c ' weft[0-9a-f]\{11\}@'; }
check "GC removed the released pods' host veths" test "$(veths)" = 1

weft_stop_manager
check "STATUS fails with code 50 without the manager" test "$(status_result)" = 50
weft_summary
