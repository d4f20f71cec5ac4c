#!/usr/bin/env bash
# Mixed precision at the command line: how the policy is chosen
# (MPTC_AUTO_MIXED_PRECISION, --policy), the warning about a 16-bit model
# output in `check` and `train`, a planted f16 overflow that stops training
# and is traced to its layer and op, and the loss scale in the JSONL log
# (fixed, dynamic growth every --loss-scale-period steps, halving on
# overflow). The rounding itself (f16 overflow at 65504, underflow below
# 2^-24) is tested on the interpreter in tests/test_interp.c.
set -u
MPTC=${MPTC:-build/mptc}
M=tests/models
SYN='synthetic(shape=[784], classes=10, samples=256)'
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
# run NAME CMD...: output (stdout and stderr) in $tmp/NAME.out, returns its status
run() { local n=$1; shift; "$@" >"$tmp/$n.out" 2>&1; }
has() { grep -q -- "$2" "$tmp/$1.out"; }
train() { "$MPTC" train "$@" --device interp --no-test --quiet; }

# 1. The policy: the file's (float32 for mlp_small), then
#    MPTC_AUTO_MIXED_PRECISION=1 (mixed_float16), and --policy over both.
run p0 "$MPTC" check examples/mlp_small.mpt || bad "check failed: $(cat "$tmp/p0.out")"
has p0 "policy: float32 (compute f32" || bad "default policy: $(head -1 "$tmp/p0.out")"
run p1 env MPTC_AUTO_MIXED_PRECISION=1 "$MPTC" check examples/mlp_small.mpt || bad "auto mixed check failed"
has p1 "policy: mixed_float16 (compute f16, variables f32)" || bad "MPTC_AUTO_MIXED_PRECISION=1: $(head -1 "$tmp/p1.out")"
grep -q "^hidden_1 (dense) .* f16 *f32 *f16" "$tmp/p1.out" || bad "auto mixed: hidden_1 is not f16/f32/f16"
has p1 "Loss scaling: dynamic" || bad "auto mixed: loss scaling is not dynamic"
for pol in float32 mixed_bfloat16; do
  run p2 env MPTC_AUTO_MIXED_PRECISION=1 "$MPTC" check examples/mlp_small.mpt --policy $pol || bad "--policy $pol failed"
  has p2 "policy: $pol (" || bad "--policy $pol does not override the variable: $(head -1 "$tmp/p2.out")"
done
run p3 env MPTC_AUTO_MIXED_PRECISION=1 "$MPTC" train examples/mlp_small.mpt --device interp --data "$SYN" --batch-size 16 \
  --max-steps 1 --no-test --quiet || bad "auto mixed train failed: $(cat "$tmp/p3.out")"
has p3 "policy mixed_float16" || bad "train under MPTC_AUTO_MIXED_PRECISION=1: $(head -1 "$tmp/p3.out")"
run p4 "$MPTC" check examples/mlp_small.mpt --policy mixed_float64
[ $? = 1 ] && has p4 "unknown policy 'mixed_float64'" && has p4 "hint:" || bad "unknown policy: $(cat "$tmp/p4.out")"

# 2. A 16-bit model output is warned about, with the reason, in check and
#    train; a float32 output is not.
why="Softmax and the loss in 16-bit floats are numerically"
run w1 "$MPTC" check $M/mp_low_output.mpt || bad "check of mp_low_output failed: $(cat "$tmp/w1.out")"
has w1 "warning: the model's output is f16" && has w1 "$why" && has w1 "dtype=float32" \
  || bad "check does not warn about the f16 output: $(cat "$tmp/w1.out")"
run w2 train $M/mp_low_output.mpt --max-steps 2 || bad "train of mp_low_output failed: $(cat "$tmp/w2.out")"
has w2 "warning: the model's output is f16" && has w2 "$why" && has w2 "layer 'out' dtype=float32" \
  || bad "train does not warn about the f16 output: $(cat "$tmp/w2.out")"
for pol in mixed_float16 mixed_bfloat16; do
  run w3 train examples/mlp_small.mpt --policy $pol --data "$SYN" --batch-size 16 --max-steps 1 || bad "mlp_small $pol failed"
  has w3 "warning" && bad "mlp_small under $pol (float32 softmax) is warned about: $(cat "$tmp/w3.out")"
  run w4 "$MPTC" check examples/mlp_small.mpt --policy $pol
  has w4 "warning" && bad "check of mlp_small under $pol warns: $(cat "$tmp/w4.out")"
done

# 3. The planted overflow: under mixed_float16 the f16 input of layer
#    'blowup' overflows at every step; with --max-skipped 3 training stops
#    with status 1 and names the layer, the op and the fix. The dynamic scale
#    halves at each skipped step. float32 and mixed_bfloat16 (8 exponent
#    bits) run the same steps without a non-finite value.
run o1 train $M/mp_overflow.mpt --policy mixed_float16 --max-skipped 3 --log "$tmp/o1.jsonl"
[ $? = 1 ] || bad "the overflow did not stop training with status 1: $(cat "$tmp/o1.out")"
has o1 "3 consecutive steps were skipped" || bad "no skipped-steps message: $(cat "$tmp/o1.out")"
has o1 "first non-finite value: %[0-9]* = cast (f16\[16,8\]) in layer 'blowup', forward pass" \
  || bad "the report does not name blowup's f16 cast once: $(grep -A2 'first non-finite' "$tmp/o1.out")"
