#!/usr/bin/env python3
"""The prober of scripts/bench-cluster: UDP `echo` requests to agnhost netexec servers, run from
a pod's network namespace (nsenter --net=/proc/PID/ns/net), so its datagrams leave through that
pod's interface and its policy. The clock is CLOCK_REALTIME in µs, as the harness reads.

TARGETS is a file of `NAME IP` lines; the servers echo on PORT (netexec --udp-port). A request
is `echo I SEQ`; the answer names the target and the request, so a late answer is credited to
the request that was let through, not to the time it came back.

  cluster_probe.py first TARGETS PORT --interval-ms MS --timeout S [--stop-file F]
                   [--hot-socket P [--hot-ms H] [--hot-s D]]
      Sends to every target without an answer yet, every MS on average (in every mode each
      interval is drawn from 0.5-1.5 MS: no fixed phase against the load); prints `ready` once
      the first round is out. Stops when every target answered, at S, or when F exists. With
      --hot-socket, a datagram `NAME` to the unix socket P (bound here) makes that target hot:
      sent to every H ms (default 1) besides the rounds, until it answers or for D s (default
      2), so the load's driver can name the flow it is about to enable and its first answer is
      seen within ~H ms, not a round's MS. One JSON line per target: first (send time of the
      first answered request), recv (when its answer came), sent_before (requests sent to it
      before that one, all unanswered), hot (when it was named, or null).
  cluster_probe.py check TARGETS PORT --interval-ms MS --seconds S
      Sends to every target every MS for S seconds (then waits 0.5 s for late answers). One JSON
      line per target: sent, answered.
  cluster_probe.py stream TARGETS PORT --interval-ms MS --stop-file F
      Sends to every target every MS until F exists, then waits 1 s for late answers. One JSON
      line per target: sends (send times) and answered (0/1 per request).
"""

import argparse
import errno
import json
import os
import random
import select
import socket
import sys
import time


def now_us():
    return time.time_ns() // 1000


