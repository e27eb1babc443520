#!/usr/bin/env python3
"""The Kubernetes side of scripts/bench-cluster: creates pods and NetworkPolicies through the API
server and times them, with the clock the rest of the harness reads (CLOCK_REALTIME, µs).

Runs in the node (the API server listens on the node's private address) with the admin's client
certificate. Python's standard library only (http.client over TLS): a persistent connection per
thread, as client-go keeps one.

  cluster_api.py API startup --ns NS --mode seq|burst --count N --image IMG --out FILE
      Pods NAME-0..N-1 running `agnhost netexec` (UDP echo on --udp-port). seq: one at a time,
      the next created once the previous one is Running and answered; burst: all N created at
      once (one thread each, started together). A watch on the namespace records when each pod's
      IP, phase Running and Ready condition appear. The pod's container first sends `hello NAME`
      three times to --node-ip:--hello-port (nc), then execs netexec: its address is known here
      as soon as its container runs, not only once the kubelet reports it (the kubelet's status
      follows its 1 s relist). A prober in this process (the node's netns) sends `echo` datagrams
      to every pod whose address is known and has not answered yet, every --probe-ms. One JSON
      line per pod: create (before the POST), created (its answer), hello (its first datagram
      arrived), ip_t, running, ready (from the watch), answered (send time of the first
      datagram that was answered), all µs, or null.
  cluster_api.py API policies --client-ns C --target-ns T --targets K --count P --qps Q --out FILE
      clusterloader2's network-policy enforcement load (perf-tests, clusterloader2/pkg/measurement/
      common/network-policy): P NetworkPolicies created at Q per second on a steady schedule; K
      of them, spread evenly, are allow policies (egress from type=policy-creation pods in C to
      the target pod target=tI in T, one distinct flow each); the rest are clusterloader2's load
      policies (egress to 10.0.0.0/24 on TCP 8080 and 6355 for pods name=policy-load-small-
      deployment-J in T). One JSON line per policy: kind, name, target, start, done, status.

API is --server URL --ca FILE --cert FILE --key FILE.
"""

import argparse
import http.client
import json
import select
import socket
import ssl
import sys
import threading
import time
import urllib.parse


def now_us():
    return time.time_ns() // 1000


class Api:
    def __init__(self, server, ca, cert, key):
        u = urllib.parse.urlparse(server)
        self.host, self.port = u.hostname, u.port or 443
        self.ctx = ssl.create_default_context(cafile=ca)
        self.ctx.load_cert_chain(cert, key)
        self.local = threading.local()

    def connect(self, timeout=60):
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def request(self, method, path, body=None):
        """(status, decoded body) on this thread's persistent connection (reconnects once)."""
        for attempt in (0, 1):
            c = getattr(self.local, "conn", None)
            if c is None:
                c = self.local.conn = self.connect()
            try:
                data = json.dumps(body).encode() if body is not None else None
                c.request(method, path, body=data, headers={"Content-Type": "application/json",
                                                            "Accept": "application/json"})
                r = c.getresponse()
                raw = r.read()
                try:
                    obj = json.loads(raw) if raw else None
                except ValueError:
                    obj = {"raw": raw.decode(errors="replace")}
                return r.status, obj
            except (http.client.HTTPException, OSError):
                self.local.conn = None
                c.close()
                if attempt:
                    raise
        raise RuntimeError("unreachable")


# ----------------------------------------------------------------------------------------- pods
class Pod:
    __slots__ = ("name", "idx", "create", "created", "status", "ip", "ip_t", "running", "ready",
                 "sends", "answered", "answered_recv", "hello", "hello_ip", "target")

    def __init__(self, name, idx):
        self.name, self.idx = name, idx
        self.create = self.created = self.status = None
        self.ip = self.ip_t = self.running = self.ready = None
        self.hello = self.hello_ip = self.target = None
        self.sends = []
        self.answered = self.answered_recv = None


def pod_manifest(a, name):
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": a.ns, "labels": {"app": a.app}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "netexec", "image": a.image, "imagePullPolicy": "IfNotPresent",
                "command": ["/bin/sh", "-c"],
                "args": [f"for i in 1 2 3; do echo 'hello {name}' | nc -u -w0 {a.node_ip} {a.hello_port}; done; "
                         f"exec /agnhost netexec --http-port={a.http_port} --udp-port={a.udp_port}"],
            }],
        },
    }


