#!/usr/bin/env bash
# Conntrack and policy changes through the Kubernetes path (weft-k8s-replay as in k8s.sh): a new
# TCP connection that reuses the 5-tuple of a closed one (closed with an RST, or with FINs) must
# meet the policy in force now, not pass on the old connection's ct entry (the reopen rule,
# docs/DATAPATH.md). z/b connects from fixed source ports to x/a:81 with no policy, each tuple is
# reused once as a positive control, then a deny-all ingress NetworkPolicy for namespace x
# arrives through the watch: the same tuples must be dropped, with the drop event to prove it
# was the policy and not the tool. Flows established before the change keep passing (TCP, UDP).
source "$(dirname "$0")/../lib.sh"
weft_need_replay
weft_plan 45
command -v curl >/dev/null || die "curl is missing: run scripts/setup"
command -v python3 >/dev/null || die "python3 is missing: run scripts/setup"

# Server: per connection, echo a 3-byte request, then end as it says: "fin" = close first (our
# FIN, then the client's as EOF), "rst" = wait for the client's RST, "hld" = keep echoing. Each
# ending it observed is logged as "PEER_PORT fin|rst", so the script knows what went on the wire.
cat >"$WEFT_TMP/server.py" <<'PY'
import socket, sys, threading
port, log = int(sys.argv[1]), open(sys.argv[2], "a", buffering=1)
def recv_exact(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            raise EOFError
        b += d
    return b
def serve(c, peer):
    c.settimeout(10)
    try:
        req = recv_exact(c, 3)
        c.sendall(req)
        if req == b"fin":
            c.shutdown(socket.SHUT_WR)
            if c.recv(16) == b"":
                log.write(f"{peer[1]} fin\n")
        elif req == b"rst":
            try:
                c.recv(16)
            except ConnectionResetError:
                log.write(f"{peer[1]} rst\n")
        else:
            c.settimeout(None)
            while True:
                c.sendall(recv_exact(c, 3))
    except (OSError, EOFError):
        pass
    finally:
        c.close()
tcp = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
tcp.bind(("::", port))
tcp.listen(64)
udp = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
udp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
udp.bind(("::", port))
def udp_echo():
    while True:
        d, peer = udp.recvfrom(2048)
        udp.sendto(d, peer)
threading.Thread(target=udp_echo, daemon=True).start()
print("ready", flush=True)
while True:
    c, peer = tcp.accept()
    threading.Thread(target=serve, args=(c, peer), daemon=True).start()
PY
# Client: MODE SRC_PORT HOST PORT. Exit 0 = session done and ended as MODE says; 2 = the connect
# got no answer (a dropped SYN); 4 = refused; 3 = anything else.
cat >"$WEFT_TMP/client.py" <<'PY'
import socket, struct, sys
mode, sport, host, port = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", sport))
s.settimeout(2)
try:
    s.connect((host, port))
except ConnectionRefusedError:
    sys.exit(4)
except (socket.timeout, TimeoutError):
    print(f"connect :{sport} -> {host}:{port}: no answer")
    sys.exit(2)
try:
    s.sendall(mode.encode())
    if s.recv(3) != mode.encode():
        sys.exit(3)
    if mode == "fin" and s.recv(1) != b"":
        sys.exit(3)
except OSError as e:
    print(e)
    sys.exit(3)
if mode == "rst":
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
s.close()
PY

NODE=$WEFT_P
ns() { jq -nc --arg n "$1" '{apiVersion:"v1",kind:"Namespace",metadata:{name:$n,resourceVersion:"10",uid:("uid-ns-"+$n),
  labels:{"kubernetes.io/metadata.name":$n}},spec:{finalizers:["kubernetes"]},status:{phase:"Active"}}'; }
pod() { # NS NAME
  jq -nc --arg ns "$1" --arg n "$WEFT_P-$2" --arg node "$NODE" \
    '{apiVersion:"v1",kind:"Pod",metadata:{name:$n,namespace:$ns,uid:("uid-"+$n),resourceVersion:"100",labels:{pod:$n}},
      spec:{nodeName:$node,serviceAccountName:"default",containers:[{name:"c",image:"agnhost"}]},status:{phase:"Pending"}}'
}
deny_all_x() {
  jq -nc '{apiVersion:"networking.k8s.io/v1",kind:"NetworkPolicy",
    metadata:{name:"deny-all-ingress",namespace:"x",uid:"uid-np-deny",resourceVersion:"30",generation:1},
    spec:{podSelector:{},policyTypes:["Ingress"]}}'
}
list() { # API_VERSION KIND ITEM...
  local av=$1 kind=$2; shift 2
  printf '%s\n' "$@" | jq -sc --arg av "$av" --arg k "${kind}List" '{apiVersion:$av,kind:$k,metadata:{resourceVersion:"100"},items:.}'
}
node_obj=$(jq -nc --arg n "$NODE" '{apiVersion:"v1",kind:"Node",metadata:{name:$n,uid:"uid-node",resourceVersion:"5"},
  spec:{podCIDR:"10.0.17.0/24",podCIDRs:["10.0.17.0/24","fd00:10:17::/64"]}}')
