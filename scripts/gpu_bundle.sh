#!/usr/bin/env bash
# Makes .gpu/, what the lent GPU machine needs to run mptc (docs/GPU.md). That
# machine has no LLVM, flex or bison, so nothing is compiled there: this builds
# mptc and the test programs here with `make STATIC=1` (LLVM linked in), strips
# them and packs them into one xz archive, and copies the Fashion-MNIST files.
# Every static binary holds its own ~35 MB copy of LLVM; xz with a dictionary
# larger than one binary stores that copy once, which is what keeps the bundle
# under the device tool's 64 MiB.
#   bash scripts/gpu_bundle.sh        (or: make package-gpu)
# Environment: JOBS (make -j, default nproc), DATA_SRC (Fashion-MNIST folder),
# TESTS (test programs to bundle, e.g. "test_cuda_gpu test_cuda_ptx"; default
# all but HOST_ONLY's: each one holding LLVM adds about 1.7 MB to the archive).
set -euo pipefail
cd "$(dirname "$0")/.."

BUNDLE=.gpu
BUILD=build-static
DATA_SRC=${DATA_SRC:-/usr/share/datasets/fashion-mnist}
DATA_FILES=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
            t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
LIMIT=$((64 * 1024 * 1024))   # the device tool's limit on what travels
JOBS=${JOBS:-$(nproc)}

die() { echo "gpu_bundle: $1" >&2; [ $# -lt 2 ] || echo "  hint: $2" >&2; exit 1; }
command -v xz >/dev/null || die "xz not found" "apt-get install xz-utils"
command -v llvm-config-14 >/dev/null || command -v llvm-config >/dev/null ||
    die "llvm-config not found: the static build needs LLVM's .a files" "apt-get install llvm-14-dev"

# 1. Build. -k: a test program another change broke is left out and named,
# rather than stopping the bundle; mptc itself must build.
# Test programs that touch neither the CUDA backend nor anything a GPU machine
# changes (the language front end, the IR and its interpreter, data pipelines,
# checkpoints, TensorBoard files, MPI ranks: that machine has no Open MPI;
# attention's rewrite and its CPU kernels, whose CUDA checks are in
# test_attention_kernels;
# the CPU JIT's kernel tests, whose code the GPU machine does not change): CI
# runs them; left out of the default
# bundle to keep it under the limit. TESTS names them to bundle them anyway.
HOST_ONLY=" test_attention_fused test_cpu_math test_cpu_epi test_cpu_gemm test_cpu_conv test_lang test_augment test_tensorboard test_inputs test_dist test_data test_data_images test_data_text test_checkpoint test_grad test_interp test_interp_compute test_fold test_moments test_ir_text test_policy test_train_step test_train_controls "
tests=()
for c in tests/test_*.c; do
    name=$(basename "${c%.c}")
    [ -n "${TESTS:-}" ] || [[ "$HOST_ONLY" != *" $name "* ]] || continue
    [ -z "${TESTS:-}" ] || [[ " $TESTS " == *" $name "* ]] || continue
    tests+=("$BUILD/tests/$name")
done
make STATIC=1 -k -j"$JOBS" "$BUILD/mptc" "${tests[@]}" || true
fresh() { [ -x "$1" ] && make STATIC=1 -q "$1" 2>/dev/null; }   # built, and from today's sources
fresh "$BUILD/mptc" || die "$BUILD/mptc did not build" "run 'make STATIC=1' to see the error"
if ldd "$BUILD/mptc" | grep -q 'libLLVM'; then
    die "$BUILD/mptc still links libLLVM dynamically" "check the ifeq (\$(STATIC),1) block of the Makefile"
fi

# 2. Stage the layout tests/run_all.sh expects (BUILD/mptc, BUILD/tests/test_*),
# with libcjson.so.1 in lib/ where the binaries' $ORIGIN rpath looks.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests" "$stage/lib"
strip -o "$stage/mptc" "$BUILD/mptc"
cp "$BUILD/lib/libcjson.so.1" "$stage/lib/"
missing=()
for t in "${tests[@]}"; do
    if fresh "$t"; then
        strip -o "$stage/tests/$(basename "$t")" "$t"
        # the host-side CUDA tests load the recording driver from tests/fake/
        if [ "$(basename "$t")" = test_cuda_exec ] || [ "$(basename "$t")" = test_cuda_steps ] ||
           [ "$(basename "$t")" = test_cuda_nccl ]; then
            mkdir -p "$stage/tests/fake"
            cp "$BUILD/tests/fake/libfakecuda.so" "$stage/tests/fake/"
        fi
    else
        missing+=("$(basename "$t")")
    fi
done

# 3. Pack. preset 1 is fast; the 192 MiB dictionary spans several binaries.
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/fashion-mnist"
tar -C "$stage" -cf - . | xz --lzma2=preset=1,dict=192MiB -T1 >"$BUNDLE/mptc-bin.tar.xz"

data_note="all four files"
for f in "${DATA_FILES[@]}"; do
    if [ -f "$DATA_SRC/$f" ]; then cp "$DATA_SRC/$f" "$BUNDLE/fashion-mnist/"
    else data_note="INCOMPLETE: $f missing from $DATA_SRC"; fi
done

# 4. Manifest: what was built from what, and checksums the run script verifies.
{
    echo "mptc GPU bundle, made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
         "$( [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || echo '+ uncommitted changes')"
    echo "needs glibc >= $(objdump -T "$stage/mptc" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1 | cut -d_ -f2)"
    echo "data: $data_note"
    [ ${#missing[@]} -eq 0 ] || echo "not built (left out): ${missing[*]}"
    echo "staged binaries (bytes, stripped):"
    (cd "$stage" && find . -type f -printf '  %s %p\n' | sort -k2)
    echo "sha256:"
    (cd "$BUNDLE" && sha256sum mptc-bin.tar.xz fashion-mnist/*.gz | sed 's/^/  /')
} >"$BUNDLE/MANIFEST"

# 5. Size: the working tree that travels (tracked and untracked-not-ignored
# files) plus the carried .gpu must stay under the limit.
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
bundle=$(du -sb "$BUNDLE" | cut -f1)
total=$((tree + bundle))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
cat "$BUNDLE/MANIFEST"
echo "bundle $(mib "$bundle") (binaries $(mib "$(stat -c %s "$BUNDLE/mptc-bin.tar.xz")")," \
     "data $(mib "$(du -sb "$BUNDLE/fashion-mnist" | cut -f1)")) + working tree $(mib "$tree")" \
     "= $(mib "$total") of $(mib "$LIMIT")"
[ ${#missing[@]} -eq 0 ] || echo "gpu_bundle: warning: left out ${missing[*]} (they did not build)" >&2
if [ "$total" -ge "$LIMIT" ]; then
    die "$(mib "$total") would travel, over the device tool's $(mib "$LIMIT")" \
        "bundle fewer tests (TESTS=\"test_cuda_gpu test_cuda_ptx\"), or remove large untracked files"
fi
echo "ok: carry [\".gpu\"] and run 'bash scripts/gpu_run.sh' on the GPU machine (docs/GPU.md)"
