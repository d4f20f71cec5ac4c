#!/usr/bin/env bash
# The training controls Keras users reach for (issue: schedules, clipping,
# weight decay, callbacks, command-line overrides): a schedule's rate in the
# log is the same on the interpreter and the CPU JIT and follows Keras'
# formula; reduce_lr_on_plateau, early_stopping (restoring the best
# weights) and model_checkpoint decide and say so; a monitor the run does
# not log, and reduce_lr_on_plateau under a schedule, are errors before the
# first step; --optimizer and --learning-rate override the file, also on a
# resumed run.
set -u
MPTC=${MPTC:-build/mptc}
M=tests/models
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
run() { local n=$1; shift; "$@" >"$tmp/$n.out" 2>&1; }
has() { grep -q -- "$2" "$tmp/$1.out"; }
# the learning_rate of every step line of a log, one a line
rates() { grep '"event":"step"' "$1" | sed 's/.*"learning_rate":\([^,}]*\).*/\1/'; }

# 1. the cosine schedule with warmup (sin/cos ops) and adamw with global
#    clipping: the same rates on the interpreter and the CPU JIT, and
#    Keras' formula at step 0, inside the warmup and after the decay
for dev in interp cpu; do
  run sched-$dev "$MPTC" train $M/controls.mpt --device $dev --no-test --epochs 3 \
      --log "$tmp/sched-$dev.jsonl"
  [ $? = 0 ] || bad "controls.mpt on $dev: $(tail -n 5 "$tmp/sched-$dev.out")"
done
rates "$tmp/sched-interp.jsonl" >"$tmp/r-interp"
rates "$tmp/sched-cpu.jsonl" >"$tmp/r-cpu"
[ "$(wc -l <"$tmp/r-interp")" = 60 ] || bad "expected 60 steps of rates, got $(wc -l <"$tmp/r-interp")"
cmp -s "$tmp/r-interp" "$tmp/r-cpu" || bad "the schedule's rates differ between interp and cpu: $(paste "$tmp/r-interp" "$tmp/r-cpu" | head -n 3)"
python3 - "$tmp/r-interp" <<'EOF' || bad "the rates are not Keras' cosine_decay with warmup"
import math, sys
rates = [float(l) for l in open(sys.argv[1])]
def keras(step, init=0.001, ds=40, alpha=0.1, target=0.01, ws=5):
    s = min(step, ds + ws)
    if s < ws: return (target - init) * (s / ws) + init
    return target * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * (s - ws) / ds)) + alpha)
for step, got in enumerate(rates):   # no step is skipped in float32
    want = keras(step)
    assert abs(got - want) <= 1e-6 * want, (step, got, want)
EOF

# 2. callbacks: the rate halves after each plateau, early stopping ends the
#    run and restores the best epoch, the checkpoint keeps the best only
cat >"$tmp/cb.mpt" <<'EOF'
model cb {
    input x: [8]
    dense h(units=16, activation=relu)
    dense out(units=3, activation=softmax)
}
train {
    data = synthetic(shape=[8], classes=3, samples=512)
    validation_split = 0.25
    optimizer = sgd(learning_rate=0.5)
    metrics = [accuracy]
    batch_size = 32
    epochs = 40
    callbacks = [reduce_lr_on_plateau(patience=1, factor=0.5),
                 early_stopping(patience=3, restore_best_weights=true),
                 model_checkpoint("CKDIR/best_{epoch:02d}.st", monitor="val_accuracy", save_best_only=true),
                 model_checkpoint("CKDIR/best_loss.st", save_best_only=true)]
}
EOF
sed -i "s|CKDIR|$tmp|" "$tmp/cb.mpt"
run cb "$MPTC" train "$tmp/cb.mpt" --device cpu --no-test --log "$tmp/cb.jsonl" --save "$tmp/end.st"
[ $? = 0 ] || bad "callbacks run: $(tail -n 5 "$tmp/cb.out")"
has cb "ReduceLROnPlateau reducing learning rate to 0.25." || bad "no learning-rate reduction: $(tail -n 5 "$tmp/cb.out")"
has cb ": early stopping (val_loss has not improved" || bad "no early stop: $(tail -n 5 "$tmp/cb.out")"
has cb "Restoring model weights from the end of the best epoch" || bad "best weights not restored"
has cb "val_accuracy improved from -inf to" || bad "model_checkpoint said nothing of its first save"
ls "$tmp"/best_01.st >/dev/null 2>&1 || bad "model_checkpoint did not write best_01.st"
epochs=$(grep -c '"event":"epoch"' "$tmp/cb.jsonl")
[ "$epochs" -lt 40 ] || bad "early stopping did not stop the run ($epochs epochs)"
# the epoch lines' rates never go up, and end below the start
python3 - "$tmp/cb.jsonl" <<'EOF' || bad "the logged rates do not follow the reductions"
import json, sys
lr = [json.loads(l)["learning_rate"] for l in open(sys.argv[1]) if '"epoch"' in l and '"event":"epoch"' in l]
assert all(b <= a for a, b in zip(lr, lr[1:])) and lr[-1] < lr[0], lr
EOF
# the restored weights are the best epoch's: the same bytes as the
# checkpoint model_checkpoint kept for the best val_loss
python3 - "$tmp/best_loss.st" "$tmp/end.st" <<'EOF' || bad "the weights at the end are not the best epoch's"
import json, struct, sys
def weights(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in h.items() if k in ("h/kernel", "h/bias", "out/kernel", "out/bias")}
a, b = weights(sys.argv[1]), weights(sys.argv[2])
assert len(a) == 4 and a == b, sorted(a)
EOF