jq -n \
  --argjson node "$node_obj" \
  --argjson nodes "$(list v1 Node "$node_obj")" \
  --argjson pods "$(list v1 Pod "$(pod x a)" "$(pod z b)")" \
  --argjson nss "$(list v1 Namespace "$(ns x)" "$(ns z)")" \
  --argjson nps '{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicyList","metadata":{"resourceVersion":"100"},"items":[]}' \
  --argjson svcs '{"apiVersion":"v1","kind":"ServiceList","metadata":{"resourceVersion":"100"},"items":[]}' \
  --argjson slices '{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSliceList","metadata":{"resourceVersion":"100"},"items":[]}' \
  --arg nodepath "/api/v1/nodes/$NODE" \
  '{objects:{($nodepath):$node},
    lists:{"/api/v1/nodes":[$nodes],"/api/v1/pods":[$pods],"/api/v1/namespaces":[$nss],
           "/apis/networking.k8s.io/v1/networkpolicies":[$nps],
           "/api/v1/services":[$svcs],"/apis/discovery.k8s.io/v1/endpointslices":[$slices]}}' >"$WEFT_TMP/replay.json"

weft_make_node
REPLAY_PID= SERVER_PID= MON= HELD_PID=
trap 'rc=$?; exec 7>&-; kill $REPLAY_PID $SERVER_PID $MON $HELD_PID 2>/dev/null; (exit $rc); weft_cleanup' EXIT
weft_start_replay

weft_start_manager --k8s --kubeconfig "$WEFT_TMP/kubeconfig" --k8s-cilium-policies false
for p in "x a" "z b"; do
  set -- $p
  ip netns add "${WEFT_P}-$2" || die "netns $2"
  WEFT_PODS+=("$2")
  weft_netconf | weft_cni ADD "$WEFT_P-$2" "/run/netns/${WEFT_P}-$2" eth0 \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=$1;K8S_POD_NAME=$WEFT_P-$2" >/dev/null || die "ADD $2 failed"
done
A4=$(pod_ip a) A6=$(pod_ip -6 a) B4=$(pod_ip b)
[ -n "$A4" ] && [ -n "$A6" ] && [ -n "$B4" ] || die "pods have no addresses"
# `ip netns exec` (it execs), not the in_pod function: $! must be the server itself for the EXIT
# trap's kill to end it (a backgrounded function is a subshell, and its server outlived the run).
ip netns exec "${WEFT_P}-a" python3 "$WEFT_TMP/server.py" 81 "$WEFT_TMP/ended.log" >"$WEFT_TMP/server.out" 2>&1 &
SERVER_PID=$!
ip netns exec "${WEFT_P}-b" python3 "$WEFT_TMP/server.py" 81 "$WEFT_TMP/ended-b.log" >"$WEFT_TMP/server-b.out" 2>&1 &
SERVER_PID="$SERVER_PID $!"
for _ in $(seq 100); do grep -q ready "$WEFT_TMP/server.out" && grep -q ready "$WEFT_TMP/server-b.out" && break; sleep 0.05; done
"$WEFT_BIN/weftctl" --socket "$WEFT_SOCK" -o json monitor >"$WEFT_TMP/monitor.jsonl" 2>&1 &
MON=$!

# session MODE SRC_PORT HOST [POD]: a client session from POD (default b) to HOST:81.
session() { in_pod "${4:-b}" python3 "$WEFT_TMP/client.py" "$1" "$2" "$3" 81; }
# dropped MODE SRC_PORT HOST: the connect got no answer (exit 2; anything else is a tool error).
dropped() { local rc=0; session "$@" || rc=$?; [ "$rc" = 2 ] || { echo "client exit $rc (want 2: no answer)"; return 1; }; }
# ended_as SRC_PORT fin|rst N: the server saw N connections from SRC_PORT end that way.
ended_n() { test "$(grep -cx "$1 $2" "$WEFT_TMP/ended.log" || true)" -ge "$3"; }
ended_as() { eventually ended_n "$@"; }
port_free() { eventually bash -c "! ip netns exec ${WEFT_P}-b ss -Htan 'sport = :$1' | grep -q ." ; }
# drop_event SRC_PORT DST_IP: the datapath reported dropping that very tuple at x/a's ingress.
drop_event() {
  eventually jq -e -s --argjson p "$1" --arg d "$2" \
    'any(.[]; .src_port == $p and .dst_ip == $d and .dst_port == 81 and .proto == 6 and .direction == "ingress" and (.reason | startswith("policy")))' \
    "$WEFT_TMP/monitor.jsonl"
}
trace() { weftctl -o json policy trace --src "$B4" --dst "$1" --dport 81 --proto tcp | jq -r .verdict; }

echo "== no policy: sessions from fixed ports, each tuple reused once (positive control)"
# MODE PORT HOST: RST and FIN closes, over IPv4 and IPv6.
CASES=("rst 45101 $A4" "fin 45102 $A4" "rst 45103 $A6" "fin 45104 $A6")
for c in "${CASES[@]}"; do
  set -- $c
  n=0
  for round in first reuse; do
    n=$((n + 1))
    check "$1 session :$2 -> $3:81 ($round)" session "$1" "$2" "$3"
    check "  the server saw it end with $1" ended_as "$2" "$1" "$n"
    check "  the client's port is free again" port_free "$2"
  done
