#!/usr/bin/env bash
# Runs mptc on the lent GPU machine from the bundle that scripts/gpu_bundle.sh
# made in .gpu/ (docs/GPU.md); nothing is compiled there. Run it from the
# repository root:
#   bash scripts/gpu_run.sh [all|tests|cuda|peers]
#     all    (default) tests, then cuda; about 6 minutes on an H100 (estimated)
#     tests  `mptc devices` and the test suite (what `make test-gpu` runs),
#            up to 8 programs at once
#     cuda   `mptc devices`, short CUDA trainings on Fashion-MNIST,
#            `mptc bench` across policies, and a --profile of the MLP
#            (per-kernel times against the measured ceilings)
#     first  what a session with a GPU runs first, in one call, within
#            $GPU_BUDGET seconds (default 480): library preflight,
#            test_cuda_steps --gpu one model a process (a failing model
#            again with MPTC_CUDA_SYNC=1), the same with wgmma on sm_90,
#            test_cuda_gpu, test_cuda_nccl --gpu, three trainings, the MLP and convnet benches,
#            the peers, ResNet-50 against PyTorch if time is left; every
#            step's limit is cut to the time left, and the logs go to
#            $OUT/first.tgz after every step (a run cut off still returns
#            them) beside summary.txt
#     peers  mptc beside PyTorch and JAX (bench/run_peers.sh --device cuda)
#            on $PEER_MODELS (default "mnist_mlp convnet"; resnet50 takes
#            minutes to compile in the peers), float32 and mixed_float16:
#            the Peers section as it would be written, in
#            $OUT/BENCHMARKS.md, the chart, and the raw results
# Results go to $OUT (the device tool's folder, at most 8 files), or to
# build/gpu-out where OUT is unset; summary.txt grows step by step, so a run
# cut off by the tool's 10-minute limit still says how far it got. Where no
# GPU is usable the CUDA steps are skipped with a note, so the script also
# runs on a machine without one.
set -uo pipefail
cd "$(dirname "$0")/.."

MODE=${1:-all}
BUNDLE=.gpu
BIN=build/gpu              # relative: tests/run_all.sh sets MPTC=$PWD/$BIN/mptc
FM_DIR=$PWD/$BUNDLE/fashion-mnist
FM_DEFAULT=/usr/share/datasets/fashion-mnist   # MPT_DATA_FASHION_MNIST_DIR
OUT=${OUT:-$PWD/build/gpu-out}
MPTC=$PWD/$BIN/mptc
DATA="fashion_mnist(dir=\"$FM_DIR\")"

die() { echo "gpu_run: $1" >&2; [ $# -lt 2 ] || echo "  hint: $2" >&2; exit 1; }
case "$MODE" in all|tests|cuda|first|peers) ;;
    *) die "unknown mode '$MODE'" "bash scripts/gpu_run.sh [all|tests|cuda|first|peers]";; esac

# every step ends by this many seconds from the start (first: $GPU_BUDGET)
DEADLINE=$((SECONDS + ${GPU_BUDGET:-$([ "$MODE" = first ] && echo 480 || echo 100000)}))
LOGS=$OUT                  # first: a folder packed into $OUT/first.tgz
[ "$MODE" != first ] || LOGS=/tmp/gpu-first

failed=0
# note STEP STATUS SECONDS: one row of the summary table, written at once.
note() {
    printf '%-44s %-6s %s\n' "$1" "$2" "$3" | tee -a "$OUT/summary.txt"
    [ "$2" != FAIL ] || failed=1
    [ "$MODE" != first ] || tar -C "$LOGS" -czf "$OUT/first.tgz" . 2>/dev/null || true
}

