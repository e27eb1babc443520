#!/usr/bin/env bash
# The benchmark suite at tiny sizes (scripts/bench/all --smoke): every part must still run and
# print its RESULT lines, and every scaling plot must come out as a PNG. Writes to a temp dir,
# never to docs/. Asserts nothing about speed. Prints `bench-smoke: N passed, M failed`.
# The plugin the tests built (dynamically linked): the static build of scripts/build-cni would
# compile the plugin's dependencies a second time for numbers nobody reads here.
export WEFT_CNI=${WEFT_CNI:-$(cd "$(dirname "$0")/../.." && pwd)/target/release/weft-cni}
exec bash "$(dirname "$0")/../bench/all" --smoke --no-setup
