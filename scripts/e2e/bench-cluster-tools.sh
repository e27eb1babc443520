#!/usr/bin/env bash
# The real cluster benchmark's measuring tools (scripts/bench/cluster_stats.py, cluster_probe.py)
# on loopback: a process's start time on the wall clock, a histogram's quantiles, and the
# prober's first answers against targets opened at a fixed rate. No cluster; seconds. Prints
# `bench-cluster-tools: N passed, M failed`.
exec python3 "$(dirname "$0")/../bench/cluster_tools_test.py"