has o1 "give layer 'blowup' dtype=float32" || bad "no dtype=float32 hint: $(cat "$tmp/o1.out")"
scales=$(grep '"event":"step"' "$tmp/o1.jsonl" | sed 's/.*"finite":\([a-z]*\).*"loss_scale":\([0-9.e+]*\),"skipped":\([0-9]*\).*/\1 \2 \3/' | tr '\n' ' ')
[ "$scales" = "false 32768 1 false 16384 2 false 8192 3 " ] || bad "skipped steps in the log: '$scales'"
# the same on the CPU backend, where each weight gradient's finite check
# runs in its GEMM's epilogue (fusion's epilogue reductions)
if "$MPTC" devices 2>/dev/null | grep -q "^cpu"; then
  run o1c "$MPTC" train $M/mp_overflow.mpt --device cpu --no-test --quiet --policy mixed_float16 \
    --max-skipped 3 --log "$tmp/o1c.jsonl"
  [ $? = 1 ] || bad "cpu: the overflow did not stop training with status 1: $(cat "$tmp/o1c.out")"
  has o1c "3 consecutive steps were skipped" || bad "cpu: no skipped-steps message: $(cat "$tmp/o1c.out")"
  scales=$(grep '"event":"step"' "$tmp/o1c.jsonl" | sed 's/.*"finite":\([a-z]*\).*"loss_scale":\([0-9.e+]*\),"skipped":\([0-9]*\).*/\1 \2 \3/' | tr '\n' ' ')
  [ "$scales" = "false 32768 1 false 16384 2 false 8192 3 " ] || bad "cpu: skipped steps in the log: '$scales'"
fi
for pol in float32 mixed_bfloat16; do
  run o2 train $M/mp_overflow.mpt --policy $pol --max-skipped 3 --max-steps 2 --log "$tmp/o2.jsonl" \
    || bad "mp_overflow under $pol failed: $(cat "$tmp/o2.out")"
  [ "$(grep -c '"finite":true' "$tmp/o2.jsonl")" = 2 ] || bad "mp_overflow under $pol: steps not finite"
done

# 4. The loss scale in the log: fixed with --loss-scale N; dynamic doubles
#    after every --loss-scale-period finite steps; float32 has no scale.
col() { grep '"event":"step"' "$1" | sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" | tr '\n' ' '; }
run s1 train examples/mlp_small.mpt --policy mixed_float16 --data "$SYN" --batch-size 16 --max-steps 4 \
  --loss-scale 1024 --log "$tmp/s1.jsonl" || bad "--loss-scale 1024 failed: $(cat "$tmp/s1.out")"
[ "$(col "$tmp/s1.jsonl" loss_scale)" = "1024 1024 1024 1024 " ] || bad "fixed scale: $(col "$tmp/s1.jsonl" loss_scale)"
[ "$(col "$tmp/s1.jsonl" skipped)" = "0 0 0 0 " ] || bad "fixed scale skipped: $(col "$tmp/s1.jsonl" skipped)"
run s2 train examples/mlp_small.mpt --policy mixed_float16 --data "$SYN" --batch-size 16 --max-steps 6 \
  --loss-scale-period 2 --log "$tmp/s2.jsonl" || bad "--loss-scale-period 2 failed: $(cat "$tmp/s2.out")"
[ "$(col "$tmp/s2.jsonl" loss_scale)" = "32768 32768 65536 65536 131072 131072 " ] \
  || bad "dynamic scale with period 2: $(col "$tmp/s2.jsonl" loss_scale)"
grep -q '"event":"epoch".*"loss_scale":131072,"skipped":0' "$tmp/s2.jsonl" || bad "epoch record lacks loss_scale/skipped"
run s3 train examples/mlp_small.mpt --policy float32 --data "$SYN" --batch-size 16 --max-steps 2 --log "$tmp/s3.jsonl" \
  || bad "float32 run failed"
grep -q loss_scale "$tmp/s3.jsonl" && bad "float32 logs a loss scale"
run s4 train examples/mlp_small.mpt --policy mixed_float16 --loss-scale 0
[ $? != 0 ] && has s4 "dynamic, none or a positive number" || bad "--loss-scale 0: $(cat "$tmp/s4.out")"

# 5. The CPU's advice on the first lines of `train`: where bf16 is
#    multiplied in f32 FMAs (forced with MPT_CPU_BF16_DOT=0, which an AMX
#    host ignores), mixed_bfloat16 is said to save memory, not time; where
#    vdpbf16ps is used (MPT_CPU_BF16_DOT=1 on an AVX512_BF16 host), not
C=(train examples/mlp_small.mpt --data "$SYN" --batch-size 16 --max-steps 1)
"$MPTC" devices >"$tmp/devices.out" 2>&1
run a0 env MPT_CPU_BF16_DOT=0 "$MPTC" "${C[@]}" --device cpu --no-test --quiet --policy mixed_bfloat16 ||
  bad "bf16 on the CPU failed: $(cat "$tmp/a0.out")"
if has devices "amx in use"; then :
elif ! has a0 "mixed_bfloat16 saves memory here, not time"; then bad "no advice for bf16 in f32 FMAs: $(head -3 "$tmp/a0.out")"
fi
if has devices "features:.*avx512_bf16" && ! has devices "amx in use"; then
  run a1 env MPT_CPU_BF16_DOT=1 "$MPTC" "${C[@]}" --device cpu --no-test --quiet --policy mixed_bfloat16 ||
    bad "bf16 with vdpbf16ps failed: $(cat "$tmp/a1.out")"
  has a1 "saves memory here" && bad "advice against bf16 where vdpbf16ps runs it: $(head -3 "$tmp/a1.out")"
fi

[ $fail = 0 ] && echo "mixed.t.sh: ok"
exit $fail
