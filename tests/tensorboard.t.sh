#!/usr/bin/env bash
# TensorBoard event files (runtime/train/tensorboard.c) read back by the
# tensorboard package's own reader: build/tests/test_tensorboard --write
# writes scalars and histograms, then Python checks every record's framing
# and CRCs (with TensorBoard's CRC code, not ours), the file version, the
# tags, steps, wall times and values of the scalars, the histograms' count,
# min, max, sums and buckets against TensorFlow's bucketing redone here
# (its edges, runs of empty buckets collapsed, the outer ones left out),
# and what the histogram dashboard gets of them (EventFileLoader's
# migration). Skips (77) where python3 cannot import tensorboard.
set -u
MPTC=${MPTC:-build/mptc}
HELPER=${HELPER:-$(dirname "$MPTC")/tests/test_tensorboard}
[ -x "$HELPER" ] || { echo "FAIL: $HELPER not built (make $HELPER)"; exit 1; }
python3 -c 'import numpy, tensorboard' 2>/dev/null ||
  { echo "python3 cannot import tensorboard and numpy (pip install tensorboard)"; exit 77; }
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT

"$HELPER" --write "$tmp/logs/run1" "$tmp/values.f32" || { echo "FAIL: $HELPER --write failed"; exit 1; }

python3 - "$tmp/logs/run1" "$tmp/values.f32" <<'EOF'
import glob, math, struct, sys
import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.util import tensor_util

logdir, values = sys.argv[1], sys.argv[2]
fails = []
def check(ok, what):
    if not ok:
        fails.append(what)
        print("FAIL:", what)

files = glob.glob(logdir + "/events.out.tfevents.*")
if len(files) != 1:
    sys.exit("FAIL: want one event file in %s, got %r" % (logdir, files))
path = files[0]

# 1. framing: length, masked CRC of the length, data, masked CRC of the data
raw = open(path, "rb").read()
pos, n_records = 0, 0
while pos < len(raw):
    head = raw[pos:pos + 8]
    (n,) = struct.unpack("<Q", head)
    (crc_len,) = struct.unpack("<I", raw[pos + 8:pos + 12])
    data = raw[pos + 12:pos + 12 + n]
    (crc_data,) = struct.unpack("<I", raw[pos + 12 + n:pos + 16 + n])
    check(crc_len == masked_crc32c(head), "record %d: length crc" % n_records)
    check(len(data) == n and crc_data == masked_crc32c(data), "record %d: data crc" % n_records)
    pos += 16 + n
    n_records += 1
check(pos == len(raw), "the file ends inside a record")
check(n_records == 1 + 5 + 2 + 3, "%d records, want 11" % n_records)

events = list(EventFileLoader(path).Load())
check(len(events) == n_records, "EventFileLoader read %d events of %d" % (len(events), n_records))
check(events and events[0].file_version == "brain.Event:2", "file_version %r" % (events and events[0].file_version))

# 2. scalars
acc = EventAccumulator(logdir, size_guidance={"scalars": 0, "histograms": 0})
acc.Reload()
tags = acc.Tags()
check(sorted(tags["scalars"]) == ["acc", "loss"], "scalar tags %r" % tags["scalars"])
check(sorted(tags["histograms"]) == ["empty", "w"], "histogram tags %r" % tags["histograms"])
def scalars(tag):
    return acc.Scalars(tag) if tag in tags["scalars"] else []
def histograms(tag):
    return acc.Histograms(tag) if tag in tags["histograms"] else []
loss = scalars("loss")
check([e.step for e in loss] == [1, 2, 3, 4, 5], "loss steps %r" % [e.step for e in loss])
check([e.wall_time for e in loss] == [1001, 1002, 1003, 1004, 1005], "loss wall times")
check(all(e.value == np.float32(1.0 / e.step) for e in loss), "loss values %r" % [e.value for e in loss])
check([(e.step, e.value) for e in scalars("acc")] == [(0, 0.0), (1, 0.5)],
      "acc %r" % [(e.step, e.value) for e in scalars("acc")])

