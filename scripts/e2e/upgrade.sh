#!/usr/bin/env bash
# Upgrades never trust stale policy slots (issue #27). A restart trusts a slot whose last
# complete write it recorded, without recomputing it when nothing it is computed from changed;
# the code that computes and encodes it is one of those things: each slot record says which
# policy compiler wrote it (docs/DATAPATH.md, "Restart that trusts what it wrote"). Here an
# older build is played by `dp_helper old-build` while the manager is stopped: it writes one
# slot as that build's computation would have (one more allow, in a complete write with a
# matching record) and stamps every record as written by that build. The new build must then
# rewrite the slot that differs, drop the flow only the older build allowed, and a ping and a
# TCP flow running throughout must lose nothing.
# Round 1: another policy computation, same encoding: every slot recomputed, only the differing
# one rewritten, none read back. Round 2: another encoding, round 3: a build from before records
# said which compiler wrote them (today's upgrade from an older Weft): nothing trusted, every
# slot read back.
# WEFT_BIN=DIR runs another build's manager, cni and weftctl (DP_HELPER: another dp_helper).
source "$(dirname "$0")/../lib.sh"
weft_plan 23
DP_HELPER=${DP_HELPER:-$WEFT_BIN/examples/dp_helper}
[ -x "$DP_HELPER" ] || die "$DP_HELPER is missing: cargo build --release -p weft-manager --example dp_helper"
START=(--pod-cidr 10.0.27.0/24)

ep_id() { weftctl -o json endpoint list | jq -r --arg c "$WEFT_P-$1" '.[] | select(.container_id == $c) | .id'; }
ident() { weftctl -o json endpoint list | jq -r --arg c "$WEFT_P-$1" '.[] | select(.container_id == $c) | .identity'; }
slot_of() { weftctl -o json map dump endpoints | jq -r --argjson id "$(ep_id "$1")" '.[] | select(.endpoint_id == $id) | .policy_id'; }
# "slot:generation ..." of every slot (the kernel's policy_gen map).
gens() { weftctl -o json map dump policy_gen | jq -r 'map("\(.policy_id):\(.generation)") | join(" ")'; }
gen_of() { tr ' ' '\n' <<<"$1" | awk -F: -v s="$2" '$1 == s {print $2}'; }
# The generation dp_helper old-build wrote a slot at ("slot S: ... generation G").
written_gen() { sed -n "s/^slot $2: .* generation \([0-9]*\)$/\1/p" <<<"$1"; }
verify() { local out; out=$(weftctl map verify 2>&1) && grep -q consistent <<<"$out" && ! grep -q INCONSISTENT <<<"$out" || { echo "$out"; return 1; }; }
# A field of the last restart's "policy slots restored" line, and the number of "written by
# another policy compiler" lines so far.
field() { grep 'policy slots restored' "$WEFT_TMP/manager.log" | tail -1 | sed -n "s/.* $1=\([a-z0-9]*\).*/\1/p"; }
other_lines() { grep -c 'written by another policy compiler' "$WEFT_TMP/manager.log"; }
last_other() { grep 'written by another policy compiler' "$WEFT_TMP/manager.log" | tail -1; }
# old_build EXTRA OLDER: plays the older build with the manager stopped; sets OLD_GEN.
old_build() {
  local out
  weft_stop_manager
  out=$(in_node "$DP_HELPER" --pin-dir "$WEFT_BPFFS" old-build --state-dir "$WEFT_STATE" \
    --extra "$1" --older "$2" 2>&1) || die "dp_helper old-build failed: $out"
  grep -E '^(slot |[0-9]+ slot records)' <<<"$out" | sed 's/^/   old build: /'
  OLD_GEN=$(written_gen "$out" "${1%%:*}")
  [ -n "$OLD_GEN" ] || die "dp_helper old-build did not say which generation it wrote: $out"
}

weft_make_node
weft_start_manager "${START[@]}"
for app in app1 app2 app3; do
  weft_add_pod "$app" '[{"key":"id","value":"'$app'"}]' >/dev/null || die "ADD $app failed"
