#!/usr/bin/env bash
# The benchmark report (scripts/bench/report.py) on made-up results files: the targets table
# from one clean run, the refusal of several runs, commits, a tree with changes or no run, and the
# notice that replaces refused results. No benchmark runs; seconds. Prints
# `bench-report: N passed, M failed`.
exec python3 "$(dirname "$0")/../bench/report_test.py"