done
check "trace: b -> a:81 allowed" test "$(trace "$A4")" = allow
# Established before the change: a held TCP connection (fed through a FIFO: one round trip per
# line) and a UDP flow, from fixed ports.
cat >"$WEFT_TMP/held.py" <<'PY'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", 45110))
s.settimeout(2)
s.connect((sys.argv[1], 81))
with open(sys.argv[2], "a", buffering=1) as log:
    while sys.stdin.readline():
        try:
            s.sendall(b"hld")
            log.write("ok\n" if s.recv(3) == b"hld" else "bad\n")
        except OSError as e:
            log.write(f"error {e}\n")
PY
mkfifo "$WEFT_TMP/held.in"
ip netns exec "${WEFT_P}-b" python3 "$WEFT_TMP/held.py" "$A4" "$WEFT_TMP/held.log" <"$WEFT_TMP/held.in" 2>"$WEFT_TMP/held.err" &
HELD_PID=$!
exec 7>"$WEFT_TMP/held.in"
held_echo() { # N: the held connection's Nth round trip succeeded
  echo ping >&7
  eventually held_ok "$1" || { cat "$WEFT_TMP/held.log" "$WEFT_TMP/held.err" 2>/dev/null; return 1; }
}
held_ok() { test "$(grep -c '^ok$' "$WEFT_TMP/held.log" 2>/dev/null || true)" -ge "$1"; }
udp_from() { # SRC_PORT: a UDP datagram from b:SRC_PORT to a:81 is echoed (exit 2: no answer at all)
  in_pod b python3 -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("", int(sys.argv[2]))); s.settimeout(1.5)
for _ in range(2):
    s.sendto(b"udp", (sys.argv[1], 81))
    try:
        sys.exit(0 if s.recv(16) == b"udp" else 1)
    except socket.timeout:
        pass
print(f"udp :{sys.argv[2]} -> {sys.argv[1]}:81: no answer")
sys.exit(2)' "$A4" "$1"
}
# udp_dropped SRC_PORT: the datagrams from b:SRC_PORT to a:81 get no answer at all (not an
# error: ICMP unreachable would raise ConnectionRefusedError, exit 1), and the datapath reported
# dropping that tuple by policy at x/a's ingress. The positive control is the server answering
# the established flow :45120 just before.
udp_dropped() {
  local rc=0
  udp_from "$1" || rc=$?
  [ "$rc" = 2 ] || { echo "udp :$1 -> a:81: client exit $rc (want 2: no answer)"; return 1; }
  eventually jq -e -s --argjson p "$1" --arg d "$A4" \
    'any(.[]; .src_port == $p and .dst_ip == $d and .dst_port == 81 and .proto == 17 and .direction == "ingress" and (.reason | startswith("policy")))' \
    "$WEFT_TMP/monitor.jsonl" >/dev/null || { echo "udp :$1 -> a:81 unanswered, but no policy drop event for it: not a policy drop"; return 1; }
}
check "held TCP connection echoes" held_echo 1
check "UDP flow :45120 echoes" udp_from 45120

echo "== deny-all ingress for namespace x arrives through the watch"
rev=$(weftctl -o json status | jq .policy_revision)
check "ADDED deny-all-ingress pushed" replay_push /apis/networking.k8s.io/v1/networkpolicies \
  "$(jq -nc --argjson o "$(deny_all_x)" '{type:"ADDED",object:$o}')"
rev_moved() { [ "$(weftctl -o json status | jq .policy_revision)" -gt "$rev" ] && weftctl policy list | matches deny-all-ingress; }
check "the policy is in force" eventually rev_moved
at_rev() { local r; r=$(weftctl -o json status | jq .policy_revision); weftctl -o json endpoint list | jq -e --argjson r "$r" 'all(.[]; .policy_revision == $r)' >/dev/null; }
check "every endpoint at the new revision" eventually at_rev
check "trace: b -> a:81 denied" test "$(trace "$A4")" = deny
check "allowed elsewhere still passes: a -> b:81 (z is not isolated)" session rst 45130 "$B4" a
check "a fresh port :45131 -> a:81 is dropped (no answer)" dropped rst 45131 "$A4"
check "  its drop event arrived" drop_event 45131 "$A4"

echo "== a new SYN on a closed connection's tuple meets the new policy"
for c in "${CASES[@]}"; do
  set -- $c
  check "$1-closed tuple :$2 -> $3:81 reused: dropped (no answer)" dropped "$1" "$2" "$3"
  check "  the drop event names :$2 -> $3:81" drop_event "$2" "$3"
done

echo "== flows established before the change keep passing"
check "the held TCP connection still echoes" held_echo 2
check "the UDP flow :45120 still echoes" udp_from 45120
check "a new UDP flow :45121 is dropped by policy (no answer, its drop event)" udp_dropped 45121
exec 7>&-
weft_summary
