#!/usr/bin/env bash
# The front end under libFuzzer (tests/fuzz_lang.c): parse, check, lower,
# policy, train and evaluation steps, fusion and the memory plan, with ASan
# and UBSan, from a corpus of the examples, the test models, the golden
# error files' models and tests/fuzz/, for a fixed number of inputs and a
# fixed seed (so a run is repeatable). A crash names the input that made
# it, kept in $KEEP_FUZZ (default: build/fuzz/). Longer runs by hand:
#   build/fuzz/fuzz_lang -max_total_time=600 tests/fuzz examples
set -u
MPTC=${MPTC:-build/mptc}
F=$(dirname "$MPTC")/fuzz/fuzz_lang
RUNS=${FUZZ_RUNS:-2500}
if [ ! -x "$F" ]; then
    echo "skip: no fuzz target $F: it needs clang with its fuzzer runtime (clang-14, libclang-rt-14-dev; .ci/deps.sh installs them)"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/corpus"
cp tests/fuzz/*.mpt examples/*.mpt tests/models/*.mpt tests/lang/*.mpt "$tmp/corpus/"
keep=${KEEP_FUZZ:-$(dirname "$F")}
# new inputs go to the temporary corpus, crashes to $keep
"$F" -runs="$RUNS" -seed=1 -timeout=30 -rss_limit_mb=4096 -max_len=4096 \
    -artifact_prefix="$keep/" -print_final_stats=1 "$tmp/corpus" >"$tmp/log" 2>&1
rc=$?
tail -n 12 "$tmp/log"
if [ $rc -ne 0 ]; then
    echo "FAIL: the fuzz target failed (exit $rc); the input that did it:"
    grep -o "Test unit written to .*" "$tmp/log" | head -n 1
    grep -B2 -A25 -m1 "ERROR: \|runtime error: \|deadly signal" "$tmp/log" | head -n 60
    exit 1
fi
echo "fuzz.t.sh: $RUNS inputs, no crash"
