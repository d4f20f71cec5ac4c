#!/usr/bin/env bash
# make bench-peers: mptc and every peer framework installed here (PyTorch,
# TensorFlow/Keras, JAX) train the same models on the same synthetic data,
# pinned to the same cores with the same thread count, one after another in
# one run; bench/peers/report.py writes the table and the chart into the
# "Peers" section of docs/BENCHMARKS.md. A missing peer is skipped with a note.
#
#   bench/run_peers.sh [--device cpu|cuda] [--threads N] [--models "mlp_cpu convnet resnet50 gpt_tiny"]
#                      [--policies float32,mixed_bfloat16] [--steps N] [--warmup N]
#                      [--mptc-steps N] [--mptc-warmup N] [--rounds N] [--no-repeat-busy]
#                      [--no-doc] [--tf32] [--cores LIST] [--isa host|avx2]
# --no-doc leaves the doc alone; $OUT/report.sh writes the table later.
#
# --cores LIST pins every process to those cores (taskset's list: "1",
# "0-1"); without it, the first --threads cores.
#
# --isa avx2 runs every side as on an AVX2-only CPU (no AVX-512): mptc
# compiles for AVX2 (MPTC_CPU_ISA=avx2), PyTorch's own kernels take their
# AVX2 build (ATEN_CPU_CAPABILITY=avx2) and oneDNN, which runs PyTorch's
# and TensorFlow's convolutions and matmuls, stops at AVX2
# (ONEDNN_MAX_CPU_ISA=AVX2), and so does MKL, which runs PyTorch's matmuls
# and its stride-1 1x1 convolutions (MKL_ENABLE_INSTRUCTIONS=AVX2: without
# it they ran at 1.5x the AVX2 peak); OpenBLAS takes its Haswell kernels
# (OPENBLAS_CORETYPE=Haswell). The PyTorch rows say which capability ran.
# JAX is skipped: XLA_FLAGS=--xla_cpu_max_isa=AVX2 does not reach its
# matmuls (the MLP's ran at 115 GFLOP/s on one core with it, above the
# 96 of AVX2's FMA loop there, and as fast as without it).
#
# Every peer runs under $PYTHON (python3) unless TORCH_PYTHON, TF_PYTHON or
# JAX_PYTHON name another interpreter for it (TensorFlow often lives in a
# virtual environment of its own).
#
# On a GPU, float32 is true fp32 on every side (PyTorch's, TensorFlow's and
# JAX's TF32 defaults turned off); --tf32 runs every side's f32 GEMMs and
# convolutions on TF32 Tensor Cores instead (mptc --tf32).
#
# --rounds N runs the whole sequence N times and keeps each cell's fastest
# round. A round takes the models one at a time, each in mptc and then in
# every peer, so that a row's cells are measured minutes apart: on a shared
# machine a neighbour's load (or the host's own drift) slows whoever runs at
# that moment, and the best of interleaved rounds is the fairest reading for
# every column alike. Notes repeated by later rounds are written once
# (report.py).
#
# mptc is timed with the same --steps and --warmup as the peers unless
# --mptc-steps / --mptc-warmup say otherwise (the notes say which).
#
# A figure taken under load is not a figure: on the CPU, `mptc devices
# --quiet-check` runs before and after every round (every core's FMA rate
# against one core's; exit 3 when they are not about N times one core's).
# A round that fails either check is marked busy and run once more
# (--no-repeat-busy: not); report.py prefers each cell's quiet rounds and
# marks with a dagger every cell that only busy rounds measured.
set -u
cd "$(dirname "$0")/.."