# step NAME LOGFILE LIMIT_S COMMAND...: runs COMMAND, appending its output to
# LOGFILE and to stdout, and records PASS/FAIL and the seconds it took; the
# limit is cut to the time left before the deadline (SKIP when none is).
# Returns the command's status.
step() {
    local name=$1 log=$2 limit=$3; shift 3
    local t0=$SECONDS rc left=$((DEADLINE - SECONDS))
    if [ "$left" -lt 10 ]; then note "$name" SKIP "no time left"; return 1; fi
    [ "$limit" -le "$left" ] || limit=$left
    { echo; echo "== $name"; echo "\$ $*"; } | tee -a "$log"
    timeout "$limit" "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    [ "$rc" -ne 124 ] || echo "gpu_run: '$name' stopped after ${limit}s" | tee -a "$log"
    if [ "$rc" -eq 0 ]; then note "$name" PASS $((SECONDS - t0))
    else note "$name" FAIL "$((SECONDS - t0)) (exit $rc)"; fi
    return "$rc"
}

unpack() {
    [ -f "$BUNDLE/mptc-bin.tar.xz" ] ||
        die "no bundle in $BUNDLE/" "run 'make package-gpu' on a machine with LLVM and carry [\".gpu\"]"
    (cd "$BUNDLE" && sed -n 's/^  \([0-9a-f]\{64\}  \)/\1/p' MANIFEST | sha256sum --quiet -c -) ||
        die "the bundle does not match its MANIFEST (a partial copy?)" "run 'make package-gpu' again"
    local sum; sum=$(sha256sum "$BUNDLE/mptc-bin.tar.xz" | cut -d' ' -f1)
    if [ "$(cat "$BIN/.bundle" 2>/dev/null)" = "$sum" ] && [ -x "$MPTC" ]; then return; fi
    rm -rf "$BIN"; mkdir -p "$BIN"
    if command -v xz >/dev/null; then
        tar -C "$BIN" -xJf "$BUNDLE/mptc-bin.tar.xz" || die "could not unpack the bundle"
    else   # some images lack xz; Python's tarfile reads it
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
            "$BUNDLE/mptc-bin.tar.xz" "$BIN" || die "could not unpack the bundle" "install xz-utils"
    fi
    echo "$sum" >"$BIN/.bundle"
}

# Tests that read the default data folder (test_data, train_fashion.t.sh) skip
# without it; on the throwaway GPU machine, as root, point it at the bundle's copy.
link_default_data() {
    [ -e "$FM_DEFAULT" ] && return
    [ -f "$FM_DIR/train-images-idx3-ubyte.gz" ] || return
    if mkdir -p "$(dirname "$FM_DEFAULT")" 2>/dev/null && ln -s "$FM_DIR" "$FM_DEFAULT" 2>/dev/null; then
        echo "gpu_run: linked $FM_DEFAULT -> $FM_DIR"
    else
        echo "gpu_run: note: cannot create $FM_DEFAULT; tests that read it will skip"
    fi
}

