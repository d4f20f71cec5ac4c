#!/usr/bin/env bash
# Runs every test program (build/tests/test_*) and every shell test
# (tests/*.t.sh), then prints one closing line: "N passed, N failed".
# MPTC_TEST_JOBS=N runs up to N of them at once (default: the online cores,
# at most 4; most tests keep one core busy for much of their time, NVRTC and
# g++ waits included, so two at once on 2 cores take the suite from about 16
# to about 9 minutes; 1 runs them one by one); the results are printed in
# the same order either way. A test whose file says MPTC_TEST_SERIAL
# (bench.t.sh: its profile measures the machine's ceilings on every core)
# runs after the others, alone.
BUILD=${1:-build}
cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
[ "$cores" -gt 4 ] 2>/dev/null && cores=4
JOBS=${MPTC_TEST_JOBS:-$cores}
case "$JOBS" in ''|*[!0-9]*|0) echo "run_all: MPTC_TEST_JOBS is a positive whole number, not '$JOBS'" >&2; exit 2;; esac
# a test that hangs is stopped (and reported) rather than holding up the
# run: TIMEOUT seconds each (the slowest takes about 3 minutes on 2 cores),
# then SIGKILL 10 seconds after the SIGTERM
TIMEOUT=${MPTC_TEST_TIMEOUT:-1200}
case "$TIMEOUT" in ''|*[!0-9]*|0) echo "run_all: MPTC_TEST_TIMEOUT is a positive whole number of seconds, not '$TIMEOUT'" >&2; exit 2;; esac
export MPTC="$PWD/$BUILD/mptc"
# a kernel cache of this run's own, empty at the start: every test compiles
# its kernels (then may reuse them), whatever earlier runs left behind
MPTC_CACHE_DIR=$(mktemp -d /tmp/mptc-test-cache-XXXXXX)
export MPTC_CACHE_DIR
trap 'rm -rf "$MPTC_CACHE_DIR"' EXIT

# run_one TEST: runs it, logging to $BUILD/NAME.log, its status and seconds
# to $BUILD/NAME.rc
run_one() {
  local t=$1 name start rc
  name=$(basename "$t")
  start=$(date +%s)
  if [[ "$t" == *.sh ]]; then timeout -k 10 "$TIMEOUT" bash "$t" >"$BUILD/$name.log" 2>&1
  else timeout -k 10 "$TIMEOUT" "$t" >"$BUILD/$name.log" 2>&1; fi
  rc=$?
  case $rc in 124|137) echo "run_all: $name stopped after $TIMEOUT seconds (MPTC_TEST_TIMEOUT)" >>"$BUILD/$name.log";; esac
  echo "$rc $(( $(date +%s) - start ))" >"$BUILD/$name.rc.tmp" && mv "$BUILD/$name.rc.tmp" "$BUILD/$name.rc"
}

# report TEST: one line from its .rc (and the log's tail for a failure)
pass=0; fail=0
report() {
  local name rc secs
  name=$(basename "$1")
  read -r rc secs <"$BUILD/$name.rc"
  if [ "$rc" -eq 0 ]; then pass=$((pass+1)); echo "PASS $name (${secs}s)"
  elif [ "$rc" -eq 77 ]; then echo "SKIP $name: $(tail -n 1 "$BUILD/$name.log")"
  else fail=$((fail+1)); echo "FAIL $name (${secs}s)"; tail -n 30 "$BUILD/$name.log" | sed 's/^/    /'; fi
}

tests=()
for t in "$BUILD"/tests/test_* tests/*.t.sh; do
  [ -e "$t" ] || continue
  case "$t" in *.d) continue;; esac
  rm -f "$BUILD/$(basename "$t").rc"
  tests+=("$t")
done

if [ "$JOBS" -eq 1 ]; then
  for t in "${tests[@]}"; do run_one "$t"; report "$t"; done
else
  # start up to JOBS at a time (serial ones once all else is done); report
  # each in order once it has finished
  next=0
  serial=()
  for t in "${tests[@]}"; do
    if grep -q MPTC_TEST_SERIAL "$t" 2>/dev/null; then serial+=("$t"); continue; fi
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    run_one "$t" &
    while [ "$next" -lt "${#tests[@]}" ] && [ -e "$BUILD/$(basename "${tests[$next]}").rc" ]; do
      report "${tests[$next]}"; next=$((next+1))
    done
  done
  wait
  for t in "${serial[@]}"; do run_one "$t"; done
  while [ "$next" -lt "${#tests[@]}" ]; do report "${tests[$next]}"; next=$((next+1)); done
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
