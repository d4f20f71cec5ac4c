#!/usr/bin/env bash
# Data parallelism end to end (runtime/dist/, ir/train.c's ALLREDUCE):
# `mpirun -np 2 mptc train` against one process with the same global
# batch. The ranks differ from one process only in the order of the
# batch gradient's sum (two partial sums of 32 rows added, against one
# sum over 64), so weights agree within 1e-4 of each tensor's largest
# value after 20 steps (measured: 2e-7 absolute, 2.4e-3 relative on the
# smallest weights; Adam's normalised updates carry the rounding on).
# Every run also checks at its end that the ranks' states are identical
# (train_loop.c), so each passing 2-rank run below says that too.
# Skips where Open MPI or mptc's MPI library (build/lib/libmptc_mpi.so,
# built by make where mpicc is) is missing.
set -u
MPTC=${MPTC:-build/mptc}
HELPER=${HELPER:-$(dirname "$MPTC")/tests/test_checkpoint}
M=tests/models
command -v mpirun >/dev/null || { echo "skip: no mpirun (apt-get install openmpi-bin libopenmpi-dev)"; exit 77; }
[ -e "$(dirname "$MPTC")/lib/libmptc_mpi.so" ] || { echo "skip: $(dirname "$MPTC")/lib/libmptc_mpi.so not built (make, with mpicc installed)"; exit 77; }
[ -x "$HELPER" ] || { echo "FAIL: $HELPER not built"; exit 1; }
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
MPI=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
# every run is bounded: a rank left waiting would hang the suite
run() { local n=$1; shift; timeout 300 "$@" >"$tmp/$n.out" 2>&1; }
one() { run "$@"; }
two() { local n=$1; shift; run "$n" "${MPI[@]}" -np 2 "$@"; }
T=(--device cpu --threads 1 --no-test --quiet)
close() { "$HELPER" close "$1" "$2" 1e-4 >"$tmp/close.out" 2>&1 || { cat "$tmp/close.out"; return 1; }; }

# 1. The MLP on Fashion-MNIST and a strided convnet, float32: two ranks of
#    32 end where one process of 64 does
for m in examples/mlp_small $M/strided; do
  b=64; [ "$m" = $M/strided ] && b=16
  n=$(basename $m)
  one $n.1 "$MPTC" train $m.mpt "${T[@]}" --batch-size $b --max-steps 20 --validation-split 0 --save "$tmp/$n.1.st" ||
    bad "$n: one process failed: $(tail -3 "$tmp/$n.1.out")"
  two $n.2 "$MPTC" train $m.mpt "${T[@]}" --batch-size $b --max-steps 20 --validation-split 0 --save "$tmp/$n.2.st" ||
    bad "$n: two ranks failed: $(tail -5 "$tmp/$n.2.out")"
  grep -q "batch $b (2 ranks x $((b / 2))" "$tmp/$n.2.out" || bad "$n: the first line does not say the ranks: $(head -1 "$tmp/$n.2.out")"
  close "$tmp/$n.1.st" "$tmp/$n.2.st" || bad "$n: two ranks' weights differ from one process's"
  # one sum per gradient instead of the default buckets: the same sums
  two $n.3 "$MPTC" train $m.mpt "${T[@]}" --batch-size $b --max-steps 20 --validation-split 0 --bucket-mb 0 --save "$tmp/$n.3.st" ||
    bad "$n: two ranks without buckets failed: $(tail -5 "$tmp/$n.3.out")"
  "$HELPER" compare "$tmp/$n.2.st" "$tmp/$n.3.st" >"$tmp/cmp.out" 2>&1 || bad "$n: buckets change the sums: $(cat "$tmp/cmp.out")"
done

# 1a. Evaluation is shared by the ranks (they take turns at the batches and
#     add up their sums): the same validation and test figures as one process
V=(--device cpu --threads 1 --quiet --batch-size 64 --max-steps 10)
one v1 "$MPTC" train examples/mlp_small.mpt "${V[@]}" || bad "evaluation, one process: $(tail -3 "$tmp/v1.out")"
two v2 "$MPTC" train examples/mlp_small.mpt "${V[@]}" || bad "evaluation, two ranks: $(tail -5 "$tmp/v2.out")"
for w in val_loss val_accuracy "Test: "; do
  a=$(grep -o "$w[^-]*" "$tmp/v1.out" | tail -1); b=$(grep -o "$w[^-]*" "$tmp/v2.out" | tail -1)
  [ -n "$a" ] && [ "$a" = "$b" ] || bad "evaluation: '$a' in one process, '$b' on two ranks"
