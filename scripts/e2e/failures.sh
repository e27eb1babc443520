#!/usr/bin/env bash
# Bad inputs: each gives the right CNI code and message, and leaves the node unchanged.
source "$(dirname "$0")/../lib.sh"
weft_plan 21

weft_make_node
weft_start_manager --pod-cidr 10.0.9.0/30
ip netns add "${WEFT_P}-pod"
NS=/run/netns/${WEFT_P}-pod
GOOD=$(weft_netconf)

# expect CODE MSG_REGEX DESCRIPTION -- ENV... [< stdin via $IN]
expect() {
  local code=$1 re=$2 desc=$3; shift 4
  local before after out rc
  before=$(node_snapshot)
  out=$(printf '%s' "$IN" | env -i PATH="$PATH" "$@" nsenter --net="/run/netns/$WEFT_NODE" "$WEFT_BIN/weft-cni" 2>/dev/null)
  rc=$?
  after=$(node_snapshot)
  local got_code got_msg
  got_code=$(jq -r '.code // empty' <<<"$out" 2>/dev/null)
  got_msg=$(jq -r '.msg + " " + (.details // "")' <<<"$out" 2>/dev/null)
  if [ "$rc" != 0 ] && [ "$got_code" = "$code" ] && [[ $got_msg =~ $re ]] && [ "$before" = "$after" ]; then
    WEFT_PASSED=$((WEFT_PASSED + 1)); echo "  ok   $desc -> code $code: $got_msg"
  else
    WEFT_FAILED=$((WEFT_FAILED + 1))
    echo "  FAIL $desc: exit $rc, code '$got_code' (want $code), msg '$got_msg' (want /$re/)"
    [ "$before" = "$after" ] || diff <(echo "$before") <(echo "$after") | sed 's/^/       /'
  fi
}

E=(CNI_COMMAND=ADD CNI_CONTAINERID=c1 CNI_NETNS=$NS CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni)
without() { local k=$1; shift; for kv in "$@"; do [[ $kv == "$k="* ]] || echo "$kv"; done; }
mapfile -t NO_CMD < <(without CNI_COMMAND "${E[@]}")
mapfile -t NO_CID < <(without CNI_CONTAINERID "${E[@]}")
mapfile -t NO_NS < <(without CNI_NETNS "${E[@]}")
mapfile -t NO_IF < <(without CNI_IFNAME "${E[@]}")

IN=$GOOD
expect 4 "CNI_COMMAND" "missing CNI_COMMAND" -- "${NO_CMD[@]}"
expect 4 "FROB" "unknown CNI_COMMAND" -- "${NO_CMD[@]}" CNI_COMMAND=FROB
expect 4 "CNI_CONTAINERID" "missing CNI_CONTAINERID" -- "${NO_CID[@]}"
expect 4 "CNI_CONTAINERID" "invalid CNI_CONTAINERID" -- "${NO_CID[@]}" "CNI_CONTAINERID=bad/id"
expect 4 "CNI_NETNS" "missing CNI_NETNS" -- "${NO_NS[@]}"
expect 4 "CNI_NETNS|netns" "netns path does not exist" -- "${NO_NS[@]}" CNI_NETNS=/run/netns/does-not-exist
expect 4 "CNI_IFNAME" "missing CNI_IFNAME" -- "${NO_IF[@]}"
expect 4 "CNI_IFNAME|15" "ifname longer than 15 bytes" -- "${NO_IF[@]}" CNI_IFNAME=abcdefghijklmnop
expect 4 "CNI_ARGS|BOGUS" "unknown CNI_ARGS key without IgnoreUnknown" -- "${E[@]}" "CNI_ARGS=BOGUS=1"
IN=$(cat "$WEFT_ROOT/testdata/netconf/bad-json.json")
expect 6 "." "malformed netconf JSON" -- "${E[@]}"
IN=$(cat "$WEFT_ROOT/testdata/netconf/bad-type.json")
expect 7 "type" "wrong plugin type" -- "${E[@]}"
IN=$(cat "$WEFT_ROOT/testdata/netconf/bad-version.json")
expect 1 "9.9.9" "unsupported cniVersion" -- "${E[@]}"
IN=$(cat "$WEFT_ROOT/testdata/netconf/bad-mtu.json")
expect 7 "mtu" "mtu is not a number" -- "${E[@]}"
IN=$(cat "$WEFT_ROOT/testdata/netconf/bad-labels.json")
expect 7 "labels" "labels not a list" -- "${E[@]}"
IN=$(weft_netconf | jq -c --arg s "$WEFT_TMP/nope.sock" '.socket = $s')
expect 11 "nope.sock" "manager socket missing" -- "${E[@]}"

# The /30 pool has one address: fill it, then the next ADD must fail naming the pool.
IN=$GOOD
weft_add_pod full >/dev/null || die "ADD full failed"
ip netns add "${WEFT_P}-pod2"
expect 100 "10\.0\.9\.0/30" "pool exhausted" -- "${E[@]/CNI_NETNS=$NS/CNI_NETNS=/run/netns/${WEFT_P}-pod2}" CNI_CONTAINERID=c2
weft_del_pod full >/dev/null

# A failure after allocation: CNI_IFNAME already exists in the pod netns.
in_pod pod ip link add eth0 type veth peer name eth0peer
before=$(node_snapshot)
out=$(weft_netconf | weft_cni ADD c3 "$NS" eth0 2>/dev/null); rc=$?
after=$(node_snapshot)
iface_error() { [ "$rc" != 0 ] && jq -e '.code >= 100 and (.msg + (.details // "") | test("eth0"))' <<<"$out"; }
check "ifname exists -> CNI error" iface_error
check "ifname exists -> IP released, no veth, node unchanged" test "$before" = "$after"
check "ifname exists -> the pod's own eth0 untouched" in_pod pod ip link show eth0peer

# Manager start-up with no usable CIDR names all four sources.
out=$(in_node "$WEFT_BIN/weft-manager" --state-dir "$WEFT_TMP/s2" --socket "$WEFT_TMP/s2.sock" --bpffs "$WEFT_BPFFS-2" \
  --node-manifest "$WEFT_ROOT/testdata/nodes/no-cidr.json" 2>&1); rc=$?
check "manager refuses a node with no CIDR" test "$rc" != 0
names_sources() { grep -q spec.podCIDRs <<<"$out" && grep -q 'spec.podCIDR ' <<<"$out" && grep -q annotation <<<"$out" && grep -q -- --pod-cidr <<<"$out"; }
check "and names spec.podCIDRs, spec.podCIDR, annotation, --pod-cidr" names_sources
weft_summary
