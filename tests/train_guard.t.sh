#!/usr/bin/env bash
# What a run keeps when it goes wrong (issue: defects found by fault
# injection): a step whose gradients are not finite never reaches the
# weights or a checkpoint, under every policy and on every backend here;
# SIGINT and SIGTERM stop after the step running, keep the checkpoint and
# say how to resume; labels past the model's classes, a log that cannot be
# written and pipes given as files are errors, not silence or a hang; the
# metrics reported are the ones the train block names.
set -u
MPTC=${MPTC:-build/mptc}
HELPER=$(dirname "$MPTC")/tests/test_checkpoint
M=tests/models
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
run() { local n=$1; shift; "$@" >"$tmp/$n.out" 2>&1; }
has() { grep -q -- "$2" "$tmp/$1.out"; }
# non-finite F32/F16/BF16 values in a safetensors file (python-free: the helper)
nonfinite() { "$HELPER" nonfinite "$1"; }

# 1. sgd with learning rate 1e6 blows up within a few steps: the run stops
#    at the first non-finite step, exit 1, naming layer and op; the
#    checkpoints (every step, and at the end) hold no non-finite value;
#    the log writes the loss as a number or null, never -1.
sed 's/optimizer = adam(learning_rate=0.01)/optimizer = sgd(learning_rate=1e6)/' \
    $M/ckpt_tiny.mpt >"$tmp/blow.mpt"
for dev in interp cpu; do
  for pol in float32 mixed_bfloat16 mixed_float16; do
    n=$dev-$pol
    rm -f "$tmp/p.st"
    run $n "$MPTC" train "$tmp/blow.mpt" --device $dev --policy $pol --save "$tmp/p.st" \
        --save-every 1 --log "$tmp/$n.jsonl" --max-skipped 3
    rc=$?
    [ $rc = 1 ] || bad "$n: exit $rc, want 1: $(tail -n 5 "$tmp/$n.out")"
    # the layer and op, from a re-run on the interpreter; where the CPU's
    # f32 kernels overflowed and the interpreter's double arithmetic did
    # not, that is said instead
    has $n "first non-finite value:" || { [ $dev = cpu ] && has $n "overflowed inside a kernel"; } ||
        bad "$n: no layer and op named: $(tail -n 5 "$tmp/$n.out")"
    if [ $pol != mixed_float16 ]; then
      has $n "was not applied" || bad "$n: the stop does not say the step was not applied"
    fi
    [ -f "$tmp/p.st" ] || bad "$n: no checkpoint kept"
    [ -f "$tmp/p.st" ] && { nf=$(nonfinite "$tmp/p.st"); [ "$nf" = 0 ] || bad "$n: the checkpoint holds $nf non-finite values"; }
    grep -q '"loss":-1[,}]' "$tmp/$n.jsonl" && bad "$n: a non-finite loss logged as -1"
    grep -q '"finite":false' "$tmp/$n.jsonl" || bad "$n: no step logged as not finite"
  done
