#!/usr/bin/env python3
"""Tests of scripts/bench-cluster's measuring tools through their command lines, as the harness
runs them: cluster_stats.py's process start time (pidstart) against the clock read when the
process was started, and its histogram quantiles (hist) from two scrapes; cluster_probe.py's
first answered requests against targets that start answering at a fixed rate (no fixed phase),
and with each flow named to it just before it opens (probed every hot interval).
Loopback only, no cluster; seconds. Prints `bench-cluster-tools: N passed, M failed`.
Usage: python3 scripts/bench/cluster_tools_test.py
"""

import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
STATS = os.path.join(HERE, "cluster_stats.py")
PROBE = os.path.join(HERE, "cluster_probe.py")


def stats(*args):
    p = subprocess.run([sys.executable, STATS, *args], capture_output=True, text=True, check=False)
    return p.returncode, p.stdout, p.stderr


def scrape(counts, total):
    """A Prometheus text scrape of the histogram `d` with buckets 1, 5, 10 ms (in seconds)."""
    lines = [f'd_bucket{{le="{le}"}} {c}' for le, c in zip(("0.001", "0.005", "0.01", "+Inf"), counts)]
    return "\n".join(["# TYPE d histogram", *lines, f"d_count {total}", "d_sum 0"]) + "\n"


class Stats(unittest.TestCase):
    def test_pidstart_is_the_processs_start_on_the_wall_clock(self):
        # Clock ticks are 10 ms (CLK_TCK 100): the start is within a tick or two of the clock
        # read just before the fork, never seconds away (btime's whole seconds gave up to 1 s).
        for _ in range(3):
            before = time.time_ns() // 1000
            child = subprocess.Popen(["sleep", "5"])
            after = time.time_ns() // 1000
            try:
                rc, out, err = stats("pidstart", str(child.pid))
            finally:
                child.kill()
                child.wait()
            self.assertEqual(rc, 0, err)
            start = int(out)
            self.assertGreaterEqual(start, before - 20_000, f"{start} is {(before - start) / 1000} ms before the fork")
            self.assertLessEqual(start, after + 20_000, f"{start} is {(start - after) / 1000} ms after the fork")

    def test_pidstart_of_no_process_fails(self):
        rc, _, err = stats("pidstart", "999999999")
        self.assertNotEqual(rc, 0)
        self.assertIn("999999999", err)

    def test_hist_gives_the_quantiles_of_what_was_observed_between_the_scrapes(self):
        with tempfile.TemporaryDirectory() as d:
            b, a = os.path.join(d, "before"), os.path.join(d, "after")
            with open(b, "w", encoding="utf-8") as f:
                f.write(scrape((10, 10, 10, 10), 10))
            # 100 more observations: 50 in (1, 5] ms, 49 in (5, 10], 1 above 10.
            with open(a, "w", encoding="utf-8") as f:
                f.write(scrape((10, 60, 109, 110), 110))
            rc, out, err = stats("hist", b, a, "d")
            self.assertEqual(rc, 0, err)
            count, p50, p99 = out.split()
            self.assertEqual(count, "100")
            self.assertAlmostEqual(float(p50), 5.0, places=3)
            self.assertAlmostEqual(float(p99), 10.0, places=3)
            # Nothing observed between two equal scrapes.
            rc, out, err = stats("hist", b, b, "d")
            self.assertEqual((rc, out.split()), (0, ["0", "-", "-"]), err)


def loopback_targets(n):
    """n UDP sockets on 127.0.0.2.. sharing one free port: (sockets, port)."""
    socks, port = [], 0
    for k in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((f"127.0.0.{k + 2}", port))  # the first takes a free port, the others the same
        port = s.getsockname()[1]
        s.setblocking(False)
        socks.append(s)
    return socks, port


def answer_from(socks, opened, until, on_tick=None):
    """Echoes each request to target k once the clock reaches opened[k] (µs); drops it before.
    on_tick() runs every ~1 ms. Returns the set of targets that answered."""
    index = {s: k for k, s in enumerate(socks)}
    answered = set()
    while len(answered) < len(socks) and not until():
        ready, _, _ = select.select(socks, [], [], 0.001)
        if on_tick:
            on_tick()
        for s in ready:
            k = index[s]
            while True:
                try:
                    data, peer = s.recvfrom(256)
                except BlockingIOError:
                    break
                if time.time_ns() // 1000 >= opened[k]:
                    s.sendto(data.split(b" ", 1)[1], peer)
                    answered.add(k)
    return answered