device=cpu
threads=2
# every model of the published table: a run of fewer rewrites the table
# with only those (use --no-doc for a partial run)
models="mlp_cpu convnet resnet50 gpt_tiny"
policies=float32,mixed_bfloat16
steps=10
warmup=3
# mptc: the peers' steps and warm-up unless given (empty: the same)
mptc_steps=
mptc_warmup=
rounds=1
repeat_busy=1
write_doc=1
tf32=0
cores=
isa=host
MPTC=${MPTC:-build/mptc}
PYTHON=${PYTHON:-python3}
TORCH_PYTHON=${TORCH_PYTHON:-$PYTHON}
TF_PYTHON=${TF_PYTHON:-$PYTHON}
JAX_PYTHON=${JAX_PYTHON:-$PYTHON}
OUT=${OUT:-build/bench-peers}
DOC=${DOC:-docs/BENCHMARKS.md}

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2;;
    --threads) threads=$2; shift 2;;
    --models) models=$2; shift 2;;
    --policies) policies=$2; shift 2;;
    --steps) steps=$2; shift 2;;
    --warmup) warmup=$2; shift 2;;
    --mptc-steps) mptc_steps=$2; shift 2;;
    --mptc-warmup) mptc_warmup=$2; shift 2;;
    --rounds) rounds=$2; shift 2;;
    --no-repeat-busy) repeat_busy=0; shift;;
    --no-doc) write_doc=0; shift;;
    --tf32) tf32=1; shift;;
    --cores) cores=$2; shift 2;;
    --isa) isa=$2; shift 2;;
    -h|--help) usage; exit 0;;
    *) echo "run_peers: unknown argument '$1'" >&2; usage >&2; exit 2;;
  esac
done
case "$device" in cpu|cuda) ;; *) echo "run_peers: --device is cpu or cuda, not '$device'" >&2; exit 2;; esac
case "$isa" in host|avx2) ;; *) echo "run_peers: --isa is host or avx2, not '$isa'" >&2; exit 2;; esac
case "$rounds" in ''|*[!0-9]*|0) echo "run_peers: --rounds is a positive whole number, not '$rounds'" >&2; exit 2;; esac
mptc_steps=${mptc_steps:-$steps}
mptc_warmup=${mptc_warmup:-$warmup}

mkdir -p "$OUT"
load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)
rows="$OUT/peers.jsonl"
: >"$rows"
notes=()
mptc_json=()
busy_args=()

# Same cores and thread count for everyone: taskset pins each process, and
# each framework is also told the count (OpenMP, intra-op pools).
pin=()
if [ "$device" = cpu ] && command -v taskset >/dev/null 2>&1 && [ "$threads" -le "$(nproc)" ]; then
  pin=(taskset -c "${cores:-0-$((threads - 1))}")
else
  notes+=("processes were not pinned to cores (taskset missing, or --threads above the core count)")
fi
export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
if [ "$isa" = avx2 ]; then
  [ "$device" = cpu ] || { echo "run_peers: --isa avx2 is for --device cpu" >&2; exit 2; }
  export MPTC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell \
    MKL_ENABLE_INSTRUCTIONS=AVX2
  notes+=("every side limited to AVX2 (--isa avx2): MPTC_CPU_ISA=avx2, ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2, MKL_ENABLE_INSTRUCTIONS=AVX2, OPENBLAS_CORETYPE=Haswell")
  notes+=("jax: skipped under --isa avx2: XLA's --xla_cpu_max_isa=AVX2 does not limit its matmuls (they ran above the AVX2 FMA peak with it)")
  # the doc's CPU table is the host's own: an AVX2 run writes it only
  # through $OUT/report.sh, into a file of the caller's choosing
  if [ "$write_doc" = 1 ]; then
    write_doc=0
    echo "run_peers: --isa avx2 leaves $DOC's host table alone (bash $OUT/report.sh FILE writes this run's)"
  fi
fi

# The .mpt file of a model at this device's size: the convnet is 64x64x3 on
# the CPU (seed 000's 256x256x3 takes minutes per step there).
mpt_file() {
  case "$1" in
    mlp_cpu) echo examples/mlp_cpu.mpt;;
    mnist_mlp) echo examples/mnist_mlp.mpt;;
    resnet50) echo examples/resnet50.mpt;;
    convnet)
      if [ "$device" = cpu ]; then
        sed 's/256, 256, 3/64, 64, 3/g' examples/convnet.mpt >"$OUT/convnet_64.mpt"
        echo "$OUT/convnet_64.mpt"
      else
        echo examples/convnet.mpt
      fi;;
    gpt_tiny)
      # the context of docs/BENCHMARKS.md "Fused attention on the CPU": 512
      # byte ids (the file's 128), the position table as long
      sed -e 's/input bytes: \[128\]/input bytes: [512]/' -e 's/max_length=128/max_length=512/' \
          examples/gpt_tiny.mpt >"$OUT/gpt_tiny_512.mpt"
      grep -q 'input bytes: \[512\]' "$OUT/gpt_tiny_512.mpt" && grep -q 'max_length=512' "$OUT/gpt_tiny_512.mpt" ||
        { echo "run_peers: examples/gpt_tiny.mpt no longer says 'input bytes: [128]' and 'max_length=128'; update mpt_file" >&2; return 1; }
      echo "$OUT/gpt_tiny_512.mpt";;
    *) return 1;;
  esac
}
# the batch of bench/peers/common.py: ResNet-50 is 256 on a GPU, 8 on the CPU
batch_of() {
  case "$1" in
    mlp_cpu) echo 512;; mnist_mlp) echo 8192;; convnet) echo 32;; gpt_tiny) echo 4;;
    resnet50) if [ "$device" = cpu ]; then echo 8; else echo 256; fi;;
  esac
}

