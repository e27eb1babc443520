#!/usr/bin/env bash
# Builds weft-oracle (scripts/oracle/, a wrapper around cyclonus's policy matcher, pinned in
# go.mod/go.sum) with the ordinary `go` client and prints the binary's path. Caches live outside
# the work tree under /var/cache/weft-oracle (WEFT_ORACLE_CACHE): the module and build caches,
# and the binary keyed by a digest of the sources, go.mod, go.sum and the Go version, so a
# second run builds nothing. `build.sh test` runs the wrapper's own tests (go test) instead.
set -euo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
cache=${WEFT_ORACLE_CACHE:-/var/cache/weft-oracle}
export GOTOOLCHAIN=local
command -v go >/dev/null || { echo "build.sh: go is missing (Go 1.22 or newer; the machine image has it)" >&2; exit 1; }
export GOMODCACHE=$cache/gomod GOCACHE=$cache/gocache GOFLAGS="-mod=readonly -buildvcs=false -trimpath"
if [ "${1:-}" = test ]; then cd "$dir" && exec nice -n 10 go test ./...; fi
key=$( (cd "$dir" && cat go.mod go.sum ./*.go && go version) | sha256sum | cut -c1-16)
bin=$cache/bin/weft-oracle-$key
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
mkdir -p "$cache/bin"
exec 9>"$cache/build.lock"
flock 9
if [ ! -x "$bin" ]; then
  echo "build.sh: building weft-oracle ($key) into $cache" >&2
  (cd "$dir" && nice -n 10 go build -o "$bin.tmp" .) >&2
  mv "$bin.tmp" "$bin"
fi
echo "$bin"