# 3. histograms: TensorFlow's Histogram (lib/histogram/histogram.cc) redone
pos_edges, v = [], 1.0e-12
while v < 1.0e20:
    pos_edges.append(v)
    v *= 1.1
pos_edges.append(sys.float_info.max)
edges = np.array([-x for x in reversed(pos_edges)] + [0.0] + pos_edges)

def tf_histogram(x):
    x = x[np.isfinite(x)].astype(np.float64)
    counts = np.bincount(np.searchsorted(edges, x, side="right"), minlength=len(edges)).astype(float)
    # runs of empty buckets collapse into one, those at the ends are left out
    full = np.nonzero(counts)[0]
    lims, cnts = [], []
    i, last = (full[0], full[-1]) if len(full) else (0, -1)
    while i <= last:
        end, c = edges[i], counts[i]
        i += 1
        if c <= 0:
            while counts[i] <= 0:
                end = edges[i]
                i += 1
        lims.append(end)
        cnts.append(c)
    if not lims:
        lims, cnts = [sys.float_info.max], [0.0]
    s = sq = 0.0
    for t in x:
        s += t
        sq += t * t
    lo, hi = (x.min(), x.max()) if len(x) else (0.0, 0.0)
    return dict(min=lo, max=hi, num=len(x), sum=s, sum_squares=sq, bucket_limit=lims, bucket=cnts)

vals = np.fromfile(values, dtype=np.float32)
half = len(vals) // 2
w = histograms("w")
check([e.step for e in w] == [1, 2], "w steps %r" % [e.step for e in w])
for e, x in zip(w, [vals[:half], vals[half:]]):
    got, want = e.histogram_value, tf_histogram(x)
    for k in ("min", "max", "num", "sum", "sum_squares"):
        check(math.isclose(getattr(got, k), want[k], rel_tol=1e-12, abs_tol=1e-300),
              "w step %d: %s %r, want %r" % (e.step, k, getattr(got, k), want[k]))
    check(list(got.bucket_limit) == want["bucket_limit"], "w step %d: bucket limits differ" % e.step)
    check(list(got.bucket) == want["bucket"], "w step %d: bucket counts differ" % e.step)
    # readers that put min and max at the outer edges draw no bucket backwards
    check(got.bucket[0] > 0 and got.bucket[-1] > 0, "w step %d: an empty outer bucket" % e.step)
check(w and w[0].histogram_value.num == half - 3, "the NaN and infinities were not left out")
empty = [e.histogram_value for e in histograms("empty")]
check(len(empty) == 1 and empty[0].num == 0 and list(empty[0].bucket) == [0.0] and
      list(empty[0].bucket_limit) == [sys.float_info.max],
      "empty histogram: %r" % [(h.num, len(h.bucket)) for h in empty])

# 4. what the histogram dashboard draws: EventFileLoader hands it the
#    histograms migrated (data_compat) to [left, right, count] rows, which
#    must run from min to max and hold every finite value
raw = {e.step: e.histogram_value for e in w}
for ev in events:
    for value in ev.summary.value:
        if value.tag != "w" or ev.step not in raw:
            continue
        h = raw[ev.step]
        b = tensor_util.make_ndarray(value.tensor)
        check(value.metadata.plugin_data.plugin_name == "histograms", "step %d: not a histogram" % ev.step)
        check(b.shape[1] == 3 and b[:, 2].sum() == h.num, "step %d: dashboard counts %s" % (ev.step, b[:, 2].sum()))
        check(b[0, 0] == np.float32(h.min) and b[-1, 1] == np.float32(h.max), "step %d: dashboard range" % ev.step)
        check(bool(np.all(b[:, 0] <= b[:, 1])), "step %d: a bucket runs backwards" % ev.step)
sys.exit(1 if fails else 0)
EOF
rc=$?
[ $rc = 0 ] && echo "tensorboard.t.sh: ok"
exit $rc
