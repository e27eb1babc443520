#!/usr/bin/env python3
"""Summarises a run of the network-policy-api conformance suite from its `go test -json` stream.

    netpol-summary.py RESULTS_JSON

The stream is the test binary's -test.v=test2json output through `go tool test2json`
(scripts/cluster/netpol-conformance). The suite runs under TestConformanceProfiles: each of its
subtests is one conformance test (CNPAdminTierEgressTCP, ...), each of theirs one case.

Prints one line per test (PASS, FAIL, SKIP with the suite's reason) and under it one per case;
a failed case with where it failed (the test source line, the suite's error) and its last
failing probe. A case whose failing probe is SCTP and failed with "protocol not supported" (the
kernel has no SCTP: the client cannot even open its socket) is marked BLOCKED: it is counted as
failed, and listed as environment-blocked. Closes with
`netpol-conformance: N passed, M failed, K skipped` for the tests.

Exit status: 0 when no test failed, 1 when one did, 2 when the suite ran no test (its setup
failed, or the binary did not start): then the root test's error is printed instead.
"""

import json
import re
import sys

ROOT = "TestConformanceProfiles"
PROBE = re.compile(r"FAILED Command was \[(?P<cmd>[^\]]*)\]")
ERROR_AT = re.compile(r"Error Trace:\s*(?P<at>\S+)")
ERROR_MSG = re.compile(r"^\s*Error:\s*(?P<msg>.*)$")
SKIP_MSG = re.compile(r"Skipping (?P<name>\S+): (?P<why>.*)")
NO_SCTP = "protocol not supported"


class Case:
    def __init__(self, name):
        self.name = name
        self.action = None
        self.elapsed = 0.0
        self.output = []


def load(path):
    cases = {}
    order = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            name = ev.get("Test")
            if not name:
                continue
            c = cases.get(name)
            if c is None:
                c = cases[name] = Case(name)
                order.append(name)
            act = ev.get("Action")
            if act == "output":
                c.output.append(ev.get("Output", ""))
            elif act in ("pass", "fail", "skip"):
                c.action = act
                c.elapsed = ev.get("Elapsed", 0.0) or 0.0
    return cases, order


def pretty(name):
    return name.replace("_", " ")


def failure(case):
    """(where, message, last failing probe command, the probe's result line) of a failed case."""
    lines = "".join(case.output).splitlines()
    where = msg = cmd = result = ""
    trace = None  # the locations of the first Error Trace block
    for i, ln in enumerate(lines):
        m = PROBE.search(ln)
        if m:
            cmd = m.group("cmd")
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            result = re.sub(r"^\s*\S+\.go:\d+: ", "", nxt).strip()
            continue
        m = ERROR_AT.search(ln)
        if m:
            if trace is None:
                trace = [m.group("at")]
            continue
        m = ERROR_MSG.match(ln)
        if m:
            if not msg:
                msg = m.group("msg").strip()
                # testify puts the message's text on the next line ("Received unexpected error:").
                if msg.endswith(":") and i + 1 < len(lines):
                    msg += " " + lines[i + 1].strip()
            if trace is not None and not where:
                # The test's own line if the trace has one (the first is usually the helper's).
                where = next((t for t in trace if "/conformance/tests/" in t), trace[0])
            continue
        if trace is not None and not where and ln.strip():
            trace.append(ln.strip())
    if trace is not None and not where:
        where = trace[0]
    where = re.sub(r"^sigs\.k8s\.io/network-policy-api@[^/]+/conformance/", "", where)
    return where, msg, cmd, result


def blocked(case):
    _, _, cmd, result = failure(case)
    return "--protocol=sctp" in cmd and NO_SCTP in result


def main():
    cases, order = load(sys.argv[1])
    root = cases.get(ROOT)
    tests = [n for n in order if n.startswith(ROOT + "/") and n.count("/") == 1]
    ran = [n for n in tests if cases[n].action is not None]
    if root is None or not ran:
        print("netpol-conformance: the suite ran no test.")
        if root is not None:
            where, msg, _, _ = failure(root)
            text = "".join(root.output)
            m = re.search(r"Messages:\s*(.*)", text)
            print(f"  {ROOT}: {root.action or 'no result'} after {root.elapsed:.0f} s"
                  + (f" at {where}" if where else ""))
            if msg:
                print(f"  error: {msg}")
            if m:
                print(f"  {m.group(1).strip()}")
            fatal = [ln.strip() for ln in text.splitlines()
                     if re.search(r"\.go:\d+: (Error|error|unable|failed)", ln)]
            for ln in fatal[:5]:
                print(f"  {ln}")
        else:
            print("  no TestConformanceProfiles in the output (did the binary start? see conformance.log.gz)")
        sys.exit(2)

    npass = nfail = nskip = nblocked_tests = 0
    sub = {"pass": 0, "fail": 0, "skip": 0}
    sub_blocked = 0
    out = []
    for t in tests:
        tc = cases[t]
        short = t.split("/", 1)[1]
        subs = [n for n in order if n.startswith(t + "/") and n.count("/") == 2]
        if tc.action == "skip":
            nskip += 1
            why = next((m.group("why").strip() for m in map(SKIP_MSG.search, tc.output) if m), "skipped")
            out.append(f"SKIP    {short}: {why}")
            continue
        failed_subs = [s for s in subs if cases[s].action == "fail"]
        all_blocked = bool(failed_subs) and all(blocked(cases[s]) for s in failed_subs)
        if tc.action == "pass":
            npass += 1
            out.append(f"PASS    {short} ({tc.elapsed:.0f} s)")
        else:
            nfail += 1
            if all_blocked:
                nblocked_tests += 1
            tag = "BLOCKED" if all_blocked else "FAIL"
            out.append(f"{tag:7} {short} ({tc.elapsed:.0f} s)")
            if not subs:
                where, msg, _, _ = failure(tc)
                out.append(f"          {where}: {msg}" if where else f"          {msg or 'failed'}")
        for s in subs:
            sc = cases[s]
            label = pretty(s.split("/", 2)[2])
            if sc.action == "pass":
                sub["pass"] += 1
                out.append(f"  pass    {label} ({sc.elapsed:.0f} s)")
            elif sc.action == "skip":
                sub["skip"] += 1
                out.append(f"  skip    {label}")
            else:
                sub["fail"] += 1
                where, msg, cmd, result = failure(sc)
                if blocked(sc):
                    sub_blocked += 1
                    out.append(f"  BLOCKED {label} ({sc.elapsed:.0f} s)")
                    out.append(f"            no SCTP in this kernel: [{cmd}] -> {result}")
                else:
                    out.append(f"  FAIL    {label} ({sc.elapsed:.0f} s)")
                    out.append(f"            {where}: {msg}" if where else f"            {msg or sc.action or 'no result'}")
                    if cmd:
                        out.append(f"            last failing probe: [{cmd}] -> {result}")
    print("\n".join(out))
    print()
    print(f"subtests: {sub['pass']} passed, {sub['fail']} failed, {sub['skip']} skipped"
          + (f"; {sub_blocked} of the failed are environment-blocked (SCTP probes on a kernel"
             f" without SCTP), {nblocked_tests} of the failed tests fail on nothing else"
             if sub_blocked else ""))
    print(f"netpol-conformance: {npass} passed, {nfail} failed, {nskip} skipped")
    sys.exit(1 if nfail else 0)


if __name__ == "__main__":
    main()