done
# Every pod admits app2 only: three slots (one per identity), each enforcing ingress.
cat >"$WEFT_TMP/policy.json" <<'P'
[{"labels":[{"key":"name","value":"from-app2"}],"endpointSelector":{},
  "ingress":[{"fromEndpoints":[{"matchLabels":{"id":"app2"}}]}]}]
P
weftctl policy import "$WEFT_TMP/policy.json" --wait >/dev/null || die "policy import failed"

APP1=$(pod_ip app1) APP2=$(pod_ip app2) APP3=$(pod_ip app3)
S1=$(slot_of app1) S2=$(slot_of app2) S3=$(slot_of app3)
ID1=$(ident app1) ID3=$(ident app3)
[ -n "$S1" ] && [ -n "$S2" ] && [ -n "$S3" ] && [ "$S1" != "$S2" ] && [ "$S1" != "$S3" ] && [ "$S2" != "$S3" ] ||
  die "expected three slots, got '$S1' '$S2' '$S3'"
check "map verify before the upgrades" verify
check_dropped "app3 -> app1:9999 dropped before the upgrades" app1 app3 "$APP1" 9999

echo "== traffic throughout: ping and TCP connects app2 -> app1"
# `ip netns exec` execs its command: $! is the listener's timeout and ping themselves (a
# backgrounded function would be a subshell that ignores SIGINT and outlives its kill).
ip netns exec "$WEFT_P-app1" timeout 300 nc -lk 80 >/dev/null 2>&1 &
LISTENER=$!
ip netns exec "$WEFT_P-app2" ping -i 0.02 -q "$APP1" >"$WEFT_TMP/ping.out" 2>&1 &
PING=$!
# The prober stops (its last connect done) before the listener goes: a connect racing the
# listener's kill would be refused by the test, not by the datapath.
stop_traffic() {
  rm -f "$WEFT_TMP/probing"
  [ -n "${PROBES:-}" ] && wait "$PROBES" 2>/dev/null
  kill -INT "$PING" 2>/dev/null; kill "$LISTENER" 2>/dev/null
}
trap 'rc=$?; stop_traffic; (exit $rc); weft_cleanup' EXIT
probe_log=$WEFT_TMP/probes
touch "$WEFT_TMP/probing"
# Each line: the time and "ok", or "failed" with nc's reason (a timeout is a lost SYN; a
# refusal means the listener was gone).
( while [ -e "$WEFT_TMP/probing" ]; do
    t=$(date +%T.%N)
    if e=$(in_pod app2 nc -v -z -w 1 "$APP1" 80 2>&1); then echo "$t ok"; else echo "$t failed: $e"; fi >>"$probe_log"
    sleep 0.1
  done ) &
PROBES=$!
sleep 0.5

echo "== round 1: another policy computation wrote app1's slot $S1 with one more allow (app3 tcp/9999)"
before=$(gens)
old_build "$S1:$ID3:9999" policy
check "the older build's entry lets app3 -> app1:9999 through while the manager is down" tcp_ok app1 app3 "$APP1" 9999
weft_start_manager "${START[@]}"
after=$(gens)
echo "   policy_gen before: $before (then slot $S1 at $OLD_GEN by the older build); after: $after"
echo "   $(last_other | sed 's/.*INFO //')"
# This build's versions, from its own log line: the older build is one version behind in what it
# plays (dp_helper old-build: version - 1).
read -r POLICY_V ENCODING_V < <(sed -nE 's/.*this_build="?policy v([0-9]+) encoding v([0-9]+).*/\1 \2/p' <<<"$(last_other)")
check "the restart says 3 slots were written by another policy compiler (policy v$((POLICY_V - 1)), encoding v$ENCODING_V)" \
  matches -E "slots=3 written_by=\"?policy v$((POLICY_V - 1)) encoding v$ENCODING_V\"? " <<<"$(last_other)"