run_tests() {
    local log=$OUT/tests.txt out jobs limit
    # the suite takes about 7 minutes on 2 cores one program at a time; here
    # several at once (MPTC_TEST_JOBS), and alone ("tests") it may take
    # most of the tool's 10 minutes
    jobs=$(nproc 2>/dev/null || echo 4); [ "$jobs" -le 8 ] || jobs=8
    if [ "$MODE" = tests ]; then limit=540; else limit=270; fi
    step "test suite (tests/run_all.sh)" "$log" "$limit" \
        env MPTC_TEST_JOBS="$jobs" bash tests/run_all.sh "$BIN"
    # Each program's own output, for the failures and skips above.
    for f in "$BIN"/*.log; do [ -e "$f" ] && { echo "== $f"; cat "$f"; }; done >"$OUT/test_logs.txt"
    # A GPU that is there but unused by the CUDA tests is a failure, not a skip.
    if [ "$has_gpu" = 1 ] && grep -q '^SKIP test_cuda_gpu' "$log"; then
        note "test_cuda_gpu ran on the GPU" FAIL "skipped although mptc sees a GPU"
    fi
    # Three train steps and the evaluation step of seven small models under
    # each policy, every generated kernel and cuBLASLt call on the GPU,
    # against the interpreter (what test_cuda_steps does with host builds)
    if [ "$has_gpu" = 1 ]; then
        step "test_cuda_steps --gpu (whole steps)" "$log" 240 "$BIN/tests/test_cuda_steps" --gpu
        # the sm_90 wgmma kernels (opt-in until this passes and is timed)
        if "$MPTC" devices 2>/dev/null | grep -q 'compute capability 9\.'; then
            step "test_cuda_steps --gpu, wgmma kernels" "$log" 240 \
                env MPTC_CUDA_WGMMA=1 "$BIN/tests/test_cuda_steps" --gpu
        fi
        # a data-parallel plan's collectives through the real NCCL, one rank
        step "test_cuda_nccl --gpu (NCCL, one rank)" "$log" 120 "$BIN/tests/test_cuda_nccl" --gpu
    fi
}

run_cuda() {
    local log=$OUT/train.txt
    step "train mlp_small cuda f32 200 steps" "$log" 60 \
        "$MPTC" train examples/mlp_small.mpt --device cuda --max-steps 200 --data "$DATA"
    step "train mlp_small cuda mixed_float16" "$log" 60 \
        "$MPTC" train examples/mlp_small.mpt --device cuda --policy mixed_float16 --epochs 1 --data "$DATA"
    step "train mnist_mlp cuda mixed_bfloat16" "$log" 90 \
        "$MPTC" train examples/mnist_mlp.mpt --device cuda --policy mixed_bfloat16 --epochs 1 --data "$DATA"
    step "bench mnist_mlp cuda" "$OUT/bench.txt" 90 \
        "$MPTC" bench examples/mnist_mlp.mpt --device cuda --compare fused,unfused --json "$OUT/bench.json"
    step "bench mnist_mlp cuda float32 --tf32" "$OUT/bench.txt" 60 \
        "$MPTC" bench examples/mnist_mlp.mpt --device cuda --policy float32 --tf32
    step "train convnet_small cuda float32 --tf32" "$log" 60 \
        "$MPTC" train examples/convnet_small.mpt --device cuda --tf32 --max-steps 200 --data "$DATA"
    # the step as one CUDA graph (above) against its kernels launched one by one
    step "bench mnist_mlp cuda, no CUDA graph" "$OUT/bench.txt" 60 \
        env MPTC_CUDA_GRAPHS=0 "$MPTC" bench examples/mnist_mlp.mpt --device cuda \
        --compare fused,unfused
    # the fp32 CUDA-core convolutions: the wide SIMT tile, then the 64x64
    # one it replaced (codegen/cuda/emit_simt.c)
    step "bench convnet cuda float32 (wide SIMT)" "$OUT/bench.txt" 90 \
        "$MPTC" bench examples/convnet.mpt --device cuda --policy float32 --batch-sizes 64 \
        --steps 10 --warmup 3
    step "bench convnet cuda float32 (64x64 SIMT)" "$OUT/bench.txt" 90 \
        env MPTC_CUDA_SIMT_TILE=64 "$MPTC" bench examples/convnet.mpt --device cuda \
        --policy float32 --batch-sizes 64 --steps 10 --warmup 3
    # Tensor Core convolutions: mma.sync (above) against sm_90's wgmma
    step "bench convnet cuda mixed_float16 (mma.sync)" "$OUT/bench.txt" 90 \
        "$MPTC" bench examples/convnet.mpt --device cuda --policy mixed_float16 \
        --batch-sizes 256 --steps 10 --warmup 3
    step "bench convnet cuda mixed_float16 (wgmma)" "$OUT/bench.txt" 90 \
        env MPTC_CUDA_WGMMA=1 "$MPTC" bench examples/convnet.mpt --device cuda \
        --policy mixed_float16 --batch-sizes 256 --steps 10 --warmup 3
    step "profile mnist_mlp cuda mixed_float16" "$OUT/bench.txt" 90 \
        "$MPTC" bench examples/mnist_mlp.mpt --device cuda --policy mixed_float16 --batch-sizes 8192 \
        --steps 5 --warmup 2 --profile
}

# first: the order is the order of value (docs/GPU.md)
STEP_MODELS="mlp_small convnet_small text_tiny resblock conv1x1 strided wide_f32 relu_bn"
run_first() {
    local log=$LOGS/steps.txt m sm90=0
    "$MPTC" devices 2>/dev/null | grep -q 'compute capability 9\.' && sm90=1
    # every kernel on the GPU against the interpreter, one model a process
    # (a fault that leaves the context unusable hides no other model); a
    # failing model again, each kernel synchronized, to name the one
    for m in $STEP_MODELS; do
        step "test_cuda_steps --gpu $m" "$log" 60 "$BIN/tests/test_cuda_steps" --gpu "$m" ||
            step "  again with MPTC_CUDA_SYNC=1" "$log" 60 \
                env MPTC_CUDA_SYNC=1 "$BIN/tests/test_cuda_steps" --gpu "$m"
    done
    if [ "$sm90" = 1 ]; then
        for m in $STEP_MODELS; do
            step "test_cuda_steps --gpu $m, wgmma" "$LOGS/wgmma.txt" 60 \
                env MPTC_CUDA_WGMMA=1 "$BIN/tests/test_cuda_steps" --gpu "$m"
        done
    fi
    step "test_cuda_gpu" "$log" 60 "$BIN/tests/test_cuda_gpu"
    # a data-parallel plan of two ranks on a one-rank NCCL communicator:
    # every collective an NCCL call, against the interpreter
    step "test_cuda_nccl --gpu (NCCL, one rank)" "$log" 90 "$BIN/tests/test_cuda_nccl" --gpu
    log=$LOGS/train.txt
    step "train mnist_mlp cuda mixed_float16" "$log" 60 "$MPTC" train examples/mnist_mlp.mpt \
        --device cuda --policy mixed_float16 --epochs 1 --data "$DATA"
    step "train mnist_mlp cuda float32" "$log" 60 "$MPTC" train examples/mnist_mlp.mpt \
        --device cuda --policy float32 --epochs 1 --data "$DATA"
    step "train convnet_small cuda mixed_float16" "$log" 60 "$MPTC" train \
        examples/convnet_small.mpt --device cuda --policy mixed_float16 --epochs 1 --data "$DATA"
    log=$LOGS/bench.txt
    step "bench mnist_mlp cuda" "$log" 90 "$MPTC" bench examples/mnist_mlp.mpt --device cuda \
        --compare fused,unfused --steps 10 --warmup 3 --json "$LOGS/bench_mlp.json"
    step "bench convnet cuda (seed 000's table)" "$log" 120 "$MPTC" bench examples/convnet.mpt \
        --device cuda --policy float32,mixed_float16 --batch-sizes 32,64,128,256,512 \
        --steps 5 --warmup 2 --json "$LOGS/bench_convnet.json"
    step "profile convnet cuda mixed_float16" "$log" 60 "$MPTC" bench examples/convnet.mpt \
        --device cuda --policy mixed_float16 --batch-sizes 32 --steps 5 --warmup 2 --profile
    local raw=$LOGS/peers
    mkdir -p "$raw"
    cp docs/BENCHMARKS.md "$LOGS/BENCHMARKS.md"
    step "peers mnist_mlp convnet cuda" "$LOGS/peers.txt" 200 \
        env MPTC="$MPTC" OUT="$raw" DOC="$LOGS/BENCHMARKS.md" bash bench/run_peers.sh \
        --device cuda --models "mnist_mlp convnet" --policies float32,mixed_float16 \
        --steps 10 --warmup 3 --mptc-steps 10 --mptc-warmup 3
    cp docs/bench/peers_cuda.png "$LOGS/" 2>/dev/null || true
    if [ $((DEADLINE - SECONDS)) -gt 150 ]; then
        step "peers resnet50 cuda mixed_float16" "$LOGS/peers.txt" 300 \
            env MPTC="$MPTC" OUT="$raw" DOC="$LOGS/BENCHMARKS.md" bash bench/run_peers.sh \
            --device cuda --models resnet50 --policies mixed_float16 --steps 5 --warmup 2 \
            --mptc-steps 5 --mptc-warmup 2
    else
        note "peers resnet50 cuda mixed_float16" SKIP "under 150 s left"
    fi
}

# NVRTC, cuBLASLt and NCCL where mptc does not find them: the Python
# packages' copies (site-packages/nvidia/*/lib), added to the library path
# before any step; then NVRTC and cuBLASLt must load.
preflight_libraries() {
    if "$MPTC" devices 2>/dev/null | grep -qE '^  (NVRTC|cuBLASLt|NCCL): +none'; then
        local d extra=""
        for d in $(find /usr /opt /root /home -maxdepth 8 -type d -path '*site-packages/nvidia/*/lib' \
                   2>/dev/null | head -n 40); do
            extra="$extra:$d"
        done
        if [ -n "$extra" ]; then
            export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}$extra"
            echo "gpu_run: LD_LIBRARY_PATH extended with$extra" | tr ':' ' '
        fi
    fi
}

