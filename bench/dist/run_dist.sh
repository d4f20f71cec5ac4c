#!/usr/bin/env bash
# Data-parallel scaling on this machine, side by side in one run: mptc as
# one process of 2 threads against `mpirun -np 2` ranks of 1 thread (with
# the gradient sums overlapped with the backward pass, and blocking:
# MPTC_OVERLAP=0), next to PyTorch DistributedDataParallel with gloo in the
# same shapes (bench/dist/ddp_peer.py), the same global batch, optimizer
# and synthetic data. Each round first checks that the machine is quiet
# (`mptc devices --quiet-check`: every core's FMA rate against one core's)
# and says so in the table; a busy round is marked, not dropped.
#
#   bench/dist/run_dist.sh [--models "mlp_cpu convnet"] [--rounds N] [--steps N]
#
# Prints a markdown table (each cell the fastest round's median step) and
# the notes; docs/BENCHMARKS.md's "Data parallelism" section is a copy.
set -u
cd "$(dirname "$0")/../.."
MPTC=${MPTC:-build/mptc}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-build/bench-dist}
models="mlp_cpu convnet"
rounds=2
steps=20
warmup=5
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models=$2; shift 2;;
    --rounds) rounds=$2; shift 2;;
    --steps) steps=$2; shift 2;;
    *) echo "run_dist: unknown argument '$1'" >&2; exit 2;;
  esac
done
mkdir -p "$OUT"
MPI=(mpirun --oversubscribe -np 2 --bind-to none)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
mpt_file() {
  case "$1" in
    mlp_cpu) echo examples/mlp_cpu.mpt;;
    convnet) sed 's/256, 256, 3/64, 64, 3/g' examples/convnet.mpt >"$OUT/convnet_64.mpt"; echo "$OUT/convnet_64.mpt";;
  esac
}
batch_of() { case "$1" in mlp_cpu) echo 512;; convnet) echo 32;; esac; }
data_of() { case "$1" in mlp_cpu) echo "synthetic(shape=[784], classes=10, samples=65536)";;
                          convnet) echo "synthetic(shape=[64, 64, 3], classes=10, samples=4096)";; esac; }
# median ms of the steps after the warm-up, from a --log file
median_ms() {
  "$PYTHON" - "$1" "$warmup" <<'PY'
import json, statistics, sys
ms = [json.loads(l)["ms"] for l in open(sys.argv[1]) if '"event":"step"' in l]
print(round(statistics.median(ms[int(sys.argv[2]):]), 3) if len(ms) > int(sys.argv[2]) else "nan")
PY
}
results="$OUT/results.txt"
: >"$results"
for round in $(seq 1 "$rounds"); do
  q=$("$MPTC" devices --quiet-check); qrc=$?
  echo "round $round: $q" | tee -a "$OUT/quiet.txt"
  for m in $models; do
    f=$(mpt_file "$m"); b=$(batch_of "$m"); d=$(data_of "$m")
    T=(--device cpu --no-test --quiet --validation-split 0 --batch-size "$b" --max-steps $((warmup + steps)) --data "$d")
    "$MPTC" train "$f" "${T[@]}" --threads 2 --log "$OUT/one.jsonl" >/dev/null 2>&1
    one=$(median_ms "$OUT/one.jsonl")
    "${MPI[@]}" "$MPTC" train "$f" "${T[@]}" --threads 1 --log "$OUT/two.jsonl" --profile >"$OUT/two.out" 2>&1
    two=$(median_ms "$OUT/two.jsonl")
    comm=$(grep -o 'communication: [0-9]* allreduce kernels, [0-9.]* ms/step, [0-9.]*%' "$OUT/two.out" | head -1 | sed 's/.*kernels, //')
    MPTC_OVERLAP=0 "${MPI[@]}" -x MPTC_OVERLAP "$MPTC" train "$f" "${T[@]}" --threads 1 --log "$OUT/block.jsonl" >/dev/null 2>&1
    block=$(median_ms "$OUT/block.jsonl")
    t1=$("$PYTHON" bench/dist/ddp_peer.py --model "$m" --ranks 1 --threads 2 --batch "$b" --steps "$steps" --warmup "$warmup" 2>/dev/null | tail -1)
    t2=$("$PYTHON" bench/dist/ddp_peer.py --model "$m" --ranks 2 --threads 1 --batch "$b" --steps "$steps" --warmup "$warmup" 2>/dev/null | tail -1)
    echo "$round $qrc $m $b one=$one two=$two block=$block comm=[$comm] torch1=$t1 torch2=$t2" | tee -a "$results"
  done
done
"$PYTHON" - "$results" "$OUT/quiet.txt" <<'PY'
import json, re, sys
rows = {}
for line in open(sys.argv[1]):
    parts = line.split(" ", 4)
    rnd, qrc, m, b, rest = parts[0], int(parts[1]), parts[2], parts[3], parts[4]
    def val(k):
        mm = re.search(k + r"=(\S+)", rest)
        try: return float(mm.group(1))
        except Exception: return float("nan")
    def torch(k):
        mm = re.search(k + r"=(\{.*?\})", rest)
        try: return json.loads(mm.group(1))
        except Exception: return {}
    comm = re.search(r"comm=\[([^\]]*)\]", rest).group(1)
    t1, t2 = torch("torch1"), torch("torch2")
    r = dict(one=val("one"), two=val("two"), block=val("block"), comm=comm,
             t1=t1.get("ms_per_step", float("nan")), t2=t2.get("ms_per_step", float("nan")),
             t2nc=t2.get("ms_without_reduction", float("nan")), quiet=qrc == 0, torch=t1.get("torch", "?"))
    best = rows.get(m)
    if best is None or (r["two"] == r["two"] and (best["two"] != best["two"] or r["two"] < best["two"])):
        rows[m] = dict(r, batch=b)
print("| model | batch | mptc 1x2 ms | mptc 2x1 ms | comm ms/step (share) | 2x1 blocking ms | DDP 1x2 ms | DDP 2x1 ms | DDP 2x1 no_sync ms | DDP/mptc 2x1 | quiet |")
print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|")
for m, r in rows.items():
    ratio = r["t2"] / r["two"] if r["two"] else float("nan")
    print(f"| {m} | {r['batch']} | {r['one']:.1f} | {r['two']:.1f} | {r['comm'] or '-'} | {r['block']:.1f} | {r['t1']:.1f} | {r['t2']:.1f} | {r['t2nc']:.1f} | {ratio:.2f}x | {'yes' if r['quiet'] else 'no'} |")
print()
print("quiet checks: " + "; ".join(l.strip() for l in open(sys.argv[2])))
PY
