#!/usr/bin/env python3
"""Summarises the JUnit report of Kubernetes' e2e binary for the specs a focus selected.

    SKIP_REASON=... junit-summary.py JUNIT_XML FOCUS_REGEX

SKIP_REASON: why the run's --ginkgo.skip left tests out (shown for each of them).

Prints one line per spec (passed, failed with the first lines of its failure, skipped with the
reason the framework gave) and closes with `e2e: N passed, M failed, K skipped`. Ginkgo reports
every spec of the binary; those outside the focus are left out. A spec skipped because it needs
more nodes than the cluster has is listed as multi-node (never counted as passed).
"""

import os
import re
import sys
import xml.etree.ElementTree as ET

MULTI_NODE = re.compile(r"at least \d+ nodes|requires? (?:two|2|multiple|more than one) nodes|"
                        r"multi-?node|SkipUnlessNodeCountIsAtLeast", re.I)


def spec_name(tc):
    name = tc.get("name", "")
    return re.sub(r"^\[It\]\s*", "", name)


def main():
    path, focus = sys.argv[1], re.compile(sys.argv[2])
    root = ET.parse(path).getroot()
    passed, failed, skipped, multi = [], [], [], []
    for tc in root.iter("testcase"):
        name = spec_name(tc)
        if not focus.search(name):
            continue
        status = tc.get("status", "")
        fail = tc.find("failure")
        err = tc.find("error")
        skip = tc.find("skipped")
        secs = float(tc.get("time", "0") or 0)
        if fail is not None or err is not None or status in ("failed", "panicked", "timedout",
                                                               "interrupted", "aborted"):
            node = fail if fail is not None else err
            text = (node.text or node.get("message", "") if node is not None else status).strip()
            failed.append((name, secs, text))
        elif skip is not None or status in ("skipped", "pending"):
            reason = (skip.get("message", "") if skip is not None else status).strip()
            reason = re.sub(r"^skipped\s*-?\s*", "", reason) or "skipped (no reason given)"
            # Ginkgo lists specs filtered out by --ginkgo.skip as skipped with no message.
            if reason == "skipped (no reason given)" and secs == 0:
                reason = "not run: " + (os.environ.get("SKIP_REASON") or "left out by the run's --skip")
            (multi if MULTI_NODE.search(reason) else skipped).append((name, reason))
        else:
            passed.append((name, secs))

    for name, secs in sorted(passed):
        print(f"PASS {name} ({secs:.0f} s)")
    for name, secs, text in sorted(failed):
        print(f"FAIL {name} ({secs:.0f} s)")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        for ln in lines[:6]:
            print(f"       {ln[:200]}")
    for name, reason in sorted(skipped):
        print(f"SKIP {name}: {reason}")
    for name, reason in sorted(multi):
        print(f"MULTI-NODE {name}: {reason}")
    print(f"e2e: {len(passed)} passed, {len(failed)} failed, {len(skipped) + len(multi)} skipped"
          + (f" ({len(multi)} of them multi-node)" if multi else ""))


if __name__ == "__main__":
    main()