done

# 1b. A wide embedding: its gradient crosses as the ranks' (ids, rows),
#     all-gathered and scattered on every rank (mptc check says so), with
#     and without the sharded optimizer; the same weights as one process
E=$M/embed_wide.mpt
"$MPTC" check $E --ranks 2 >"$tmp/echeck.out" 2>&1 && grep -q "1 embedding gradient exchanged as the ranks' ids and rows" "$tmp/echeck.out" ||
  bad "mptc check --ranks 2 does not report the sparse embedding exchange: $(tail -3 "$tmp/echeck.out")"
one e1 "$MPTC" train $E "${T[@]}" --max-steps 12 --save "$tmp/e1.st" || bad "embedding, one process: $(tail -3 "$tmp/e1.out")"
two e2 "$MPTC" train $E "${T[@]}" --max-steps 12 --save "$tmp/e2.st" || bad "embedding, two ranks: $(tail -5 "$tmp/e2.out")"
two e3 "$MPTC" train $E "${T[@]}" --max-steps 12 --shard-optimizer --save "$tmp/e3.st" || bad "embedding, sharded: $(tail -5 "$tmp/e3.out")"
close "$tmp/e1.st" "$tmp/e2.st" || bad "embedding: two ranks' weights differ from one process's"
close "$tmp/e1.st" "$tmp/e3.st" || bad "embedding, sharded: two ranks' weights differ from one process's"

# 1c. Dropout: each rank draws its slice of the global batch's masks (the
#     same mask on every rank would train differently from one process)
D=$M/dropout_mlp.mpt
one d1 "$MPTC" train $D "${T[@]}" --max-steps 8 --save "$tmp/d1.st" || bad "dropout, one process: $(tail -3 "$tmp/d1.out")"
two d2 "$MPTC" train $D "${T[@]}" --max-steps 8 --save "$tmp/d2.st" || bad "dropout, two ranks: $(tail -5 "$tmp/d2.out")"
close "$tmp/d1.st" "$tmp/d2.st" || bad "dropout: two ranks' weights differ from one process's"

# 1d. --histogram-grads on two ranks draws the gradient the step applied
#     (the mean of the ranks' shards), not rank 0's half batch: each
#     gradient histogram's count, min, max, sum and sum of squares agree
#     with one process's (rank 0's own half differs by several percent)
H=(--batch-size 64 --max-steps 10 --validation-split 0 --histogram-grads --histogram-every 5)
one h1 "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${H[@]}" --tensorboard "$tmp/tb1" || bad "histograms, one process: $(tail -3 "$tmp/h1.out")"
two h2 "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${H[@]}" --tensorboard "$tmp/tb2" || bad "histograms, two ranks: $(tail -5 "$tmp/h2.out")"
if command -v python3 >/dev/null; then
  python3 - "$tmp/tb1/train" "$tmp/tb2/train" >"$tmp/hist.out" 2>&1 <<'PY' || bad "gradient histograms on two ranks: $(tail -5 "$tmp/hist.out")"
# a TFRecord of Event protos read by hand (no tensorboard package here):
# Event.summary (5) -> Summary.value (1) -> Value.tag (1), Value.histo (5)
# -> HistogramProto min (1), max (2), num (3), sum (4), sum_squares (5)
import glob, math, struct, sys
def fields(b):
    i = 0
    while i < len(b):
        key = 0; shift = 0
        while True:
            c = b[i]; i += 1; key |= (c & 127) << shift; shift += 7
            if c < 128: break
        f, wt = key >> 3, key & 7
        if wt == 0:
            v = 0; shift = 0
            while True:
                c = b[i]; i += 1; v |= (c & 127) << shift; shift += 7
                if c < 128: break
        elif wt == 1: v = struct.unpack("<d", b[i:i + 8])[0]; i += 8
        elif wt == 5: v = struct.unpack("<f", b[i:i + 4])[0]; i += 4
        elif wt == 2:
            n = 0; shift = 0
            while True:
                c = b[i]; i += 1; n |= (c & 127) << shift; shift += 7
                if c < 128: break
            v = b[i:i + n]; i += n
        else: raise ValueError("wire type %d" % wt)
        yield f, v