peer_args=(--device "$device" --threads "$threads" --policy "$policies" --steps "$steps" --warmup "$warmup")
mptc_tf32=()
# mptc's default is every core it may run on; the peers are told --threads
mptc_threads=()
[ "$device" = cpu ] && mptc_threads=(--threads "$threads")
if [ "$tf32" = 1 ]; then peer_args+=(--tf32); mptc_tf32=(--tf32); fi
if [ "$device" = cuda ]; then
  if [ "$tf32" = 1 ]; then notes+=("float32: f32 GEMMs and convolutions on TF32 Tensor Cores on every side (--tf32)")
  else notes+=("float32: true fp32 on every side (TF32 off in PyTorch, TensorFlow and JAX; mptc without --tf32)"); fi
fi

run_peer() { # name module script model python
  local name=$1 module=$2 script=$3 model=$4 py=$5
  echo "== $name $model"
  if ! command -v "$py" >/dev/null 2>&1; then notes+=("$name: skipped: $py is not installed"); return; fi
  if ! "$py" -c "import numpy, $module" >/dev/null 2>&1; then
    notes+=("$name: skipped: the Python module '$module' (or numpy) is not installed for $py")
    echo "skipped: $module is not installed for $py"
    return
  fi
  "${pin[@]}" "$py" "bench/peers/$script" "${peer_args[@]}" --model "$model" | tee -a "$rows"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || notes+=("$name: the peer script exited $rc")
  local v
  v=$("$py" -c "import $module as m; print(m.__version__)" 2>/dev/null) && notes+=("$name $v")
}
# Model by model: mptc, then every peer on the same model, so that the cells
# of a row are measured minutes apart rather than a whole round apart (the
# host's speed drifts within a round).
# quiet_check WHEN: runs `mptc devices --quiet-check` on the CPU, records
# its line in the notes, and sets busy=1 when it says busy
quiet_check() {
  local q rc
  q=$("$MPTC" devices --quiet-check 2>&1)
  rc=$?
  echo "$q"
  case "$rc" in
    0) ;;
    3) busy=1;;
    *) q="the check failed (exit $rc), so the round counts as busy: $q"; busy=1;;
  esac
  notes+=("round $round, $1 it: $q")
}
total=$rounds # grows by one for each planned round found busy (its repeat)
round=0
checked=0
while [ "$round" -lt "$total" ]; do
round=$((round + 1))
echo "== round $round of $total"
echo "{\"round\": $round}" >>"$rows" # report.py: the rows below are this round's
busy=0
if [ "$device" = cpu ] && [ -x "$MPTC" ]; then
  checked=1
  quiet_check before
fi
for m in $models; do
  if [ -x "$MPTC" ]; then
    echo "== mptc $m ($MPTC)"
    f=$(mpt_file "$m") || { notes+=("mptc: unknown model $m"); continue; }
    rm -f "$OUT/mptc_$m.r$round.json"
    "${pin[@]}" "$MPTC" bench "$f" --device "$device" --policy "$policies" --batch-sizes "$(batch_of "$m")" \
        "${mptc_threads[@]}" --steps "$mptc_steps" --warmup "$mptc_warmup" "${mptc_tf32[@]}" --json "$OUT/mptc_$m.r$round.json"
    rc=$?
    [ "$m" = convnet ] && [ "$device" = cpu ] &&
      notes+=("mptc convnet: examples/convnet.mpt with its input (and synthetic data) at 64x64x3")
    [ "$m" = gpt_tiny ] &&
      notes+=("mptc gpt_tiny: examples/gpt_tiny.mpt with \`input bytes: [512]\` and max_length=512 (the file says 128); its synthetic data: 512 token ids and a class at every position, the same on every side")
    grep -q '"backend":[[:space:]]*"interp"' "$OUT/mptc_$m.r$round.json" 2>/dev/null && on_interp=1
    if [ -s "$OUT/mptc_$m.r$round.json" ]; then mptc_json+=(--mptc "$m@$round=$OUT/mptc_$m.r$round.json")
    else notes+=("mptc: $m did not run (exit $rc)"); fi
  fi
  run_peer pytorch torch torch_peer.py "$m" "$TORCH_PYTHON"
  run_peer tensorflow tensorflow tf_peer.py "$m" "$TF_PYTHON"
  [ "$isa" = avx2 ] || run_peer jax jax jax_peer.py "$m" "$JAX_PYTHON"