# 3. errors before the first step
sed 's/    validation_split = 0.25//' "$tmp/cb.mpt" >"$tmp/noval.mpt"
run noval "$MPTC" train "$tmp/noval.mpt" --device interp --no-test
rc=$?
[ $rc = 1 ] || bad "val_loss without validation data: exit $rc, want 1"
has noval "noval.mpt:13:18: error: reduce_lr_on_plateau monitors 'val_loss', which this run does not log" ||
    bad "no located error for an unlogged monitor: $(cat "$tmp/noval.out")"
has noval "val_\* needs validation_split or validation_data" || bad "no hint for the monitor"
sed 's/sgd(learning_rate=0.5)/sgd(learning_rate=exponential_decay(0.5, 10, 0.9))/' "$tmp/cb.mpt" >"$tmp/sch.mpt"
run sch "$MPTC" train "$tmp/sch.mpt" --device interp --no-test
[ $? = 1 ] && has sch "cannot change a learning rate that a schedule sets" ||
    bad "reduce_lr_on_plateau under a schedule: $(cat "$tmp/sch.out")"
run badopt "$MPTC" train "$tmp/cb.mpt" --device interp --optimizer "adam(learning_rat=0.1)"
[ $? = 1 ] && has badopt "adam has no argument 'learning_rat'" && has badopt "did you mean 'learning_rate'" ||
    bad "--optimizer with a typo: $(cat "$tmp/badopt.out")"
run badsched "$MPTC" check "$tmp/sch.mpt" --optimizer "sgd(learning_rate=cosine_decay(0.1))"
[ $? != 0 ] && has badsched "cosine_decay needs decay_steps" || bad "a schedule without decay_steps: $(cat "$tmp/badsched.out")"

# 4. --optimizer and --learning-rate over the file, and on a resumed run
run over "$MPTC" train $M/ckpt_tiny.mpt --device cpu --no-test --epochs 1 \
    --optimizer "adamw(weight_decay=0.01)" --learning-rate 0.002 --log "$tmp/over.jsonl" --save "$tmp/over.st"
[ $? = 0 ] || bad "--optimizer adamw: $(tail -n 5 "$tmp/over.out")"
one_rate() { # LOG RATE: every step of the log ran at RATE (to f32)
  rates "$1" | sort -u | python3 -c "import sys; r = [float(l) for l in sys.stdin]; assert len(r) == 1 and abs(r[0] - $2) < 1e-9, r"
}
one_rate "$tmp/over.jsonl" 0.002 ||
    bad "--learning-rate 0.002 not used: $(rates "$tmp/over.jsonl" | sort -u | head -n 3)"
run resume "$MPTC" train $M/ckpt_tiny.mpt --device cpu --no-test --epochs 2 \
    --optimizer "adamw(weight_decay=0.01)" --learning-rate 0.0005 --resume "$tmp/over.st" --log "$tmp/res.jsonl"
[ $? = 0 ] || bad "resume with --learning-rate: $(tail -n 5 "$tmp/resume.out")"
one_rate "$tmp/res.jsonl" 0.0005 ||
    bad "--learning-rate on a resumed run not used: $(rates "$tmp/res.jsonl" | sort -u | head -n 3)"

# 5. augmentation on a thread beside the step: the same seed gives the same
#    run (losses to the bit), another seed another one; a bad augmentation
#    is an error before the first step
cat >"$tmp/aug.mpt" <<'EOF'
model small {
    input x: [28, 28, 1]
    conv2d c(filters=4, kernel=3, activation=relu)
    flatten
    dense out(units=10, activation=softmax)
}
train {
    data = fashion_mnist
    validation_split = 0.1
    metrics = [accuracy]
    batch_size = 32
    augment = [random_flip("horizontal"), random_translation(0.1, 0.1), random_rotation(0.03), random_contrast(0.2)]
}
EOF
losses() { grep '"event":"step"' "$1" | sed 's/.*"loss":\([^,}]*\).*/\1/'; }
for k in a b; do
  run aug-$k "$MPTC" train "$tmp/aug.mpt" --device cpu --no-test --steps-per-epoch 12 --seed 5 \
      --log "$tmp/aug-$k.jsonl" --tensorboard "$tmp/tb"
  [ $? = 0 ] || bad "augmented run $k: $(tail -n 5 "$tmp/aug-$k.out")"
