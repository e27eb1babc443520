#!/usr/bin/env bash
# Hostile local users and unlucky operators against the real binaries (issue #14). Every attack
# a local user would make runs as uid 65534 (setpriv, no groups); each check asserts the refusal
# AND that nothing changed (endpoints, IPAM, links, routes, maps, files). Operator mistakes
# (bad flags) run as root. WEFT_BIN=DIR runs it against other binaries: that is how
# docs/SECURITY.md shows each check failing on the binaries from before the fixes.
source "$(dirname "$0")/../lib.sh"
weft_plan 46
command -v setpriv >/dev/null || die "setpriv is missing (util-linux): run scripts/setup"
command -v curl >/dev/null || die "curl is missing: run scripts/setup"
NOBODY=65534
as_nobody() { setpriv --reuid=$NOBODY --regid=$NOBODY --clear-groups "$@"; }
# The attacker may traverse (not list or write) the run dir, as with /run.
chmod 711 "$WEFT_TMP"
CIDR=10.0.41.0/24
UPLINK=${WEFT_P}up

# host_ifname CONTAINER IFNAME: weft_api::naming::host_ifname (FNV-1a of the pair).
host_ifname() {
  python3 -c '
import sys
h = 0xcbf29ce484222325
for i, p in enumerate(sys.argv[1:]):
    if i:
        h = ((h ^ 0xff) * 0x100000001b3) & (2**64 - 1)
    for b in p.encode():
        h = ((h ^ b) * 0x100000001b3) & (2**64 - 1)
print("weft%011x" % (h & 0x0fffffffffff))' "$1" "$2"
}

# jq_one FILTER [FILE]: the input is exactly one JSON value and FILTER holds for it (jq 1.6's -e
# alone passes on empty input).
jq_one() { jq -es "length == 1 and (.[0] | $1)" "${@:2}" >/dev/null; }

# Everything an attack must leave as it was: links, routes, IPAM, endpoints (with labels), maps.
world() {
  node_snapshot
  weftctl -o json endpoint list | jq -c '[.[] | {id, labels, ips}] | sort_by(.id)'
  weftctl -o json map dump endpoints | jq -c 'sort_by(.endpoint_id)'
  weftctl -o json map dump ipcache | jq -c 'sort_by(.prefix)'
}

# start_other LOG SOCKET FLAGS...: another manager process in the node netns (--socket SOCKET
# is passed); sets OTHER_PID. Returns once it answers on SOCKET or has exited (20 s at most).
start_other() {
  local log=$1 sock=$2; shift 2
  nsenter --net="/run/netns/$WEFT_NODE" "$WEFT_BIN/weft-manager" --socket "$sock" "$@" >"$log" 2>&1 &
  OTHER_PID=$!
  local i
  for i in $(seq 200); do
    kill -0 "$OTHER_PID" 2>/dev/null || return 0
    "$WEFT_BIN/weftctl" --socket "$sock" status >/dev/null 2>&1 && return 0
    sleep 0.1
  done
}
# restart FLAGS...: the main manager again; unlike weft_start_manager it does not abort the run
# when the manager does not come up (the binaries under test may be the broken ones).
restart() {
  nsenter --net="/run/netns/$WEFT_NODE" "$WEFT_BIN/weft-manager" --state-dir "$WEFT_STATE" --socket "$WEFT_SOCK" \
    --bpffs "$WEFT_BPFFS" --node-name "$WEFT_P" "$@" >>"$WEFT_TMP/manager.log" 2>&1 &
  WEFT_MANAGER_PID=$!
  weftctl status --wait 20 >/dev/null 2>&1 || echo "   (weft-manager did not come up: see its log)"
}
stop_other() {
  [ -n "${OTHER_PID:-}" ] || return 0
  kill "$OTHER_PID" 2>/dev/null; wait "$OTHER_PID" 2>/dev/null; OTHER_PID=
}
OTHER_PID= FLOOD=
trap 'rc=$?; stop_other; [ -n "$FLOOD" ] && kill "$FLOOD" 2>/dev/null; (exit $rc); weft_cleanup' EXIT
exited() { ! kill -0 "$OTHER_PID" 2>/dev/null; }
# reap_other: when the other manager has exited, its exit status into OTHER_RC (a check runs in
# a subshell, which cannot wait for it: call this before the check).
OTHER_RC=
reap_other() {
  OTHER_RC=
  if [ -n "${OTHER_PID:-}" ] && exited; then wait "$OTHER_PID"; OTHER_RC=$?; fi
}
# refused_naming WORD LOG: the other manager refused to run: it exited on its own with weft-manager's
# error status 1 (not killed by a signal, not a crash or panic, not still running), and its last
# words name WORD (the cause, not any error).
refused_naming() {
  [ -n "$OTHER_RC" ] || { echo "the other manager did not exit (still running)"; return 1; }
  [ "$OTHER_RC" = 1 ] || { echo "it exited $OTHER_RC, not 1 (an error it reported): $(tail -3 "$2")"; return 1; }
  tail -3 "$2" | matches -F -- "$1" || { echo "it exited 1, but its last words do not name '$1':"; tail -3 "$2"; return 1; }
}