# The peers table on this GPU: written into a copy of docs/BENCHMARKS.md in
# $OUT (the working tree here is a copy; the figures come back as files).
run_peers() {
    local raw=$PWD/build/gpu-peers
    rm -rf "$raw"; mkdir -p "$raw"
    cp docs/BENCHMARKS.md "$OUT/BENCHMARKS.md"
    step "peers ${PEER_MODELS:-mnist_mlp convnet} cuda" "$OUT/peers.txt" 540 \
        env MPTC="$MPTC" OUT="$raw" DOC="$OUT/BENCHMARKS.md" bash bench/run_peers.sh --device cuda \
        --models "${PEER_MODELS:-mnist_mlp convnet}" --policies float32,mixed_float16 \
        --steps 10 --warmup 3 --mptc-steps 10 --mptc-warmup 3
    cp docs/bench/peers_cuda.png "$OUT/" 2>/dev/null || true
    tar -C "$raw" -czf "$OUT/peers_raw.tar.gz" . 2>/dev/null || true
}

mkdir -p "$OUT"
rm -f "$OUT"/{summary,tests,test_logs,wgmma,devices,train,bench,peers}.txt "$OUT/bench.json" \
    "$OUT/BENCHMARKS.md" "$OUT/peers_cuda.png" "$OUT/peers_raw.tar.gz"