def read_targets(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                name, ip = line.split()[:2]
                out.append({"name": name, "ip": ip, "sends": [], "answered": None, "first": None,
                            "recv": None, "errors": {}})
    if not out:
        sys.exit(f"cluster_probe: no targets in {path}")
    return out


def send(s, i, t, port):
    seq = len(t["sends"])
    t["sends"].append(now_us())
    try:
        s.sendto(f"echo {i} {seq}".encode(), (t["ip"], port))
    except OSError as e:
        kind = errno.errorcode.get(e.errno, str(e.errno))
        t["errors"][kind] = t["errors"].get(kind, 0) + 1


def next_time(t, step):
    """The deadline `step` after t, or `step` from now when t is already past by more than that."""
    t += step
    now = time.monotonic()
    return t if t >= now else now + step


class Hot:
    """The targets named on a unix datagram socket: each sent to every `interval` s from when
    it was named until it answers or for `span` s."""

    def __init__(self, path, targets, interval, span):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.bind(path)
        except OSError as e:
            sys.exit(f"cluster_probe: cannot bind --hot-socket {path}: {e.strerror} (remove a stale one)")
        self.sock.setblocking(False)
        self.path = path
        self.by_name = {t["name"]: i for i, t in enumerate(targets)}
        self.interval, self.span = interval, span
        self.until = {}  # target index -> monotonic end of its hot span
        self.next_send = 0.0  # meaningful while `until` holds a target

    def read(self, targets):
        while True:
            try:
                data = self.sock.recv(256)
            except BlockingIOError:
                return
            i = self.by_name.get(data.decode(errors="replace").strip())
            if i is None:
                print(f"cluster_probe: --hot-socket named no target: {data[:64]!r}", file=sys.stderr)
                continue
            targets[i]["hot"] = now_us()
            self.until[i] = time.monotonic() + self.span
            self.next_send = time.monotonic()

    def due(self, targets, want):
        """The hot targets to send to now (none when the next hot send is not due)."""
        now = time.monotonic()
        for i in [i for i, end in self.until.items() if now >= end or not want(targets[i])]:
            del self.until[i]
        if not self.until or now < self.next_send:
            return []
        self.next_send = next_time(self.next_send, self.interval)
        return list(self.until)

    def wake(self):
        return self.next_send if self.until else None

    def close(self):
        self.sock.close()
        os.unlink(self.path)


def run(targets, port, interval, until, want, on_answer, hot=None):
    """Sends to the targets `want` selects every interval until `until()`; on_answer(t, seq, at).
    Hot targets (see Hot) are sent to besides."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    next_send = time.monotonic()
    first_round = True
    watched = [s] + ([hot.sock] if hot else [])
    while not until():
        if time.monotonic() >= next_send:
            for i, t in enumerate(targets):
                if want(t):
                    send(s, i, t, port)
            if first_round:
                print("ready", flush=True)
                first_round = False
            # Rounds MS apart on average, each interval drawn from 0.5-1.5 MS: at a fixed
            # cadence the rounds kept one phase against a load made at a fixed rate (policies
            # created every 100 ms, rounds every 10 ms), and every flow then waited the same
            # time for its first probe after enforcement (13.3 ms for all 100 flows in one run).
            next_send = next_time(next_send, interval * random.uniform(0.5, 1.5))
        if hot:
            for i in hot.due(targets, want):
                send(s, i, targets[i], port)
        wake = min(x for x in (next_send, hot.wake() if hot else None) if x is not None)
        r, _, _ = select.select(watched, [], [], max(0.0, wake - time.monotonic()))
        if s in r:
            drain(s, targets, on_answer)
        if hot and hot.sock in r:
            hot.read(targets)
    return s


def drain(s, targets, on_answer):
    while True:
        try:
            data, _ = s.recvfrom(256)
        except BlockingIOError:
            return
        at = now_us()
        try:
            i, seq = (int(x) for x in data.split())
        except ValueError:
            continue
        if 0 <= i < len(targets) and 0 <= seq < len(targets[i]["sends"]):
            on_answer(targets[i], seq, at)


def linger(s, targets, on_answer, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        r, _, _ = select.select([s], [], [], max(0.0, end - time.monotonic()))
        if r:
            drain(s, targets, on_answer)


def first(a):
    targets = read_targets(a.targets)
    end = time.monotonic() + a.timeout

    def on_answer(t, seq, at):
        if t["first"] is None or t["sends"][seq] < t["first"]:
            if t["first"] is None:
                t["recv"] = at
            t["first"], t["seq"] = t["sends"][seq], seq

    def until():
        return (time.monotonic() >= end or all(t["first"] is not None for t in targets)
                or (a.stop_file and os.path.exists(a.stop_file)))
    hot = Hot(a.hot_socket, targets, a.hot_ms / 1000, a.hot_s) if a.hot_socket else None
    try:
        s = run(targets, a.port, a.interval_ms / 1000, until, lambda t: t["first"] is None, on_answer, hot)
    finally:
        if hot:
            hot.close()
    linger(s, targets, on_answer, 0.2)
    for t in targets:
        print(json.dumps({"name": t["name"], "ip": t["ip"], "first": t["first"], "recv": t["recv"],
                          "sent_before": t.get("seq", len(t["sends"])), "sent": len(t["sends"]),
                          "hot": t.get("hot"),
                          "send_errors": sum(t["errors"].values()), "send_error_kinds": t["errors"]}), flush=True)
    return 0


def check(a):
    targets = read_targets(a.targets)
    for t in targets:
        t["got"] = 0
    end = time.monotonic() + a.seconds

    def on_answer(t, seq, at):
        t["got"] += 1
    s = run(targets, a.port, a.interval_ms / 1000, lambda: time.monotonic() >= end,
                    lambda t: True, on_answer)
    linger(s, targets, on_answer, 0.5)
    for t in targets:
        print(json.dumps({"name": t["name"], "ip": t["ip"], "sent": len(t["sends"]), "answered": t["got"],
                          "send_errors": sum(t["errors"].values()), "send_error_kinds": t["errors"]}), flush=True)
    return 0


def stream(a):
    targets = read_targets(a.targets)
    for t in targets:
        t["ok"] = bytearray()

    def on_answer(t, seq, at):
        if len(t["ok"]) < len(t["sends"]):
            t["ok"].extend(b"\0" * (len(t["sends"]) - len(t["ok"])))
        t["ok"][seq] = 1
    s = run(targets, a.port, a.interval_ms / 1000, lambda: os.path.exists(a.stop_file),
                    lambda t: True, on_answer)
    linger(s, targets, on_answer, 1.0)
    for t in targets:
        ok = t["ok"] + b"\0" * (len(t["sends"]) - len(t["ok"]))
        print(json.dumps({"name": t["name"], "ip": t["ip"], "sends": t["sends"], "answered": list(ok),
                          "send_errors": sum(t["errors"].values()), "send_error_kinds": t["errors"]}), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("first", "check", "stream"):
        p = sub.add_parser(name)
        p.add_argument("targets")
        p.add_argument("port", type=int)
        p.add_argument("--interval-ms", type=float, default=10)
        if name == "first":
            p.add_argument("--timeout", type=float, required=True)
            p.add_argument("--stop-file")
            p.add_argument("--hot-socket")
            p.add_argument("--hot-ms", type=float, default=1)
            p.add_argument("--hot-s", type=float, default=2)
        elif name == "check":
            p.add_argument("--seconds", type=float, required=True)
        else:
            p.add_argument("--stop-file", required=True)
    a = ap.parse_args()
    return {"first": first, "check": check, "stream": stream}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