weft_make_node
# An uplink with a LAN and a default route: what a bad pod CIDR would capture.
in_node ip link add "$UPLINK" type veth peer name "${UPLINK}p"
in_node ip link set "${UPLINK}p" up
in_node ip link set "$UPLINK" up
in_node ip addr add 192.168.77.2/24 dev "$UPLINK"
in_node ip route add default via 192.168.77.1 dev "$UPLINK"
weft_start_manager --pod-cidr "$CIDR"
weft_add_pod victim '[{"key":"app","value":"victim"}]' >/dev/null || die "ADD victim failed"
VICTIM=$WEFT_P-victim
VICTIM_ID=$(weftctl -o json endpoint list | jq -r --arg c "$VICTIM" '.[] | select(.container_id == $c) | .id')
[ -n "$VICTIM_ID" ] || die "victim endpoint not registered"
before=$(world)

echo "== state files (the database holds every pod's labels)"
check "the state dir is 0700" test "$(stat -c %a "$WEFT_STATE")" = 700
check "no state file is readable by group or others" test -z "$(find "$WEFT_STATE" -perm /077 -print -quit)"
check "root lists the state dir and its database (positive control)" test -n "$(ls "$WEFT_STATE")" -a -e "$WEFT_STATE/db"
check_fails "uid 65534 cannot list the state dir: Permission denied" "ls: cannot open directory .*Permission denied" as_nobody ls "$WEFT_STATE"
check_fails "uid 65534 cannot read the database: Permission denied" "$WEFT_STATE/db.*Permission denied" as_nobody ls "$WEFT_STATE/db"

echo "== the API socket"
check "the socket is 0600" test "$(stat -c %a "$WEFT_SOCK")" = 600
# connect(2) itself, so that nothing but the socket's permission can make it fail (a missing
# tool, a wrong path or an HTTP error would each say something else).
# /usr/bin/python3 by path: uid 65534 may not run a per-user shim found first on root's PATH.
connect_sock() { /usr/bin/python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1]); print("connected")' "$1"; }
check "root connects to the API socket (positive control)" connect_sock "$WEFT_SOCK"
check_fails "uid 65534 cannot connect to the API: connect(2) says Permission denied" "PermissionError: \\[Errno 13\\]" as_nobody /usr/bin/python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])' "$WEFT_SOCK"

echo "== an operator loosened the socket (0666): what uid 65534 can still not do"
chmod 666 "$WEFT_SOCK"
check "uid 65534 now connects (positive control: the same tool, as uid 65534)" as_nobody /usr/bin/python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])' "$WEFT_SOCK"
api_as_nobody() { # METHOD PATH BODY → "status body"
  as_nobody curl -s -o - -w '\n%{http_code}' --unix-socket "$WEFT_SOCK" -X "$1" \
    -H 'content-type: application/json' --data-binary "$3" "http://weft$2" 2>&1
}
out=$(api_as_nobody POST "/v1/endpoints/$VICTIM_ID/labels" '{"add":["x=a\nINJECTED b"],"remove":[]}')
check "a label with a newline is 400 invalid" grep -qx 400 <<<"$(tail -1 <<<"$out")"
check "  ... with a {kind,message} body naming the label" jq_one '.kind == "invalid" and (.message | test("label"))' <<<"$(head -n -1 <<<"$out")"
out=$(api_as_nobody POST "/v1/endpoints/$VICTIM_ID/labels" '{"add":["bad key=v"],"remove":[]}')
check "a label key with a space is 400" grep -qx 400 <<<"$(tail -1 <<<"$out")"
no_injected_line() { # weftctl answers (a failure must not pass as "nothing injected"), lists the victim, no line of its own
  local out
  out=$(weftctl endpoint list) || { echo "weftctl endpoint list failed: $out"; return 1; }
  grep -q "$VICTIM" <<<"$out" || { echo "the victim is not listed: $out"; return 1; }
  ! grep -q '^INJECTED' <<<"$out"
}
check "weftctl prints no injected line" no_injected_line
# Exhaustion: one unprivileged process opens 1500 connections that never finish their header.
cat >"$WEFT_TMP/flood.py" <<'PY'
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
conns = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
        s.send(b"GET /v1/status HTTP/1.1\r\n")
    except OSError:
        s.close()
        continue
    conns.append(s)