check "same encoding: no slot read back" test "$(field read_back)" = 0
check "app1's slot (the one that differs) was rewritten" test "$(gen_of "$after" "$S1")" -gt "$OLD_GEN"
check "app2's and app3's slots (computed the same) were not" \
  test "$(gen_of "$after" "$S2") $(gen_of "$after" "$S3")" = "$(gen_of "$before" "$S2") $(gen_of "$before" "$S3")"
check "map verify: every slot is this build's computation" verify
check_dropped "app3 -> app1:9999 (allowed only by the older build) dropped" app1 app3 "$APP1" 9999
# Port 80 is the prober's (its listener runs throughout): the check's own server takes another
# port the policy allows (every port from app2).
check "app2 -> app1:8080 still allowed" tcp_ok app1 app2 "$APP1" 8080
n=$(other_lines)
weft_stop_manager
weft_start_manager "${START[@]}"
check "the next restart finds every record this build's (compared or rewritten) and trusts all 3" \
  test "$(other_lines) $(field trusted) $(field inputs_unchanged)" = "$n 3 true"

# untrusted_round OLDER SLOT:IDENTITY:PORT SERVER CLIENT SERVER_IP WHO WRITTEN_ERE WHAT: another
# build (`dp_helper old-build --older OLDER`, "the WHO" in the checks) wrote SERVER's slot with one
# more allow from CLIENT on PORT; the restart's log must match WRITTEN_ERE (WHAT), and nothing that
# build wrote may be trusted: every slot read back, the extra allow gone.
untrusted_round() {
  local older=$1 extra=$2 srv=$3 cli=$4 ip=$5 who=$6 written=$7 what=$8 port=${2##*:}
  old_build "$extra" "$older"
  check "the $who's entry lets $cli -> $srv:$port through while the manager is down" tcp_ok "$srv" "$cli" "$ip" "$port"
  weft_start_manager "${START[@]}"
  echo "   $(last_other | sed 's/.*INFO //')"
  check "the restart says 3 slots were written $what" matches -E "$written" <<<"$(last_other)"
  check "nothing the $who wrote is trusted: all 3 slots read back" test "$(field read_back)" = 3
  check "map verify: every slot is this build's computation" verify
  check_dropped "$cli -> $srv:$port (allowed only by the older build) dropped" "$srv" "$cli" "$ip" "$port"
}

echo "== round 2: another encoding wrote app3's slot $S3 with one more allow (app1 tcp/9998)"
untrusted_round encoding "$S3:$ID1:9998" app3 app1 "$APP3" "older build" \
  "slots=3 written_by=\"?policy v$POLICY_V encoding v$((ENCODING_V - 1))\"? .*read_back=3" "with another encoding (v$((ENCODING_V - 1))), all read back"

echo "== round 3: a build from before the compiler stamp wrote app2's slot $S2 with one more allow (app1 tcp/9997)"
untrusted_round unversioned "$S2:$ID1:9997" app2 app1 "$APP2" "unversioned build" \
  'slots=3 written_by="?an unversioned build"? ' "by an unversioned build"

sleep 0.5
stop_traffic; wait "$PING" "$LISTENER" 2>/dev/null
sent=$(grep -o '[0-9]* packets transmitted' "$WEFT_TMP/ping.out" | awk '{print $1}')
got=$(grep -o '[0-9]* received' "$WEFT_TMP/ping.out" | awk '{print $1}')
probes=$(wc -l <"$probe_log")
echo "   ping app2 -> app1 every 20 ms: $sent sent, $got received; $probes TCP connects app2 -> app1:80"
check "0 lost pings across the three upgrades" test "${sent:-0}" -gt 100 -a "$sent" = "$got"
every_connect_ok() { test "$probes" -gt 20 -a "$(grep -c failed "$probe_log")" = 0 || { grep failed "$probe_log"; return 1; }; }
check "every TCP connect app2 -> app1:80 succeeded" every_connect_ok
weft_summary