def watch_pods(api, ns, pods, lock, stop, rv):
    """Records the first time each pod shows an IP, phase Running and condition Ready."""
    while not stop.is_set():
        c = api.connect(timeout=None)
        try:
            c.request("GET", f"/api/v1/namespaces/{ns}/pods?watch=1&resourceVersion={rv}"
                             "&timeoutSeconds=3600")
            r = c.getresponse()
            if r.status != 200:
                raise RuntimeError(f"watch answered {r.status}: {r.read()[:300]!r}")
            while not stop.is_set():
                line = r.readline()
                if not line:
                    break
                t = now_us()
                ev = json.loads(line)
                obj = ev.get("object", {})
                if ev.get("type") == "ERROR":
                    raise RuntimeError(f"watch error: {obj}")
                rv = obj.get("metadata", {}).get("resourceVersion", rv)
                name = obj.get("metadata", {}).get("name")
                st = obj.get("status", {})
                with lock:
                    p = pods.get(name)
                    if p is None:
                        continue
                    if p.ip is None and st.get("podIP"):
                        p.ip, p.ip_t = st["podIP"], t
                        if p.target is None:
                            p.target = p.ip
                    if p.running is None and st.get("phase") == "Running":
                        p.running = t
                    if p.ready is None and any(cd.get("type") == "Ready" and cd.get("status") == "True"
                                               for cd in st.get("conditions") or []):
                        p.ready = t
        except (OSError, http.client.HTTPException):
            pass
        finally:
            c.close()


def probe_pods(pods, lock, stop, a):
    """From this netns: `echo IDX SEQ` to every pod whose address is known (its hello, or its
    status) and that has not answered, every --probe-ms; records the pods' hellos."""
    port, interval = a.udp_port, a.probe_ms / 1000
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    hello = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    hello.bind((a.node_ip, a.hello_port))
    hello.setblocking(False)
    by_idx = {}
    next_send = time.monotonic()
    while not stop.is_set():
        if time.monotonic() >= next_send:
            with lock:
                todo = [p for p in pods.values() if p.target and p.answered is None]
            for p in todo:
                by_idx[p.idx] = p
                seq = len(p.sends)
                p.sends.append(now_us())
                try:
                    s.sendto(f"echo {p.idx} {seq}".encode(), (p.target, port))
                except OSError:
                    pass  # no route yet: the datagram is lost like a dropped one
            next_send += interval
            if next_send < time.monotonic():
                next_send = time.monotonic() + interval
        wait = max(0.0, next_send - time.monotonic())
        r, _, _ = select.select([s, hello], [], [], wait)
        if hello in r:
            while True:
                try:
                    data, (ip, _) = hello.recvfrom(256)
                except BlockingIOError:
                    break
                t = now_us()
                words = data.decode(errors="replace").split()
                if len(words) == 2 and words[0] == "hello":
                    with lock:
                        p = pods.get(words[1])
                        if p is not None and p.hello is None:
                            p.hello, p.hello_ip = t, ip
                            if p.target is None:
                                p.target = ip
        if s not in r:
            continue
        while True:
            try:
                data, _ = s.recvfrom(256)
            except BlockingIOError:
                break
            t = now_us()
            try:
                idx, seq = (int(x) for x in data.split())
            except ValueError:
                continue
            p = by_idx.get(idx)
            if p is not None and p.answered is None and 0 <= seq < len(p.sends):
                p.answered, p.answered_recv = p.sends[seq], t


def create_pod(api, a, p):
    p.create = now_us()
    status, obj = api.request("POST", f"/api/v1/namespaces/{a.ns}/pods", pod_manifest(a, p.name))
    p.created, p.status = now_us(), status
    if status != 201:
        print(f"cluster_api: creating pod {p.name} answered {status}: {json.dumps(obj)[:300]}",
              file=sys.stderr)


def startup(api, a):
    status, obj = api.request("GET", f"/api/v1/namespaces/{a.ns}/pods")
    if status != 200:
        sys.exit(f"cluster_api: cannot list pods in {a.ns}: {status} {obj}")
    rv = obj["metadata"]["resourceVersion"]
    pods, lock, stop = {}, threading.Lock(), threading.Event()
    for i in range(a.count):
        name = f"{a.prefix}-{i}"
        pods[name] = Pod(name, i)
    threads = [threading.Thread(target=watch_pods, args=(api, a.ns, pods, lock, stop, rv), daemon=True),
               threading.Thread(target=probe_pods, args=(pods, lock, stop, a), daemon=True)]
    for t in threads:
        t.start()
    deadline = None
    done = lambda p: p.status is not None and (p.status != 201 or (p.answered and p.running))
    if a.mode == "seq":
        for p in pods.values():
            create_pod(api, a, p)
            end = time.monotonic() + a.timeout
            while not done(p) and time.monotonic() < end:
                time.sleep(0.005)
            if not done(p):
                print(f"cluster_api: pod {p.name} not Running and answered after {a.timeout} s",
                      file=sys.stderr)
    else:
        go = threading.Barrier(a.count)
        def one(p):
            go.wait()
            create_pod(api, a, p)
        creators = [threading.Thread(target=one, args=(p,)) for p in pods.values()]
        for t in creators:
            t.start()
        for t in creators:
            t.join()
        deadline = time.monotonic() + a.timeout
        while time.monotonic() < deadline and not all(done(p) for p in pods.values()):
            time.sleep(0.01)
    time.sleep(0.2)  # the last watch events
    stop.set()
    missing = 0
    with open(a.out, "w", encoding="utf-8") as f:
        for p in pods.values():
            if not done(p):
                missing += 1
            f.write(json.dumps({"pod": p.name, "status": p.status, "create": p.create,
                                "created": p.created, "hello": p.hello, "hello_ip": p.hello_ip,
                                "ip": p.ip, "ip_t": p.ip_t,
                                "running": p.running, "ready": p.ready, "answered": p.answered,
                                "answered_recv": p.answered_recv, "sends": len(p.sends)}) + "\n")
    return 0 if missing == 0 else 3