done
if [ "$device" = cpu ] && [ -x "$MPTC" ]; then
  quiet_check after
  if [ "$busy" = 1 ]; then
    busy_args+=(--busy-round "$round")
    if [ "$repeat_busy" = 1 ] && [ "$round" -le "$rounds" ]; then
      total=$((total + 1))
      notes+=("round $round was busy: it is marked, and round $total repeats it")
    else
      notes+=("round $round was busy: it is marked")
    fi
  fi
fi
if [ -x "$MPTC" ]; then
  [ -n "${on_interp:-}" ] &&
    notes+=("mptc ran on the reference interpreter (every op in double precision, rounded to its dtype, one thread): it is the correctness oracle, not a fast backend, and fused and unfused plans run alike there")
  if [ "$mptc_steps" = "$steps" ] && [ "$mptc_warmup" = "$warmup" ]; then
    notes+=("every side: $steps timed steps after $warmup warm-up steps, the median reported (the peers' warm-up includes their JIT compilation; mptc compiles before its warm-up)")
  else
    notes+=("mptc: $mptc_steps timed steps after $mptc_warmup warmup (--mptc-steps/--mptc-warmup); the peers: $steps after $warmup (their warmup includes their JIT compilation)")
  fi
else
  notes+=("mptc: $MPTC is not built (run make)")
fi
done
[ "$device" = cpu ] && [ "$checked" != 1 ] &&
  notes+=("the rounds were not checked for load (\`mptc devices --quiet-check\` did not run): a busy round could not be marked")
notes+=("data: every side trains on the same values, mptc's synthetic(...) data (per-class centroids plus noise, learnable; for token models, each id the class's own token half the time, a class at every position): \`mptc bench\` makes two batches of it and alternates them, and bench/peers/common.py computes the same two batches bit for bit (a numpy port of runtime/data's generator) and alternates them the same way")

[ "$total" -gt 1 ] &&
  notes+=("each cell is its fastest of $total rounds (of its quiet rounds where it has any); a round runs each model in mptc and then in every peer before the next model, so a busy moment on the shared machine slows one round, not one column")
notes+=("load average (1, 5, 15 min) before the run: ${load_before:-?}, after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null); anything else running on these cores slows every column")
machine=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')
[ "$device" = cuda ] && command -v nvidia-smi >/dev/null 2>&1 &&
  machine="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) (host: $machine)"
note_args=()
for n in "${notes[@]}"; do note_args+=(--note "$n"); done
# The report command with everything this run found (its notes, quiet
# checks, commit), saved so that a --no-doc run, or one whose doc step
# failed, can write the table later: `bash $OUT/report.sh [DOC]`.
report=("$PYTHON" bench/peers/report.py --rows "$rows" "${mptc_json[@]}" "${busy_args[@]}"
  --png "docs/bench/peers_$device.png" --device "$device" --machine "${machine:-unknown}"
  --threads "$threads" --date "$(date +%F)" --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  "${note_args[@]}")
{ echo "# written by bench/run_peers.sh; run from the repository root: bash $OUT/report.sh [DOC]"
  printf '%q ' "${report[@]}"; printf -- '--doc "${1:-%s}"\n' "$DOC"; } >"$OUT/report.sh"
[ "$write_doc" = 1 ] || { echo "results in $OUT; bash $OUT/report.sh writes them into $DOC"; exit 0; }
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "run_peers: $PYTHON is needed to write $DOC; the raw results are in $OUT" >&2
  exit 1
fi
"${report[@]}" --doc "$DOC"