connected = len(conns)
time.sleep(1.5)
alive = 0
for s in conns:
    s.setblocking(False)
    try:
        alive += s.recv(1) != b""
    except BlockingIOError:
        alive += 1
    except OSError:
        pass
print(connected, alive, flush=True)
time.sleep(float(sys.argv[3]))
PY
as_nobody /usr/bin/python3 "$WEFT_TMP/flood.py" "$WEFT_SOCK" 1500 30 >"$WEFT_TMP/flood.out" 2>&1 &
FLOOD=$!
for i in $(seq 100); do [ -s "$WEFT_TMP/flood.out" ] && break; sleep 0.1; done
read -r connected alive <"$WEFT_TMP/flood.out"
echo "   uid 65534 opened ${connected:-?} of 1500 half-open connections; the manager kept ${alive:-?} of them"
# The cap is only exercised when the flood really connected beyond it; a flood whose connects all
# failed (0 connected, 0 kept) proves nothing.
check "the flood connected more than the cap (1500 asked, > 256 connected)" test "${connected:-0}" -gt 256
check "the manager keeps at most 256 of them, and some (it did accept them)" test "${alive:-0}" -ge 1 -a "${alive:-99999}" -le 256
check "the API still answers root during the flood" timeout 20 "$WEFT_BIN/weftctl" --socket "$WEFT_SOCK" status
kill "$FLOOD" 2>/dev/null; wait "$FLOOD" 2>/dev/null; FLOOD=
chmod 600 "$WEFT_SOCK"
check "nothing changed (endpoints, labels, IPAM, links, routes, maps)" test "$(world)" = "$before"

echo "== the socket in a world-writable dir: a forged delete-queue request"
weft_stop_manager
WW=$WEFT_TMP/ww
mkdir "$WW" && chmod 777 "$WW"
VICTIM_HOST=$(host_ifname "$VICTIM" eth0)
as_nobody mkdir "$WW/delete-queue"
as_nobody sh -c "printf '{\"container_id\":\"%s\",\"ifname\":\"eth0\"}' '$VICTIM' >'$WW/delete-queue/$VICTIM_HOST.json'"
start_other "$WEFT_TMP/ww.log" "$WW/manager.sock" --state-dir "$WEFT_STATE" --bpffs "$WEFT_BPFFS" \
  --node-name "$WEFT_P" --pod-cidr "$CIDR"
sleep 2.5 # the queue is drained at start and every 2 s
reap_other
check "the manager refuses a socket in a world-writable dir, naming it" refused_naming "$WW" "$WEFT_TMP/ww.log"
stop_other
restart --pod-cidr "$CIDR"
check "the forged request deleted nothing (endpoints, IPAM, links, routes, maps)" test "$(world)" = "$before"
weft_stop_manager

echo "== a planted symlink where a DEL-while-down writes its queue file"
echo "root only" >"$WEFT_TMP/rootfile" && chmod 600 "$WEFT_TMP/rootfile"
GHOST_HOST=$(host_ifname ghost eth0)
as_nobody ln -sf "$WEFT_TMP/rootfile" "$WW/delete-queue/.$GHOST_HOST.json.tmp"
ww_netconf=$(printf '{"cniVersion":"1.0.0","name":"weft","type":"weft","socket":"%s"}' "$WW/manager.sock")
ip netns add "${WEFT_P}-ghost"
WEFT_PODS+=(ghost)
printf '%s' "$ww_netconf" | weft_cni DEL ghost "/run/netns/${WEFT_P}-ghost" eth0 >"$WEFT_TMP/ghost.out" 2>&1
check "the root-only file the link points at is unchanged" test "$(cat "$WEFT_TMP/rootfile")" = "root only"
check "  ... and still 0600" test "$(stat -c %a "$WEFT_TMP/rootfile")" = 600