done
run aug-c "$MPTC" train "$tmp/aug.mpt" --device cpu --no-test --steps-per-epoch 12 --seed 6 --log "$tmp/aug-c.jsonl"
run plain "$MPTC" train "$tmp/aug.mpt" --device cpu --no-test --steps-per-epoch 12 --seed 5 \
    --augment "[]" --log "$tmp/plain.jsonl"
[ "$(losses "$tmp/aug-a.jsonl" | wc -l)" = 12 ] || bad "augmented run: not 12 steps"
[ "$(losses "$tmp/aug-a.jsonl")" = "$(losses "$tmp/aug-b.jsonl")" ] || bad "the same seed gave another augmented run"
[ "$(losses "$tmp/aug-a.jsonl")" != "$(losses "$tmp/plain.jsonl")" ] || bad "augmentation changed nothing"
[ "$(losses "$tmp/aug-a.jsonl" | tail -n 11)" != "$(losses "$tmp/aug-c.jsonl" | tail -n 11)" ] || bad "another seed, the same augmented run"
run augbad "$MPTC" train "$tmp/aug.mpt" --device cpu --no-test --augment "random_crop(20, 20)"
[ $? = 1 ] && has augbad "random_translation" || bad "random_crop: $(cat "$tmp/augbad.out")"
run augflat "$MPTC" train tests/models/ckpt_tiny.mpt --device interp --no-test --augment "random_flip()"
[ $? = 1 ] && has augflat "augment" || bad "augmenting feature vectors: $(cat "$tmp/augflat.out")"

# 6. --tensorboard: Keras' layout and tags, read back with tensorboard's
#    own reader where it is installed
if python3 -c 'import tensorboard' 2>/dev/null; then
  python3 - "$tmp/tb" <<'EOF' || bad "the TensorBoard files do not read back as written"
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
def load(run):
    ea = EventAccumulator(sys.argv[1] + "/" + run, size_guidance={"scalars": 0, "histograms": 0})
    ea.Reload()
    return ea
tr, va = load("train"), load("validation")
tags = tr.Tags()["scalars"]
for t in ("batch_loss", "batch_learning_rate", "epoch_loss", "epoch_accuracy", "epoch_learning_rate"):
    assert t in tags, (t, tags)
assert set(tr.Tags()["histograms"]) >= {"c/kernel", "c/bias", "out/kernel", "out/bias"}, tr.Tags()
# two runs wrote into the same directories: two files each, 12 steps each
assert len([e for e in tr.Scalars("batch_loss")]) == 24
assert [e.step for e in va.Scalars("epoch_loss")] == [0, 0]
h = tr.Histograms("c/kernel")[0].histogram_value
assert h.num == 36 and h.min < h.max, h
EOF
  # --histogram-grads: the gradient step's histograms, the same on the
  # CPU JIT as on the interpreter (same batch, same weights; f32 sums in
  # another order: 1e-4)
  for dev in interp cpu; do
    run hg-$dev "$MPTC" train "$tmp/aug.mpt" --device $dev --no-test --steps-per-epoch 4 --epochs 1 \
        --tensorboard "$tmp/hg-$dev" --histogram-grads --histogram-every 2
    [ $? = 0 ] || bad "--histogram-grads on $dev: $(tail -n 5 "$tmp/hg-$dev.out")"
  done
  python3 - "$tmp/hg-interp/train" "$tmp/hg-cpu/train" <<'EOF' || bad "gradient histograms differ between interp and cpu"
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
def hists(path):
    ea = EventAccumulator(path, size_guidance={"histograms": 0}); ea.Reload()
    return {t: [(h.step, h.histogram_value) for h in ea.Histograms(t)]
            for t in ea.Tags()["histograms"] if t.startswith("grad/")}
a, b = hists(sys.argv[1]), hists(sys.argv[2])
assert sorted(a) == ["grad/c/bias", "grad/c/kernel", "grad/out/bias", "grad/out/kernel"], sorted(a)
for t in a:
    assert [s for s, _ in a[t]] == [2, 4] == [s for s, _ in b[t]], (t, a[t], b[t])
    for (_, x), (_, y) in zip(a[t], b[t]):
        scale = max(abs(x.min), abs(x.max))
        assert x.num == y.num and scale > 0, t
        for f in ("min", "max", "sum"):
            assert abs(getattr(x, f) - getattr(y, f)) <= 1e-4 * scale * (x.num if f == "sum" else 1), (t, f, x, y)
EOF
else
  echo "note: tensorboard is not installed: the read-back of --tensorboard is skipped"
fi
run hgnotb "$MPTC" train "$tmp/aug.mpt" --histogram-grads
[ $? = 2 ] && has hgnotb "add --tensorboard" || bad "--histogram-grads without --tensorboard: $(cat "$tmp/hgnotb.out")"

[ $fail = 0 ] && echo "train_controls: all passed"
exit $fail