def grads(d):
    (path,) = glob.glob(d + "/events.out.tfevents.*")
    raw, pos, out = open(path, "rb").read(), 0, {}
    while pos < len(raw):
        (n,) = struct.unpack("<Q", raw[pos:pos + 8])
        ev = dict(fields(raw[pos + 12:pos + 12 + n])); pos += 16 + n
        for f, val in fields(ev.get(5, b"")):
            v = dict(fields(val))
            tag = v.get(1, b"").decode()
            if 5 in v and "grad" in tag:
                h = dict(fields(v[5]))
                out[(tag, ev.get(2, 0))] = [h.get(k, 0.0) for k in (1, 2, 3, 4, 5)]
    return out
a, b = grads(sys.argv[1]), grads(sys.argv[2])
if not a or sorted(a) != sorted(b):
    sys.exit("gradient histograms: one process has %r, two ranks %r" % (sorted(a), sorted(b)))
bad = 0
for key in sorted(a):
    (mn, mx, num, s, ss), (mn2, mx2, num2, s2, ss2) = a[key], b[key]
    scale = max(abs(mn), abs(mx))
    ok = (num == num2 and abs(mn - mn2) <= 1e-3 * scale and abs(mx - mx2) <= 1e-3 * scale and
          abs(s - s2) <= 1e-3 * math.sqrt(num * ss) and abs(ss - ss2) <= 1e-3 * ss)
    if not ok:
        bad += 1
        print("%s step %d: one process %r, two ranks %r" % (key[0], key[1], a[key], b[key]))
print("%d gradient histograms compared" % len(a))
sys.exit(1 if bad else 0)
PY
fi

# 2. Batch norm: each rank normalises with its own statistics (as Keras and
#    PyTorch DDP without synchronised batch norm), the moving averages are
#    averaged, and the ranks end with the same state (checked at the end)
two bn "$MPTC" train $M/relu_bn.mpt "${T[@]}" --max-steps 6 --policy mixed_bfloat16 ||
  bad "batch norm over two ranks failed: $(tail -5 "$tmp/bn.out")"

# 3. mixed_float16: an overflow planted in rank 1's shard at step 3 makes
#    both ranks skip that step and halve the same scale, as one process
#    with the overflow in its batch does; the skipped step changes no
#    weight (each rank's float16 gradients round apart from one process's,
#    so the weights are compared with the same run's step 2, exactly)
MF=(--policy mixed_float16 --batch-size 64 --validation-split 0)
MPTC_FAULT_INPUT=0:3 one f1 "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${MF[@]}" --max-steps 6 --log "$tmp/f1.jsonl" ||
  bad "planted overflow, one process: $(tail -3 "$tmp/f1.out")"
two f2 -x MPTC_FAULT_INPUT=1:3 "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${MF[@]}" --max-steps 6 --log "$tmp/f2.jsonl" ||
  bad "planted overflow, two ranks: $(tail -5 "$tmp/f2.out")"
steps() { grep '"event":"step"' "$1" | sed 's/.*"step":\([0-9]*\).*"finite":\([a-z]*\).*"loss_scale":\([0-9.e+]*\).*/\1 \2 \3/'; }
[ "$(steps "$tmp/f2.jsonl" | sed -n 3p)" = "3 false 32768" ] || bad "two ranks: step 3 was not skipped: $(steps "$tmp/f2.jsonl" | tr '\n' ';')"
[ "$(steps "$tmp/f2.jsonl" | sed -n 4p)" = "4 true 16384" ] || bad "two ranks: the scale was not halved after step 3"
[ "$(steps "$tmp/f1.jsonl")" = "$(steps "$tmp/f2.jsonl")" ] || bad "one process and two ranks skipped different steps"
two s2 "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${MF[@]}" --max-steps 2 --save "$tmp/s2.st" || bad "2 steps failed"
two s3 -x MPTC_FAULT_INPUT=1:3 "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${MF[@]}" --max-steps 3 --save "$tmp/s3.st" || bad "3 steps failed"
"$HELPER" compare "$tmp/s2.st" "$tmp/s3.st" weights >"$tmp/cmp.out" 2>&1 || bad "the skipped step changed weights: $(cat "$tmp/cmp.out")"