class Probe(unittest.TestCase):
    def test_a_named_flow_is_probed_every_hot_interval(self):
        # The policy creator names each flow to the prober just before its create request
        # (--hot-socket); enforcement follows a few ms later. The named flow is then sent to
        # every 1 ms, so its first answer comes ~1 ms after it opens, not a round's 40 ms (half
        # of it on average). A prober that ignored the names waits 20 ms at the median.
        n, interval_ms, step, lead = 20, 40, 0.1, 5_000
        socks, port = loopback_targets(n)
        with tempfile.TemporaryDirectory() as d:
            targets, hot = os.path.join(d, "targets"), os.path.join(d, "hot")
            with open(targets, "w", encoding="utf-8") as f:
                f.writelines(f"t{k} 127.0.0.{k + 2}\n" for k in range(n))
            prober = subprocess.Popen(
                [sys.executable, PROBE, "first", targets, str(port), "--interval-ms", str(interval_ms),
                 "--hot-socket", hot, "--hot-ms", "1", "--timeout", "30"], stdout=subprocess.PIPE, text=True)
            namer = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                self.assertEqual(prober.stdout.readline().strip(), "ready")
                t0 = time.time_ns() // 1000 + 50_000
                opened = [t0 + int(k * step * 1e6) for k in range(n)]
                named = []

                def name_due():
                    k = len(named)
                    if k < n and time.time_ns() // 1000 >= opened[k] - lead:
                        namer.sendto(f"t{k}".encode(), hot)
                        named.append(k)
                end = time.monotonic() + 20
                answer_from(socks, opened, lambda: time.monotonic() >= end, name_due)
                out, _ = prober.communicate(timeout=30)
            finally:
                prober.kill()
                namer.close()
                for s in socks:
                    s.close()
            self.assertFalse(os.path.exists(hot), "the prober left its hot socket behind")
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        self.assertEqual(len(rows), n, out)
        self.assertTrue(all(r["hot"] for r in rows), f"a named target has no hot time: {out}")
        waits = sorted((r["first"] - opened[int(r["name"][1:])]) / 1000 for r in rows if r["first"])
        self.assertEqual(len(waits), n, f"targets never answered: {out}")
        self.assertLess(waits[n // 2], interval_ms / 4,
                        f"named flows waited for the rounds, not the hot interval: {waits}")

    def test_first_probes_keep_no_fixed_phase_against_a_fixed_rate_load(self):
        # Targets 127.0.0.K (loopback) start answering one after another every 100 ms, as the
        # bench's allow policies are created at 10/s. With rounds every 10 ms at a fixed
        # cadence, each target's first answered request came the same time after it started
        # answering (one phase for the whole run: 13.3 ms for every flow in one run); with the
        # rounds' intervals drawn at random, those waits spread over the interval.
        n, interval_ms, step = 30, 10, 0.1
        socks, port = loopback_targets(n)
        with tempfile.TemporaryDirectory() as d:
            targets = os.path.join(d, "targets")
            with open(targets, "w", encoding="utf-8") as f:
                f.writelines(f"t{k} 127.0.0.{k + 2}\n" for k in range(n))
            prober = subprocess.Popen(
                [sys.executable, PROBE, "first", targets, str(port), "--interval-ms", str(interval_ms),
                 "--timeout", "30"], stdout=subprocess.PIPE, text=True)
            try:
                self.assertEqual(prober.stdout.readline().strip(), "ready")
                # Half an interval off the first round (printed just after it went out): a
                # fixed cadence would then meet every target mid-interval, never near an edge.
                t0 = time.time_ns() // 1000 + 50_000 + interval_ms * 500
                opened = [t0 + int(k * step * 1e6) for k in range(n)]
                end = time.monotonic() + 20
                answer_from(socks, opened, lambda: time.monotonic() >= end)
                out, _ = prober.communicate(timeout=30)
            finally:
                prober.kill()
                for s in socks:
                    s.close()
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        self.assertEqual(len(rows), n, out)
        waits = sorted((r["first"] - opened[int(r["name"][1:])]) / 1000 for r in rows if r["first"])
        self.assertEqual(len(waits), n, f"targets never answered: {out}")
        self.assertGreaterEqual(waits[-1] - waits[0], 0.4 * interval_ms,
                                f"every flow waited about the same for its first probe: {waits}")


if __name__ == "__main__":
    suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(c) for c in (Stats, Probe))
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    failed = len(result.failures) + len(result.errors)
    print(f"bench-cluster-tools: {result.testsRun - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