echo "== a planted symlink as the CNI logFile"
echo "root only" >"$WEFT_TMP/rootfile2" && chmod 600 "$WEFT_TMP/rootfile2"
STICKY=$WEFT_TMP/sticky
mkdir "$STICKY" && chmod 1777 "$STICKY"
as_nobody ln -s "$WEFT_TMP/rootfile2" "$STICKY/weft.log"
log_netconf() { printf '{"cniVersion":"1.0.0","name":"weft","type":"weft","socket":"%s","logFile":"%s","logLevel":"debug"}' "$WEFT_SOCK" "$1"; }
# Positive control: the same call with a logFile root may write does log there.
log_netconf "$WEFT_TMP/own-cni.log" | weft_cni DEL ghost "/run/netns/${WEFT_P}-ghost" eth0 >/dev/null 2>&1
check "a logFile root owns gets the plugin's log (positive control)" test -s "$WEFT_TMP/own-cni.log"
log_netconf "$STICKY/weft.log" | weft_cni DEL ghost "/run/netns/${WEFT_P}-ghost" eth0 >/dev/null 2>"$WEFT_TMP/planted.err"
check "root never appends to what a planted logFile link points at" test "$(cat "$WEFT_TMP/rootfile2")" = "root only"
check "  ... and says it refused the logFile (on stderr)" grep -q "refusing or unable to open logFile" "$WEFT_TMP/planted.err"

restart --pod-cidr "$CIDR"
before=$(world)

echo "== a second manager on the same pin dir; --socket naming a regular file"
echo "precious" >"$WEFT_TMP/precious"
start_other "$WEFT_TMP/second.log" "$WEFT_TMP/second.sock" --state-dir "$WEFT_TMP/state2" \
  --bpffs "$WEFT_BPFFS" --node-name "$WEFT_P" --pod-cidr 10.0.42.0/24
reap_other
check "a second manager on the same pin dir is refused, saying another manager holds it" \
  refused_naming "another weft-manager already uses the pin dir $WEFT_BPFFS" "$WEFT_TMP/second.log"
stop_other
start_other "$WEFT_TMP/file.log" "$WEFT_TMP/precious" --state-dir "$WEFT_TMP/state3" \
  --bpffs "$WEFT_BPFFS-3" --node-name "$WEFT_P" --pod-cidr 10.0.43.0/24
reap_other
check "--socket naming a regular file is refused, naming it" \
  refused_naming "--socket $WEFT_TMP/precious exists and is" "$WEFT_TMP/file.log"
check "  ... and the file is intact" test "$(cat "$WEFT_TMP/precious" 2>/dev/null)" = precious
stop_other
check "the first manager is untouched" test "$(world)" = "$before"

echo "== a 100 KB container id"
big=$(head -c 51200 /dev/zero | od -An -vtx1 | tr -d ' \n')
ip netns add "${WEFT_P}-big"
WEFT_PODS+=(big)
weft_netconf | weft_cni ADD "$big" "/run/netns/${WEFT_P}-big" eth0 >"$WEFT_TMP/big.out" 2>/dev/null
check "ADD is refused with a JSON error object" jq_one '.code == 4 or .code == 7' "$WEFT_TMP/big.out"
weft_netconf | weft_cni DEL "$big" "/run/netns/${WEFT_P}-big" eth0 >"$WEFT_TMP/bigdel.out" 2>/dev/null
rc=$?
check "DEL does not panic (exit $rc, not 101)" test "$rc" != 101
check "nothing changed" test "$(world)" = "$before"

