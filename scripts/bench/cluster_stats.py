#!/usr/bin/env python3
"""Small measuring tools of scripts/bench-cluster (CLOCK_REALTIME µs, as the harness reads).

  cluster_stats.py hist BEFORE AFTER NAME
      The histogram NAME (Prometheus text format: NAME_bucket{...,le="..."}, summed over its
      other labels) observed between two scrapes: prints `count p50_ms p99_ms`, the quantiles
      interpolated linearly inside the bucket as PromQL's histogram_quantile does (`0 - -`
      when nothing was observed; a quantile in the +Inf bucket prints the last finite bound
      prefixed with `>`).
  cluster_stats.py sample PID INTERVAL_S OUT
      Every INTERVAL_S until the process exits or this one is killed: `t_us rss_kib
      cpu_ticks ticks_per_s` (utime+stime of /proc/PID/stat) appended to OUT.
  cluster_stats.py ready (--unix SOCK PATH | --url URL [--header K:V]) --timeout S [--interval-ms MS]
      Polls an HTTP health endpoint; prints `down T` at the first answer that is not 200 (or a
      failed connect) and `up T` at the first 200 after it, then exits 0; exit 3 when it is not
      back within S.
  cluster_stats.py pidstart PID
      The process's start time (µs since the epoch; /proc/PID/stat starttime against
      CLOCK_BOOTTIME, clock-tick precision: 10 ms).
  cluster_stats.py loss STREAM NAME FROM TO BASE_FROM
      From a `cluster_probe.py stream` output: for target NAME, the requests sent in [FROM, TO)
      and how many of them got no answer, then the same for [BASE_FROM, FROM): `sent lost
      base_sent base_lost`. `answered TOTAL` instead when NAME's answers are counted whole (TO
      = 0).
"""

import argparse
import http.client
import math
import os
import re
import socket
import sys
import time


def now_us():
    return time.time_ns() // 1000


BUCKET = re.compile(r'^(?P<n>[a-zA-Z_:][a-zA-Z0-9_:]*)_bucket\{(?P<l>[^}]*)\}\s+(?P<v>\S+)')


def buckets(path, name):
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = BUCKET.match(line)
            if not m or m.group("n") != name:
                continue
            le = re.search(r'le="([^"]+)"', m.group("l"))
            if not le:
                continue
            bound = math.inf if le.group(1) in ("+Inf", "Inf") else float(le.group(1))
            out[bound] = out.get(bound, 0.0) + float(m.group("v"))
    return out


def quantile(q, cum):
    """PromQL histogram_quantile over sorted (bound, cumulative count)."""
    total = cum[-1][1]
    rank = q * total
    prev_b, prev_c = 0.0, 0.0
    for b, c in cum:
        if c >= rank:
            if math.isinf(b):
                return f">{prev_b * 1000:.4g}"
            if c == prev_c:
                return f"{b * 1000:.4g}"
            return f"{(prev_b + (b - prev_b) * (rank - prev_c) / (c - prev_c)) * 1000:.4g}"
        prev_b, prev_c = b, c
    return "-"


def hist(a):
    before, after = buckets(a.before, a.name), buckets(a.after, a.name)
    if not after:
        print(f"cluster_stats: no histogram {a.name} in {a.after}", file=sys.stderr)
        return 2
    cum = sorted((b, after[b] - before.get(b, 0.0)) for b in after)
    total = cum[-1][1]
    if total <= 0:
        print("0 - -")
        return 0
    print(f"{total:.0f} {quantile(0.5, cum)} {quantile(0.99, cum)}")
    return 0


def sample(a):
    tick = os.sysconf("SC_CLK_TCK")
    with open(a.out, "a", encoding="utf-8") as out:
        while True:
            try:
                with open(f"/proc/{a.pid}/stat", encoding="utf-8") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{a.pid}/status", encoding="utf-8") as f:
                    rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
            except (OSError, StopIteration):
                return 0
            # fields[0] is the state (field 3): utime and stime are fields 14 and 15.
            ticks = int(fields[11]) + int(fields[12])
            out.write(f"{now_us()} {rss} {ticks} {tick}\n")
            out.flush()
            time.sleep(a.interval)


