#!/usr/bin/env python3
"""Runs oracle cases against a running Weft (scripts/oracle/run.sh sets up the world first).

For each case: its policy sets are pushed step by step through weft-k8s-replay's watch (ADDED,
MODIFIED, DELETED events, as an API server sends them), every cell of the matrix is probed with
real packets, and each cell's outcome is compared with weft-oracle's verdict. Then the policies
are deleted and a control round probes every cell again: with no policy in force every probe
must be answered (the positive control for the servers and paths the policy round found
silent).

A probe that timed out counts as a policy drop only when the datapath reported a policy drop of
that very packet (`weftctl monitor`: same addresses, ports and protocol); otherwise it is probed
again once, and if it stays silent without a drop event it is a tool error, not a verdict.

Runs in the node's network namespace (the replay server listens there). Prints one line per
mismatch with the command that replays its case, and a closing "cases: N passed, M failed".
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_NUM = {"TCP": 6, "UDP": 17, "SCTP": 132}


class ToolError(Exception):
    pass


class Weft:
    def __init__(self, a):
        self.a = a
        self.rv = 1000
        self.sync = 0
        self.live = {}  # "ns/name" -> policy object as pushed

    def ctl(self, *args):
        r = subprocess.run([self.a.weftctl, "--socket", self.a.socket, "-o", "json", *args],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise ToolError(f"weftctl {' '.join(args)}: {r.stderr.strip()}")
        return json.loads(r.stdout) if r.stdout.strip() else None

    def push(self, etype, obj):
        path = "/apis/networking.k8s.io/v1/networkpolicies"
        body = json.dumps({"type": etype, "object": obj}).encode()
        url = f"{self.a.url}/replay/push?path={path}"
        last = None
        for _ in range(100):
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=5):
                    return
            except OSError as e:  # the watcher may be reconnecting
                last = e
                time.sleep(0.1)
        raise ToolError(f"push {etype} {obj['metadata']['name']}: {last}")

    def stamp(self, np, generation):
        self.rv += 1
        obj = json.loads(json.dumps(np))
        m = obj.setdefault("metadata", {})
        m.update({"uid": f"uid-np-{m['namespace']}-{m['name']}", "resourceVersion": str(self.rv),
                  "generation": generation, "creationTimestamp": "2024-01-01T00:00:00Z"})
        obj["apiVersion"], obj["kind"] = "networking.k8s.io/v1", "NetworkPolicy"
        return obj

    def set_policies(self, policies):
        """Make the cluster's policy set `policies` (diffed against what is live), then wait
        until Weft has processed every event and every endpoint enforces the result."""
        want = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in policies}
        for key, old in list(self.live.items()):
            if key not in want:
                self.push("DELETED", self.stamp(old, old["metadata"]["generation"]))
                del self.live[key]
        for key, p in want.items():
            old = self.live.get(key)
            if old is None:
                self.live[key] = self.stamp(p, 1)
                self.push("ADDED", self.live[key])
            elif json.dumps(old["spec"], sort_keys=True) != json.dumps(p["spec"], sort_keys=True):
                self.live[key] = self.stamp(p, old["metadata"]["generation"] + 1)
                self.push("MODIFIED", self.live[key])
        return self.settle()

    def settle(self):
        """A sync marker (a policy selecting no pod: `oracle-sync` is no pod's label) goes after
        the case's events; the watch handles events in order, so once the marker is in the
        repository every earlier event has been applied. Then every ready endpoint must enforce
        the repository's revision."""
        self.sync += 1
        name = f"oracle-sync-{self.sync}"
        marker = {"metadata": {"name": name, "namespace": "x"},
                  "spec": {"podSelector": {"matchLabels": {"oracle-sync": "none"}}, "policyTypes": ["Ingress"]}}
        self.push("ADDED", self.stamp(marker, 1))
        if self.sync > 1:
            old = {"metadata": {"name": f"oracle-sync-{self.sync - 1}", "namespace": "x"}, "spec": marker["spec"]}
            self.push("DELETED", self.stamp(old, 1))
        deadline = time.time() + 30
        while True:
            listing = self.ctl("policy", "list")
            names = json.dumps(listing["rules"])
            # Rule labels are strings: "k8s:io.cilium.k8s.policy.name=NAME".
            if f'policy.name={name}"' in names and f'policy.name=oracle-sync-{self.sync - 1}"' not in names:
                break
            if time.time() > deadline:
                raise ToolError(f"the sync marker {name} did not reach the repository in 30 s")
            time.sleep(0.05)
        while True:
            rev = self.ctl("status")["policy_revision"]
            behind = [e for e in self.ctl("endpoint", "list")
                      if e.get("state") == "ready" and e.get("policy_revision", 0) < rev]
            if not behind:
                return listing
            if time.time() > deadline:
                raise ToolError(f"{len(behind)} endpoints still below revision {rev} after 30 s")
            time.sleep(0.05)

    def verify(self):
        """`weftctl map verify`: the kernel maps against the engine's own from-scratch
        computation (Weft's check of itself, beside the oracle)."""
        r = subprocess.run([self.a.weftctl, "--socket", self.a.socket, "map", "verify"], capture_output=True, text=True)
        return r.returncode == 0, (r.stdout + r.stderr).strip()

    def trace(self, cell):
        try:
            t = self.ctl("policy", "trace", "--src", cell["src_ip"], "--dst", cell["dst_ip"],
                         "--dport", str(cell["port"]), "--proto", cell["protocol"].lower())
        except ToolError as e:
            return f"trace failed: {e}"
        return t.get("verdict", "?")


class Events:
    """`weftctl monitor -o json` lines, read as the file grows."""

    def __init__(self, path):
        self.path, self.pos = path, 0
        self.drops = set()

    def read(self):
        with open(self.path) as f:
            f.seek(self.pos)
            data = f.read()
        end = data.rfind("\n") + 1
        self.pos += len(data[:end].encode())
        for line in data[:end].splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if str(e.get("reason", "")).startswith("policy"):
                proto = e.get("proto")
                self.drops.add((e["src_ip"], int(e["src_port"]), e["dst_ip"], int(e["dst_port"]),
                                PROTO_NUM.get(proto, proto) if isinstance(proto, str) else proto))

    def dropped(self, probe, src_ip):
        self.read()
        return (src_ip, probe["sport"], probe["dst_ip"], probe["port"], PROTO_NUM[probe["protocol"]]) in self.drops


class Ports:
    """Source ports: each round a fresh block per source pod (a probe of a later round never
    meets a conntrack entry of an earlier one by accident), except where a case reuses a
    control round's closed TCP connections on purpose."""

    def __init__(self):
        self.round = 0

    def block(self):
        base = 10000 + (self.round % 780) * 64
        self.round += 1
        return base


def probe_round(a, world, cells, ports, events, reuse=None, timeout=2.5):
    """Probes every cell once (from each source pod at once); returns {cell_index: result}
    where result has status ok|drop|silent|refused|error, the reply, and the sport used."""
    by_src = {}
    base = ports.block()
    counters = {}
    for i, c in enumerate(cells):
        n = counters.get(c["src"], 0)
        counters[c["src"]] = n + 1
        sport = base + n
        if reuse is not None and c["protocol"] == "TCP" and i in reuse:
            sport = reuse[i]["sport"]
        by_src.setdefault(c["src"], []).append({
            "key": i, "dst_ip": c["dst_ip"], "port": c["port"], "protocol": c["protocol"],
            "sport": sport, "expect": c["dst"]})
    procs = {}
    with tempfile.TemporaryDirectory(prefix="oracle-round-") as tmp:
        for src, probes in by_src.items():
            plan = os.path.join(tmp, src.replace("/", "-") + ".json")
            with open(plan, "w") as f:
                json.dump({"timeout": timeout, "probes": probes}, f)
            ns = f"{a.prefix}-{src.replace('/', '-')}"
            procs[src] = subprocess.Popen(["ip", "netns", "exec", ns, "python3", os.path.join(HERE, "netprobe.py"), "probe", plan],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        results = {}
        for src, p in procs.items():
            out, err = p.communicate()
            if p.returncode != 0:
                raise ToolError(f"prober in {src} failed: {err.strip()[-300:]}")
            for r in json.loads(out):
                results[r["key"]] = r
    src_ip = {f"{p['namespace']}/{p['name']}": p["ip"] for p in world["pods"]}
    plans = {p["key"]: p for probes in by_src.values() for p in probes}
    time.sleep(0.2)  # the last drop events reach the monitor
    for k, r in results.items():
        r["sport"] = plans[k]["sport"]
        if r["status"] == "timeout":
            r["status"] = "drop" if events.dropped(plans[k], src_ip[cells[k]["src"]]) else "silent"
    return results


def reprobe_silent(a, world, cells, results, ports, events):
    """Cells that timed out with no drop event: once more, alone, with a longer timeout."""
    silent = [k for k, r in results.items() if r["status"] == "silent"]
    if not silent:
        return
    sub = [cells[k] for k in silent]
    again = probe_round(a, world, sub, ports, events, timeout=5)
    for j, k in enumerate(silent):
        results[k] = dict(again[j], retried=True)


def describe(cell):
    name = f" ({cell['port_name']})" if cell.get("port_name") else ""
    return f"{cell['src']} -> {cell['dst']} {cell['protocol']}/{cell['port']}{name}"


def run_case(a, weft, world, case, verdicts, ports, events, state, out):
    """Returns (mismatches, tool_errors, cells_compared)."""
    mismatches, tool_errors, compared = [], [], 0
    for si, step in enumerate(case["steps"]):
        listing = weft.set_policies(step["policies"])
        rejected = [f"{r.get('object')}: {r.get('error')}" for r in listing.get("rejected") or []]
        cells = verdicts["steps"][si]["cells"]
        reuse = state.get("control") if si == 0 and case.get("reuse_tcp_ports") else None
        results = probe_round(a, world, cells, ports, events, reuse=reuse)
        reprobe_silent(a, world, cells, results, ports, events)
        for k, cell in enumerate(cells):
            r = results[k]
            compared += 1
            if r["status"] not in ("ok", "drop"):
                tool_errors.append(f"step {si} {describe(cell)}: {r['status']} {r.get('reply', '')}".rstrip()
                                   + (" (no policy drop event for it, so no verdict)" if r["status"] == "silent" else ""))
                continue
            weft_allows = r["status"] == "ok"
            if weft_allows != cell["allowed"]:
                oracle = "allow" if cell["allowed"] else \
                    "deny (" + ", ".join(d for d, ok in (("ingress", cell["ingress"]), ("egress", cell["egress"])) if not ok) + ")"
                got = "allow (answered)" if weft_allows else "deny (policy drop event)"
                reused = " [TCP source port reused from a closed connection]" if reuse and cell["protocol"] == "TCP" else ""
                mismatches.append(f"step {si} ({step['description']}): {describe(cell)}: oracle {oracle}, "
                                  f"weft {got}, policy trace: {weft.trace(cell)}{reused}")
        if rejected:
            out.append(f"    weft rejected at step {si}: " + "; ".join(rejected))
        ok, text = weft.verify()
        if ok:
            out.append(f"    step {si}: map verify: consistent")
        else:
            path = os.path.join(a.workdir, f"verify-{case['id'].replace(' ', '-')}-step-{si}.txt")
            with open(path, "w") as f:
                f.write(text + "\n")
            out.append(f"    step {si}: map verify: FAILED (its whole output: {path})")
            mismatches.append(f"step {si}: map verify found the maps inconsistent: {text[-400:]}")
    # Positive control: nothing in force, every cell answered.
    weft.set_policies([])
    cells = verdicts["steps"][0]["cells"]
    results = probe_round(a, world, cells, ports, events)
    reprobe_silent(a, world, cells, results, ports, events)
    for k, cell in enumerate(cells):
        if results[k]["status"] != "ok":
            tool_errors.append(f"control (no policy): {describe(cell)}: {results[k]['status']} {results[k].get('reply', '')}".rstrip())
    state["control"] = results
    return mismatches, tool_errors, compared


def main():
    ap = argparse.ArgumentParser()
    for flag in ("world", "oracle", "weftctl", "socket", "url", "prefix", "events", "workdir", "replay"):
        ap.add_argument("--" + flag, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--cases", required=True, help="case numbers, e.g. '0 1 2'")
    ap.add_argument("--corpus", action="store_true", help="cases from cyclonus's generator")
    a = ap.parse_args()
    with open(a.world) as f:
        world = json.load(f)
    weft = Weft(a)
    events = Events(a.events)
    ports = Ports()
    state = {}
    passed = failed = 0
    totals = {"cells": 0, "mismatches": 0, "tool_errors": 0}

    # The first control round: before any policy, every cell is answered.
    weft.settle()
    first = json.loads(subprocess.run([a.oracle, "judge", "--world", a.world, "--case-file", "/dev/stdin"],
                                      input=json.dumps({"id": "no policy", "steps": [{"description": "none", "policies": []}]}),
                                      capture_output=True, text=True, check=True).stdout)["steps"][0]["cells"]
    results = probe_round(a, world, first, ports, events)
    reprobe_silent(a, world, first, results, ports, events)
    bad = [f"{describe(first[k])}: {r['status']} {r.get('reply', '')}" for k, r in results.items() if r["status"] != "ok"]
    if bad or any(not c["allowed"] for c in first):
        print("  FAIL control before any policy: not every cell answered:")
        for b in bad[:20]:
            print("       " + b)
        print(f"cases: 0 passed, {len(a.cases.split())} failed")
        return 1
    print(f"  ok   control: all {len(first)} cells answered before any policy (TCP, UDP, SCTP)")
    state["control"] = results

    case_list = a.cases.split()
    if a.corpus and a.cases == "all":
        listing = json.loads(subprocess.run([a.oracle, "corpus", "--world", a.world], capture_output=True, text=True, check=True).stdout)
        case_list = [str(i) for i in range(len(listing["cases"]))]
        print(f"  cyclonus's generator: {len(case_list)} cases; left out ({len(listing['skipped'])}): " + "; ".join(listing["skipped"]))
    for k in case_list:
        case_file = os.path.join(a.workdir, f"case-{k}.json")
        gen = [a.oracle, "corpus", "--world", a.world, "--case", k] if a.corpus else \
            [a.oracle, "case", "--world", a.world, "--seed", str(a.seed), "--case", k]
        r = subprocess.run(gen, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"  FAIL case {k}: the generator failed: {r.stderr.strip()}")
            failed += 1
            continue
        with open(case_file, "w") as f:
            f.write(r.stdout)
        case = json.loads(r.stdout)
        r = subprocess.run([a.oracle, "judge", "--world", a.world, "--case-file", case_file], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"  FAIL {case['id']}: the oracle failed: {r.stderr.strip()}")
            failed += 1
            continue
        verdicts = json.loads(r.stdout)
        notes = []
        t0 = time.time()
        try:
            mismatches, tool_errors, compared = run_case(a, weft, world, case, verdicts, ports, events, state, notes)
        except ToolError as e:
            mismatches, tool_errors, compared = [], [str(e)], 0
        totals["cells"] += compared
        totals["mismatches"] += len(mismatches)
        totals["tool_errors"] += len(tool_errors)
        steps = len(case["steps"])
        what = f"{case['id']} ({case['description']}; {steps} step{'s' if steps > 1 else ''}, {compared} cells, {time.time() - t0:.1f} s)"
        if not mismatches and not tool_errors:
            passed += 1
            print(f"  ok   {what}")
            continue
        failed += 1
        print(f"  FAIL {what}: {len(mismatches)} mismatches, {len(tool_errors)} tool errors")
        for line in notes:
            print(line)
        engine = sum(1 for m in mismatches if "policy trace: " + ("deny" if "weft deny" in m else "allow") in m)
        datapath = sum(1 for m in mismatches if "policy trace: " + ("allow" if "weft deny" in m else "deny") in m)
        if mismatches:
            print(f"    of the mismatches: {engine} where policy trace agrees with the datapath (the engine's answer: "
                  f"map verify cannot see these), {datapath} where trace gives the oracle's answer (the datapath disagrees "
                  f"with its own engine)")
        for m in mismatches[:a_limit()]:
            print(f"    MISMATCH {m}")
        if len(mismatches) > a_limit():
            print(f"    ... and {len(mismatches) - a_limit()} more mismatches")
        for t in tool_errors[:10]:
            print(f"    TOOL ERROR {t}")
        if len(tool_errors) > 10:
            print(f"    ... and {len(tool_errors) - 10} more tool errors")
        print(f"    case file: {case_file} (WEFT_ORACLE_KEEP=DIR keeps it with the world and manager log)")
        print(f"    replay: {a.replay} {'--corpus' if a.corpus else '--seed ' + str(a.seed)} --case {k}")
    print(f"  cells compared: {totals['cells']}, mismatches: {totals['mismatches']}, tool errors: {totals['tool_errors']}")
    print(f"cases: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def a_limit():
    return int(os.environ.get("WEFT_ORACLE_SHOW", "25"))


if __name__ == "__main__":
    sys.exit(main())