echo "== error contract"
status_is() { # WANT OUT CURL-ARGS...: the API answers WANT with a {kind,message} body
  local want=$1 out=$2; shift 2
  [ "$(curl -s -o "$out" -w '%{http_code}' --unix-socket "$WEFT_SOCK" "$@")" = "$want" ] &&
    jq_one '(.kind | type == "string") and (.message | type == "string")' "$out"
}
check "405 is JSON {kind,message}" status_is 405 "$WEFT_TMP/r405" -X DELETE http://weft/v1/status
check "400 (bad JSON) is JSON {kind,message}" status_is 400 "$WEFT_TMP/r400" -X POST -H 'content-type: application/json' --data-binary '{' http://weft/v1/endpoints
head -c $((3 << 20)) /dev/zero | tr '\0' ' ' >"$WEFT_TMP/3m"
check "413 is JSON {kind,message}" status_is 413 "$WEFT_TMP/r413" -X POST -H 'content-type: application/json' --data-binary @"$WEFT_TMP/3m" http://weft/v1/policies
check "413 is JSON {kind,message} for a policy file sent as bytes (PUT)" status_is 413 "$WEFT_TMP/r413put" -X PUT --data-binary @"$WEFT_TMP/3m" "http://weft/v1/policies?file=big.json"
head -c $((4 << 20)) /dev/zero | tr '\0' ' ' >"$WEFT_TMP/big-policy.json"
check_fails "weftctl refuses a 4 MB policy, naming the size limit" "accepts at most [0-9]+ bytes per request" weftctl policy import "$WEFT_TMP/big-policy.json"
check "nothing changed" test "$(world)" = "$before"
echo "== CNI_NETNS naming the plugin's own netns"
weft_netconf | weft_cni ADD own /proc/self/ns/net eth0 >"$WEFT_TMP/own.out" 2>/dev/null
check "ADD is refused with code 4" jq_one '.code == 4' "$WEFT_TMP/own.out"
check "nothing changed (no eth0 or pod IP in the node netns)" test "$(world)" = "$before"

weft_stop_manager

echo "== bad pod CIDRs (operator mistakes)"
routes_before=$(in_node ip route show; in_node ip addr show dev "$UPLINK")
for bad in 0.0.0.0/0 192.168.77.0/24; do
  start_other "$WEFT_TMP/cidr.log" "$WEFT_TMP/cidr.sock" --state-dir "$WEFT_TMP/state-cidr" \
    --bpffs "$WEFT_BPFFS-cidr" --node-name "$WEFT_P" --pod-cidr "$bad"
  reap_other
  check "--pod-cidr $bad is refused, naming it" refused_naming "$bad" "$WEFT_TMP/cidr.log"
  stop_other
  check "  ... and the node's routes and addresses are unchanged" test "$(in_node ip route show; in_node ip addr show dev "$UPLINK")" = "$routes_before"
  rm -rf "$WEFT_TMP/state-cidr" "$WEFT_TMP/cidr.sock" "$WEFT_BPFFS-cidr"
done

echo "== a CIDR change leaves no old router IP or route on weft_host"
# A node of its own: nothing of the first manager's CIDR on it.
N2=/run/netns/${WEFT_P}-n2
ip netns add "${WEFT_P}-n2" && nsenter --net="$N2" ip link set lo up
n2() {
  nsenter --net="$N2" "$WEFT_BIN/weft-manager" --state-dir "$WEFT_TMP/state-n2" --socket "$WEFT_TMP/n2.sock" \
    --bpffs "$WEFT_BPFFS-n2" --node-name "$WEFT_P" --pod-cidr "$1" >>"$WEFT_TMP/n2.log" 2>&1 &
  OTHER_PID=$!
  "$WEFT_BIN/weftctl" --socket "$WEFT_TMP/n2.sock" status --wait 20 >/dev/null 2>&1
}
n2 10.0.45.0/24 || echo "   (the first manager of the CIDR change did not come up)"
stop_other
n2 10.0.46.0/24 || echo "   (the second manager of the CIDR change did not come up)"
check "the new router IP is on weft_host" sh -c "nsenter --net=$N2 ip -o addr show dev weft_host | grep -q 'inet 10\.0\.46\.'"
check "no address of the old CIDR on weft_host" test -z "$(nsenter --net="$N2" ip -o addr show dev weft_host | grep 'inet 10\.0\.45\.')"
check "no route to the old CIDR" test -z "$(nsenter --net="$N2" ip route show | grep '^10\.0\.45\.')"
stop_other

weft_summary
