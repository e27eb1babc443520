#!/usr/bin/env bash
# The bounded part of the several-nodes tests that the README's test command runs:
# scripts/e2e/cluster.sh on a cluster of two nodes (its header says what runs). The whole
# upstream suite on several nodes is `scripts/cluster/up --nodes 2` then `scripts/cluster/e2e`
# and `scripts/cluster/netpol-conformance` (docs/KUBERNETES.md, "Several nodes").
exec bash "$(dirname "$0")/cluster.sh" --nodes 2
