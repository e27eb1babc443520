#!/usr/bin/env bash
# The independent NetworkPolicy oracle's default run (docs/ORACLE.md): fixed seeds and the
# regression cases of scripts/oracle/run.sh, every cell probed with real packets and compared
# with cyclonus's matcher. Prints "oracle: N passed, M failed".
exec bash "$(dirname "$0")/../oracle/run.sh" "$@"
