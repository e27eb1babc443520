#!/usr/bin/env bash
# The oracle must catch a broken rule in Weft's policy engine that Weft's own checks cannot see.
#
#   bash scripts/oracle/mutation.sh [MUTATION] [oracle.sh arguments...]
#
# The default cases (--seed 50 --case 1 and --seed 56 --case 2) have a port range ending on a
# served port and pass with the production build; the script runs them with both builds.
#
# MUTATION names a patch in scripts/oracle/mutations/ (default endport-exclusive: a port range's
# last port is left out). The patch is applied to a copy of the work tree's tracked files under
# /var/cache/weft-oracle/mutant-MUTATION/ (never to the work tree), whose weft-manager is built
# there in its own target dir; the production build has no trace of it. Then
# scripts/oracle/run.sh runs with that manager (and the work tree's weft-cni, weftctl and
# weft-k8s-replay). The mutation is caught when the oracle reports mismatches while
# `weftctl map verify` (run by the driver after every step) finds the maps consistent: the
# engine and its own check agree with each other and both are wrong.
#
# Prints "mutation: 1 passed, 0 failed" when caught that way.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MUT=${1:-endport-exclusive}
[ $# -gt 0 ] && shift
PATCH=$ROOT/scripts/oracle/mutations/$MUT.patch
[ -f "$PATCH" ] || { echo "mutation.sh: no patch $PATCH (see scripts/oracle/mutations/)" >&2; exit 2; }
BIN=${WEFT_BIN:-$ROOT/target/release}
for b in weft-cni weftctl weft-k8s-replay; do
  [ -x "$BIN/$b" ] || { echo "mutation.sh: $BIN/$b is missing: build as scripts/test does" >&2; exit 2; }
done
DIR=${WEFT_ORACLE_CACHE:-/var/cache/weft-oracle}/mutant-$MUT
mkdir -p "$DIR/src" "$DIR/bin"

# The copy: tracked files with their mtimes (cargo rebuilds only what changed since last time),
# refreshed when the work tree or the patch changed.
stamp=$( (cd "$ROOT" && git ls-files -s && git diff && cat "$PATCH") | sha256sum | cut -c1-16)
if [ "$(cat "$DIR/stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$DIR/src.new" && mkdir -p "$DIR/src.new"
  (cd "$ROOT" && git ls-files -z | tar --null -T - -cf -) | tar -C "$DIR/src.new" -xf - || exit 1
  (cd "$DIR/src.new" && patch -p1 --quiet <"$PATCH") || { echo "mutation.sh: $MUT.patch no longer applies to this tree: update it" >&2; exit 1; }
  # Keep the mtimes of unchanged files: replace file by file only where content differs.
  (cd "$DIR/src.new" && find . -type f) | while read -r f; do
    cmp -s "$DIR/src.new/$f" "$DIR/src/$f" 2>/dev/null || { mkdir -p "$(dirname "$DIR/src/$f")"; cp -p "$DIR/src.new/$f" "$DIR/src/$f"; }
  done
  # And drop what the tree no longer tracks (a module moved to a folder would be found twice).
  (cd "$DIR/src" && find . -type f) | while read -r f; do
    [ -e "$DIR/src.new/$f" ] || rm -f "$DIR/src/$f"
  done
  rm -rf "$DIR/src.new"
  echo "$stamp" >"$DIR/stamp"
fi
echo "== building the mutant weft-manager ($MUT) in $DIR/target"
(cd "$DIR/src" && CARGO_TARGET_DIR=$DIR/target nice -n 10 cargo build --release -p weft-manager --bin weft-manager 2>&1 | tail -3) || exit 1
[ -x "$DIR/target/release/weft-manager" ] || { echo "mutation.sh: the mutant build produced no weft-manager" >&2; exit 1; }
ln -sf "$DIR/target/release/weft-manager" "$DIR/bin/weft-manager"
for b in weft-cni weftctl weft-k8s-replay; do ln -sf "$BIN/$b" "$DIR/bin/$b"; done

runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=("--seed 50 --case 1" "--seed 56 --case 2")
[ $# -gt 0 ] && runs=("$*")
base_failed=0 out=
for r in "${runs[@]}"; do
  echo "== scripts/oracle/run.sh $r with the production manager ($BIN)"
  # shellcheck disable=SC2086
  b=$(WEFT_BIN=$BIN bash "$ROOT/scripts/oracle/run.sh" $r 2>&1)
  grep -E '^  (ok|FAIL) |^oracle:' <<<"$b"
  grep -q '^oracle: [0-9]* passed, 0 failed$' <<<"$b" || base_failed=1
  echo "== scripts/oracle/run.sh $r with the mutant manager"
  # shellcheck disable=SC2086
  m=$(WEFT_BIN=$DIR/bin bash "$ROOT/scripts/oracle/run.sh" $r 2>&1)
  grep -v '^20[0-9][0-9]-' <<<"$m"
  out+=$m$'\n'
done
mismatches=$(grep -c '^    MISMATCH' <<<"$out")
verify_bad=$(grep -c 'map verify: FAILED' <<<"$out")
verify_ok=$(grep -c 'map verify: consistent' <<<"$out")
echo "mismatches found by the oracle: $mismatches; steps where map verify found the maps consistent: $verify_ok, inconsistent: $verify_bad"
if [ "$base_failed" = 1 ]; then
  echo "  FAIL the production build does not pass these cases: they cannot show the mutation (pick others)"
  echo "mutation: 0 passed, 1 failed"
  exit 1
fi
if [ "$mismatches" -gt 0 ] && [ "$verify_ok" -gt 0 ] && [ "$verify_bad" = 0 ]; then
  echo "mutation: 1 passed, 0 failed"
else
  echo "  FAIL the mutation $MUT was not caught by the oracle alone (mismatches $mismatches, map verify failures $verify_bad)"
  echo "mutation: 0 passed, 1 failed"
  exit 1
fi
