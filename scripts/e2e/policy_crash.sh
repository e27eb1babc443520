#!/usr/bin/env bash
# Crash safety of policy writes (issue #10): weft-manager is killed -9 at random moments while
# it writes a large policy (hundreds of rules, endpoints sharing policy slots and some alone),
# then restarted; every map must then equal a from-scratch computation (`weftctl map verify`).
# Then the restart's trust: with nothing changed it reads no slot back; a slot whose kernel
# generation says "write under way" (0, with an entry missing) or disagrees with the persisted
# generation is read back and repaired.
# ROUNDS (default 6) kill -9 rounds, RULES (default 400) rules per policy.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../bench/common.sh"
ROUNDS=${ROUNDS:-6}
weft_plan $((11 + ROUNDS))
RULES=${RULES:-400}
START=(--pod-cidr 10.0.17.0/24)
command -v bpftool >/dev/null || die "bpftool is missing: run scripts/setup"

weft_make_node
weft_start_manager "${START[@]}"
# 4 deployments of 4 replicas (4 shared slots) and 4 pods alone in their identity.
labels() {
  local app=$1
  printf '[{"key":"app","value":"a%d"},{"key":"tier","value":"t%d"},{"key":"zone","value":"z%d"}]' \
    "$app" $((app % 3)) $((app % 2))
}
for i in $(seq 16); do weft_add_pod "p$i" "$(labels $((i % 4)))" >/dev/null || die "ADD p$i failed"; done
for i in $(seq 17 20); do weft_add_pod "p$i" "$(labels "$i")" >/dev/null || die "ADD p$i failed"; done

verify() { local out; out=$(weftctl map verify 2>&1) && grep -q consistent <<<"$out" && ! grep -q INCONSISTENT <<<"$out" || { echo "$out"; return 1; }; }
slots_line() { grep 'policy slots restored' "$WEFT_TMP/manager.log" | tail -1; }
field() { sed -n "s/.*$1=\([a-z0-9]*\).*/\1/p" <<<"$(slots_line)"; }

bench_gen_policy "$RULES" 0 >"$WEFT_TMP/p0.json"
ms=$(weftctl -o json policy import "$WEFT_TMP/p0.json" | jq -r '.elapsed_ms | floor')
echo "   first import of $RULES rules: ${ms} ms"
check "maps equal a fresh computation after the first import" verify
slots=$(weftctl -o json map verify | jq .slots)
check "20 endpoints share 8 policy slots" test "$slots" = 8
# A whole-policy change points each changed pair at the union of its old and new port lists,
# then at the new one; the lists nobody points at any more are kept for the next slot's write
# and deleted once the change is written (docs/DATAPATH.md).
orphans() {
  local pairs lists
  pairs=$(weftctl -o json map dump policy_pairs) && lists=$(weftctl -o json map dump policy_lists) || return 2
  [ "$(jq length <<<"$pairs")" -gt 0 ] && [ "$(jq length <<<"$lists")" -gt 0 ] || { echo "the maps are empty"; return 2; }
  jq -n --argjson p "$pairs" --argjson l "$lists" \
    '[$l[].list_id] - [$p[].list_id] | unique | length'
}
bench_gen_policy "$RULES" 99 >"$WEFT_TMP/p99.json"
weftctl policy import "$WEFT_TMP/p99.json" --wait >/dev/null || die "the re-import with other ports failed"
n=$(orphans) || die "cannot read the policy maps: $n"
check "after a change of every rule's ports no port list is left without a pair ($n)" test "$n" = 0
check "... and the maps equal a fresh computation" verify

echo "== kill -9 during policy writes x$ROUNDS"
span=$((ms * 2 + 20))
for r in $(seq "$ROUNDS"); do
  bench_gen_policy "$RULES" "$r" >"$WEFT_TMP/p.json"
  weftctl policy import "$WEFT_TMP/p.json" >/dev/null 2>&1 &
  imp=$!
  delay=$((15 + RANDOM % span))
  sleep "$(awk -v d="$delay" 'BEGIN {print d / 1000}')"
  weft_kill9_manager
  wait "$imp"
  weft_start_manager "${START[@]}"
  echo "   round $r: killed ${delay} ms into the import; restart: $(slots_line | grep -o 'trusted=.*inputs_unchanged=[a-z]*')"
  check "round $r: every map equals a fresh computation after the restart" verify
done

echo "== restart trust"
weft_kill9_manager
weft_start_manager "${START[@]}"
check "a restart with nothing changed reads no slot back" test "$(field read_back)" = 0
check "... and trusts every slot" test "$(field trusted)" = 8
check "... without recomputing" test "$(field inputs_unchanged)" = true

# A write cut short: generation 0 and one pair of the slot gone.
slot=$(weftctl -o json map dump policy_gen | jq -r '.[0].policy_id')
hex32() { printf '%02x %02x %02x %02x' $(($1 & 255)) $((($1 >> 8) & 255)) $((($1 >> 16) & 255)) $((($1 >> 24) & 255)); }
weft_kill9_manager
key=$(bpftool -j map dump pinned "$WEFT_BPFFS/policy_pairs" | jq -r '.[].key | join(" ")' \
  | while read -r k; do
      set -- $k # policy_id (little-endian), then identity and direction
      [ $(($1 | ($2 << 8) | ($3 << 16) | ($4 << 24))) = "$slot" ] && { echo "$k"; break; }
    done)
[ -n "$key" ] || die "no policy pair of slot $slot"
bpftool map delete pinned "$WEFT_BPFFS/policy_pairs" key $key || die "cannot delete a policy pair"
bpftool map update pinned "$WEFT_BPFFS/policy_gen" key hex $(hex32 "$slot") value hex 00 00 00 00 00 00 00 00 || die "cannot set a generation"
weft_start_manager "${START[@]}"
check "a slot left mid-write (generation 0) is read back" test "$(field read_back)" = 1
check "... and repaired" verify

# A generation that disagrees with the persisted one (as after a write whose record was lost).
weft_kill9_manager
bpftool map update pinned "$WEFT_BPFFS/policy_gen" key hex $(hex32 "$slot") value hex ff ff 00 00 00 00 00 00 || die "cannot set a generation"
weft_start_manager "${START[@]}"
check "a slot whose kernel generation disagrees with its record is read back" test "$(field read_back)" = 1
check "... and the maps are right" verify
weft_summary