done
grep -q '"loss":null' "$tmp"/*.jsonl || bad "no non-finite loss logged as null"

# 2. SIGINT, SIGTERM: the step finishes, the checkpoint is written and named
#    with how to resume, exit 130 / 143; the resumed run goes on from there.
for sig in INT TERM; do
  rm -f "$tmp/s.st"
  "$MPTC" train $M/ckpt_tiny.mpt --device interp --epochs 100000 --quiet --no-test \
      --save "$tmp/s.st" >"$tmp/sig$sig.out" 2>&1 &
  pid=$!
  sleep 2
  kill -$sig $pid
  wait $pid
  rc=$?
  want=$([ $sig = INT ] && echo 130 || echo 143)
  [ $rc = "$want" ] || bad "SIG$sig: exit $rc, want $want"
  has sig$sig "saved $tmp/s.st (step" || bad "SIG$sig: no checkpoint named: $(cat "$tmp/sig$sig.out")"
  has sig$sig "--resume $tmp/s.st" || bad "SIG$sig: no resume hint"
  has sig$sig "interrupted (SIG$sig)" || bad "SIG$sig: not said"
done
step=$(grep -o 'saved [^ ]* (step [0-9]*' "$tmp/sigTERM.out" | grep -o '[0-9]*$')
run resumed "$MPTC" train $M/ckpt_tiny.mpt --device interp --epochs 100000 --quiet --no-test \
    --resume "$tmp/s.st" --max-steps $((step + 3)) --save "$tmp/s2.st"
[ $? = 0 ] || bad "resume after SIGTERM failed: $(cat "$tmp/resumed.out")"
has resumed "saved $tmp/s2.st (step $((step + 3)))" || bad "resume did not go on from step $step: $(cat "$tmp/resumed.out")"

# 3. labels past the model's classes (4 units here) are refused by name
run labels "$MPTC" train $M/ckpt_tiny.mpt --device interp --data 'synthetic(shape=[16], classes=9, samples=64)'
[ $? = 1 ] || bad "labels 0..8 for 4 units were accepted"
has labels "labels go up to 8" || bad "the largest label is not named: $(cat "$tmp/labels.out")"
has labels "has 4 units" || bad "the model's class count is not named"
"$MPTC" train $M/ckpt_tiny.mpt --device interp --max-steps 1 --save "$tmp/w.st" --quiet --no-test >/dev/null 2>&1
run elabels "$MPTC" eval $M/ckpt_tiny.mpt --device interp --weights "$tmp/w.st" --data 'synthetic(shape=[16], classes=9, samples=64)'
[ $? = 1 ] && has elabels "labels go up to 8" || bad "eval took labels past the classes: $(cat "$tmp/elabels.out")"

# 4. a log that cannot be written is an error that says so
if [ -w /dev/full ]; then
  run full "$MPTC" train $M/ckpt_tiny.mpt --device interp --max-steps 3 --log /dev/full --quiet --no-test
  [ $? = 1 ] || bad "--log /dev/full: exit 0"
  has full "cannot write the log /dev/full" || bad "--log /dev/full: not said: $(cat "$tmp/full.out")"
fi

# 5. pipes given as files: an error at once, not a wait for a writer
mkfifo "$tmp/fifo"
run fweights timeout 20 "$MPTC" eval $M/ckpt_tiny.mpt --device interp --weights "$tmp/fifo"
rc=$?
[ $rc = 1 ] && has fweights "not a regular file" || bad "--weights FIFO: exit $rc: $(cat "$tmp/fweights.out")"
run fmodel timeout 20 "$MPTC" check "$tmp/fifo"
rc=$?
[ $rc = 1 ] && has fmodel "not a regular file" || bad "model FIFO: exit $rc: $(cat "$tmp/fmodel.out")"
run fdata timeout 20 "$MPTC" train $M/ckpt_tiny.mpt --device interp --data "idx(\"$tmp/fifo\", \"$tmp/fifo\")"
rc=$?
[ $rc = 1 ] && has fdata "not a regular file" || bad "idx FIFO: exit $rc: $(cat "$tmp/fdata.out")"

# 6. metrics are those the train block names: a regression with mae and mse
#    trains and reports them (no accuracy: none asked), in the log too;
#    top_k_accuracy(k=2) beside accuracy
for dev in interp cpu; do
  run reg$dev "$MPTC" train $M/regress.mpt --device $dev --log "$tmp/reg$dev.jsonl"
  [ $? = 0 ] || bad "regression on $dev failed: $(tail -n 3 "$tmp/reg$dev.out")"
  grep -q "^Test: .* - loss: [0-9.]* - mae: [0-9.]* - mse: [0-9.]*$" "$tmp/reg$dev.out" ||
      bad "regression on $dev: no mae and mse: $(tail -n 2 "$tmp/reg$dev.out")"
  has reg$dev "accuracy" && bad "regression on $dev: an accuracy nobody asked for"
  grep -q '"event":"epoch".*"mae":' "$tmp/reg$dev.jsonl" || bad "regression on $dev: no mae in the log"
done
sed 's/metrics = \[accuracy\]/metrics = [accuracy, top_k_accuracy(k=2)]/' $M/ckpt_tiny.mpt >"$tmp/topk.mpt"
run topk "$MPTC" train "$tmp/topk.mpt" --device interp --epochs 1
grep -q "^Test: .* - accuracy: [0-9.]* - top_2_accuracy: [0-9.]*$" "$tmp/topk.out" ||
    bad "no top_2_accuracy: $(tail -n 2 "$tmp/topk.out")"

[ $fail = 0 ] && echo "train_guard.t.sh: all passed"
exit $fail