# ------------------------------------------------------------------------------------- policies
def allow_policy(a, i):
    """clusterloader2's allow-egress-to-target with the target namespace named, narrowed to one
    target pod: a distinct prober -> target flow per policy."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": f"allow-egress-to-target-{i}", "namespace": a.client_ns,
                     "labels": {"type": "policy-creation"}},
        "spec": {
            "podSelector": {"matchLabels": {"type": "policy-creation"}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{
                "podSelector": {"matchLabels": {"net-pol-test": "enforcement-latency", "target": f"t{i}"}},
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": a.target_ns}},
            }]}],
        },
    }


def load_policy(a, j):
    """clusterloader2's policy-load.yaml (namespace index 0: 10.0.0.0/24)."""
    sel = f"policy-load-small-deployment-{j}"
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": f"{sel}-0", "namespace": a.target_ns, "labels": {"group": "load"}},
        "spec": {
            "podSelector": {"matchLabels": {"name": sel}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/24"}}],
                        "ports": [{"protocol": "TCP", "port": 8080}, {"protocol": "TCP", "port": 6355}]}],
        },
    }


def policies(api, a):
    if a.targets > a.count:
        sys.exit(f"cluster_api: --targets {a.targets} > --count {a.count}: every allow policy is one of the {a.count}")
    # The allow policies' positions, spread evenly over the load: round((i + 0.5) * P / K).
    allow_at = {int((i + 0.5) * a.count / a.targets): i for i in range(a.targets)}
    rows, load_j, unnamed = [], 0, 0
    # The prober's hot socket, named each allow policy's target just before its create request.
    hot = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if a.hot_socket else None
    t0 = time.monotonic() + 0.05
    for k in range(a.count):
        when = t0 + k / a.qps
        delay = when - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if k in allow_at:
            i = allow_at[k]
            kind, body, ns, target = "allow", allow_policy(a, i), a.client_ns, f"t{i}"
            if hot:
                try:
                    hot.sendto(target.encode(), a.hot_socket)
                except OSError as e:
                    unnamed += 1
                    print(f"cluster_api: cannot name {target} to the prober at {a.hot_socket}: {e.strerror}",
                          file=sys.stderr)
        else:
            kind, body, ns, target = "load", load_policy(a, load_j), a.target_ns, None
            load_j += 1
        start = now_us()
        status, obj = api.request("POST", f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies", body)
        done = now_us()
        if status != 201:
            print(f"cluster_api: creating {body['metadata']['name']} answered {status}: {json.dumps(obj)[:300]}",
                  file=sys.stderr)
        rows.append({"kind": kind, "name": body["metadata"]["name"], "target": target,
                     "start": start, "done": done, "status": status})
    with open(a.out, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    if unnamed:
        print(f"cluster_api: {unnamed} allow policies' targets were not named to the prober", file=sys.stderr)
        return 4
    return 0 if all(r["status"] == 201 for r in rows) else 3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("startup")
    s.add_argument("--ns", required=True)
    s.add_argument("--mode", choices=("seq", "burst"), required=True)
    s.add_argument("--count", type=int, required=True)
    s.add_argument("--image", required=True)
    s.add_argument("--prefix", default="p")
    s.add_argument("--app", default="bench-startup")
    s.add_argument("--udp-port", type=int, default=8081)
    s.add_argument("--node-ip", required=True)
    s.add_argument("--hello-port", type=int, default=28081)
    s.add_argument("--http-port", type=int, default=8080)
    s.add_argument("--probe-ms", type=float, default=5)
    s.add_argument("--timeout", type=float, default=300)
    s.add_argument("--out", required=True)
    p = sub.add_parser("policies")
    p.add_argument("--client-ns", required=True)
    p.add_argument("--target-ns", required=True)
    p.add_argument("--targets", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--qps", type=float, required=True)
    p.add_argument("--hot-socket", help="the prober's (cluster_probe.py first --hot-socket): each allow "
                   "policy's target is named there just before its create request")
    p.add_argument("--out", required=True)
    a = ap.parse_args()
    api = Api(a.server, a.ca, a.cert, a.key)
    return startup(api, a) if a.cmd == "startup" else policies(api, a)


if __name__ == "__main__":
    sys.exit(main())