# 4. A checkpoint of two ranks resumes in one process and in two
R=(--batch-size 64 --validation-split 0)
one full "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${R[@]}" --max-steps 20 --save "$tmp/full.st" || bad "20 steps failed"
two half "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${R[@]}" --max-steps 10 --save "$tmp/half.st" || bad "10 steps on two ranks failed"
one r1 "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${R[@]}" --max-steps 20 --resume "$tmp/half.st" --save "$tmp/r1.st" ||
  bad "resuming two ranks' checkpoint in one process failed: $(tail -3 "$tmp/r1.out")"
two r2 "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${R[@]}" --max-steps 20 --resume "$tmp/half.st" --save "$tmp/r2.st" ||
  bad "resuming two ranks' checkpoint in two failed: $(tail -5 "$tmp/r2.out")"
close "$tmp/full.st" "$tmp/r1.st" || bad "resumed in one process: differs from the uninterrupted run"
close "$tmp/full.st" "$tmp/r2.st" || bad "resumed in two ranks: differs from the uninterrupted run"

# 5. --shard-optimizer (ZeRO-1): each rank updates its shard of Adam's
#    slots; the weights equal the unsharded run's bit for bit (two ranks
#    sum each gradient element the same way: a + b), the checkpoint holds
#    whole slots, and it resumes in one process and in two ranks, sharded
#    or not; mixed_float16 with an overflow on one rank skips the same step
SH=(--batch-size 64 --validation-split 0 --shard-optimizer)
two z20 "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${SH[@]}" --max-steps 20 --save "$tmp/z20.st" ||
  bad "sharded optimizer failed: $(tail -5 "$tmp/z20.out")"
two n20 "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${R[@]}" --max-steps 20 --save "$tmp/n20.st" || bad "20 steps on two ranks failed"
"$HELPER" compare "$tmp/n20.st" "$tmp/z20.st" >"$tmp/cmp.out" 2>&1 || bad "sharded and unsharded optimizers differ: $(cat "$tmp/cmp.out")"
two z10 "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${SH[@]}" --max-steps 10 --save "$tmp/z10.st" || bad "10 sharded steps failed"
one zr1 "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${R[@]}" --max-steps 20 --resume "$tmp/z10.st" --save "$tmp/zr1.st" ||
  bad "a sharded checkpoint does not resume in one process: $(tail -3 "$tmp/zr1.out")"
two zr2 "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${SH[@]}" --max-steps 20 --resume "$tmp/z10.st" --save "$tmp/zr2.st" ||
  bad "a sharded checkpoint does not resume sharded: $(tail -5 "$tmp/zr2.out")"
two zr3 "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${SH[@]}" --max-steps 20 --resume "$tmp/half.st" --save "$tmp/zr3.st" ||
  bad "an unsharded checkpoint does not resume sharded: $(tail -5 "$tmp/zr3.out")"
"$HELPER" compare "$tmp/n20.st" "$tmp/zr2.st" >"$tmp/cmp.out" 2>&1 || bad "resumed sharded run differs: $(cat "$tmp/cmp.out")"
close "$tmp/full.st" "$tmp/zr1.st" || bad "sharded checkpoint resumed in one process: differs from the uninterrupted run"
close "$tmp/full.st" "$tmp/zr3.st" || bad "unsharded checkpoint resumed sharded: differs from the uninterrupted run"
two zf -x MPTC_FAULT_INPUT=1:3 "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${MF[@]}" --shard-optimizer --max-steps 6 --log "$tmp/zf.jsonl" ||
  bad "sharded, planted overflow: $(tail -5 "$tmp/zf.out")"
[ "$(steps "$tmp/f2.jsonl")" = "$(steps "$tmp/zf.jsonl")" ] || bad "sharded: the planted overflow skipped other steps: $(steps "$tmp/zf.jsonl" | tr '\n' ';')"
two zc "$MPTC" train examples/mlp_small.mpt "${T[@]}" "${SH[@]}" --max-steps 2 --optimizer "adam(global_clipnorm=1)" &&
  bad "global_clipnorm with a sharded optimizer was accepted"
grep -q "global_clipnorm needs the whole" "$tmp/zc.out" || bad "sharded clipnorm: no clear message: $(grep mptc "$tmp/zc.out" | head -2)"

# 5b. SIGUSR1 to mpirun (which forwards it; its own SIGINT/SIGTERM end the
#     job at once) stops both ranks after the same step; rank 0 saves
"${MPI[@]}" -np 2 "$MPTC" train examples/mlp_small.mpt "${T[@]}" --batch-size 64 --validation-split 0 \
  --save "$tmp/usr1.st" --log "$tmp/usr1.jsonl" >"$tmp/usr1.out" 2>&1 &