unpack
cp "$BUNDLE/MANIFEST" "$OUT/MANIFEST.txt"
link_default_data
"$MPTC" --help >/dev/null ||
    die "$MPTC does not run here" "the bundle $(grep -m1 '^needs glibc' "$BUNDLE/MANIFEST"); this machine has $(ldd --version 2>&1 | head -n 1)"
{
    echo "gpu_run $MODE on $(hostname), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    sed -n 2p "$BUNDLE/MANIFEST"
    printf '%-44s %-6s %s\n' step status seconds
} >"$OUT/summary.txt"

mkdir -p "$LOGS"
preflight_libraries
{ command -v nvidia-smi >/dev/null && nvidia-smi -L; "$MPTC" devices; } >"$OUT/devices.txt" 2>&1
cat "$OUT/devices.txt"
[ "$LOGS" = "$OUT" ] || cp "$OUT/devices.txt" "$LOGS/"
if "$MPTC" devices --has-gpu >/dev/null 2>&1; then has_gpu=1; else has_gpu=0; fi
# a GPU that nvidia-smi lists and mptc cannot use is a failure, not a skip
if [ "$has_gpu" = 0 ] && command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    note "mptc sees the GPU nvidia-smi lists" FAIL "$(grep -m1 '^cuda' "$OUT/devices.txt")"
elif [ "$has_gpu" = 1 ] && grep -qE '^  (NVRTC|cuBLASLt): +none' "$OUT/devices.txt"; then
    note "NVRTC and cuBLASLt load" FAIL "see devices.txt"
fi

if [ "$MODE" = peers ] || [ "$MODE" = first ]; then
    if [ "$has_gpu" = 0 ]; then note "$MODE" SKIP "no usable GPU (see devices.txt)"
    elif [ "$MODE" = peers ]; then run_peers
    else run_first; fi
else
    [ "$MODE" = cuda ] || run_tests
    if [ "$MODE" != tests ]; then
        if [ "$has_gpu" = 1 ]; then run_cuda
        else note "CUDA trainings and bench" SKIP "no usable GPU (see devices.txt)"; fi
    fi
fi

{
    echo
    grep -E '^(PASS|FAIL|SKIP) |passed, ' "$OUT/tests.txt" 2>/dev/null
} >>"$OUT/summary.txt"
echo; cat "$OUT/summary.txt"
exit "$failed"