def probe(a):
    try:
        if a.unix:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(1)
            s.connect(a.unix)
            c = http.client.HTTPConnection("localhost", timeout=1)
            c.sock = s
        else:
            u = a.url.split("/", 3)
            c = http.client.HTTPConnection(u[2], timeout=1)
        headers = dict(h.split(":", 1) for h in a.header)
        c.request("GET", a.path if a.unix else "/" + a.url.split("/", 3)[3], headers=headers)
        st = c.getresponse().status
        c.close()
        return st == 200
    except (OSError, http.client.HTTPException):
        return False


def ready(a):
    end = time.monotonic() + a.timeout
    down = None
    while time.monotonic() < end:
        ok = probe(a)
        t = now_us()
        if not ok and down is None:
            down = t
            print(f"down {t}", flush=True)
        elif ok and down is not None:
            print(f"up {t}", flush=True)
            return 0
        time.sleep(a.interval_ms / 1000)
    print("timeout", flush=True)
    return 3


def pidstart(a):
    # starttime counts clock ticks since boot (CLOCK_BOOTTIME); /proc/stat's btime is the boot
    # time in whole seconds, so btime + starttime was early by the boot time's fraction of a
    # second (0-1 s, the same for a whole boot). The boot is placed on the wall clock below.
    try:
        with open(f"/proc/{a.pid}/stat", encoding="utf-8") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    except OSError as e:
        print(f"cluster_stats: no process {a.pid}: {e}", file=sys.stderr)
        return 2
    since_boot_us = start_ticks * 1_000_000 // os.sysconf("SC_CLK_TCK")
    # The wall clock at boot: read between two boot-clock reads; again if they are far apart
    # (this process was preempted in between).
    for _ in range(10):
        b0 = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        wall = time.time_ns()
        b1 = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        if b1 - b0 < 100_000:
            break
    print((wall - (b0 + b1) // 2) // 1000 + since_boot_us)
    return 0


def loss(a):
    import json
    with open(a.stream, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.startswith("{")]
    row = next((r for r in rows if r["name"] == a.name), None)
    if row is None:
        print(f"cluster_stats: no target {a.name} in {a.stream}", file=sys.stderr)
        return 2
    pairs = list(zip(row["sends"], row["answered"]))
    if a.to == 0:
        print(f"answered {sum(ok for _, ok in pairs)} of {len(pairs)}")
        return 0
    win = [ok for t, ok in pairs if a.start <= t < a.to]
    base = [ok for t, ok in pairs if a.base_from <= t < a.start]
    print(f"{len(win)} {win.count(0)} {len(base)} {base.count(0)}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("hist")
    h.add_argument("before")
    h.add_argument("after")
    h.add_argument("name")
    s = sub.add_parser("sample")
    s.add_argument("pid", type=int)
    s.add_argument("interval", type=float)
    s.add_argument("out")
    r = sub.add_parser("ready")
    r.add_argument("--unix")
    r.add_argument("--path", default="/v1/healthz")
    r.add_argument("--url")
    r.add_argument("--header", action="append", default=[])
    r.add_argument("--timeout", type=float, required=True)
    r.add_argument("--interval-ms", type=float, default=5)
    p = sub.add_parser("pidstart")
    p.add_argument("pid", type=int)
    lo = sub.add_parser("loss")
    lo.add_argument("stream")
    lo.add_argument("name")
    lo.add_argument("start", type=int)
    lo.add_argument("to", type=int)
    lo.add_argument("base_from", type=int)
    a = ap.parse_args()
    if a.cmd == "ready" and not (a.unix or a.url):
        ap.error("ready needs --unix SOCK or --url URL")
    return {"hist": hist, "sample": sample, "ready": ready, "pidstart": pidstart, "loss": loss}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