pid=$!
for i in $(seq 1 300); do
  n=$(grep -c '"event":"step"' "$tmp/usr1.jsonl" 2>/dev/null)
  [ "${n:-0}" -ge 5 ] && break
  sleep 0.1
done
kill -USR1 $pid
( sleep 120; kill -9 $pid 2>/dev/null ) & guard=$!
wait $pid; rc=$?
kill $guard 2>/dev/null
[ $rc -eq 138 ] || bad "SIGUSR1: exit $rc, want 138: $(tail -5 "$tmp/usr1.out")"
last=$(grep '"event":"step"' "$tmp/usr1.jsonl" | tail -1 | sed 's/.*"step":\([0-9]*\).*/\1/')
grep -q "saved $tmp/usr1.st (step $last)" "$tmp/usr1.out" || bad "SIGUSR1: no checkpoint of step $last: $(grep -i saved "$tmp/usr1.out")"
[ "$(grep -c 'stopping after this step' "$tmp/usr1.out")" = 2 ] || bad "SIGUSR1: not both ranks stopped"
one ur "$MPTC" train examples/mlp_small.mpt "${T[@]}" --batch-size 64 --validation-split 0 --max-steps $((last + 2)) --resume "$tmp/usr1.st" ||
  bad "SIGUSR1: the checkpoint does not resume: $(tail -3 "$tmp/ur.out")"

# 6. Failures end every rank, with the rank and the cause, never a hang:
#    a batch that does not split; ranks running different plans; a rank
#    whose data cannot be read while the other trains
two odd "$MPTC" train examples/mlp_small.mpt "${T[@]}" --batch-size 65 --max-steps 2 &&
  bad "a batch of 65 over 2 ranks was accepted"
grep -q "does not split over 2 ranks" "$tmp/odd.out" && grep -q "hint: .*--batch-size 64 or 66" "$tmp/odd.out" ||
  bad "odd batch: no clear message: $(head -3 "$tmp/odd.out")"
run plan "${MPI[@]}" -np 1 "$MPTC" train examples/mlp_small.mpt "${T[@]}" --max-steps 2 : \
  -np 1 "$MPTC" train examples/mlp_small.mpt "${T[@]}" --max-steps 2 --policy mixed_bfloat16 &&
  bad "ranks with different policies were accepted"
grep -q "rank 1's train step .* differs from rank 0's" "$tmp/plan.out" || bad "different plans: no message naming rank 1: $(grep mptc "$tmp/plan.out" | head -3)"
run data "${MPI[@]}" -np 1 "$MPTC" train $M/strided.mpt "${T[@]}" --max-steps 50 : \
  -np 1 "$MPTC" train $M/strided.mpt "${T[@]}" --max-steps 50 --data "images(\"$tmp/none\", size=[11, 13])" &&
  bad "a rank without data was accepted"
grep -q "rank 1 of 2 stopped" "$tmp/data.out" || bad "a failing rank did not end the run: $(tail -5 "$tmp/data.out")"

# a rank killed outright (kill -9): mpirun ends the other within seconds
"${MPI[@]}" -np 2 "$MPTC" train examples/mlp_small.mpt "${T[@]}" --batch-size 64 --validation-split 0 \
  --log "$tmp/k9.jsonl" >"$tmp/k9.out" 2>&1 &
pid=$!
for i in $(seq 1 300); do
  n=$(grep -c '"event":"step"' "$tmp/k9.jsonl" 2>/dev/null)
  [ "${n:-0}" -ge 3 ] && break
  sleep 0.1
done
victim=$(pgrep -P "$pid" -f "train examples/mlp_small.mpt" | tail -1)
[ -n "$victim" ] && kill -9 "$victim"
start=$(date +%s)
( sleep 60; kill -9 $pid 2>/dev/null ) & guard=$!
wait $pid; rc=$?
kill $guard 2>/dev/null
[ -n "$victim" ] || bad "kill -9: no rank process found under mpirun"
[ $rc -ne 0 ] && [ $(( $(date +%s) - start )) -lt 30 ] || bad "kill -9 of a rank: mpirun exit $rc after $(( $(date +%s) - start )) s"

[ $fail -eq 0 ] && echo "dist: all checks passed"
exit $fail
