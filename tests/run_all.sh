#!/usr/bin/env bash
# Runs every test program (build/tests/test_*) and every shell test
# (tests/*.t.sh), then prints one closing line: "N passed, N failed".
BUILD=${1:-build}
export MPTC="$PWD/$BUILD/mptc"
# a kernel cache of this run's own, empty at the start: every test compiles
# its kernels (then may reuse them), whatever earlier runs left behind
MPTC_CACHE_DIR=$(mktemp -d /tmp/mptc-test-cache-XXXXXX)
export MPTC_CACHE_DIR
trap 'rm -rf "$MPTC_CACHE_DIR"' EXIT
pass=0; fail=0; failed=()
for t in "$BUILD"/tests/test_* tests/*.t.sh; do
  [ -e "$t" ] || continue
  case "$t" in *.d) continue;; esac
  name=$(basename "$t")
  start=$(date +%s)
  if [[ "$t" == *.sh ]]; then bash "$t" >"$BUILD/$name.log" 2>&1; else "$t" >"$BUILD/$name.log" 2>&1; fi
  rc=$?
  secs=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ]; then pass=$((pass+1)); echo "PASS $name (${secs}s)"
  elif [ $rc -eq 77 ]; then echo "SKIP $name: $(tail -n 1 "$BUILD/$name.log")"
  else fail=$((fail+1)); failed+=("$name"); echo "FAIL $name (${secs}s)"; tail -n 30 "$BUILD/$name.log" | sed 's/^/    /'; fi
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
