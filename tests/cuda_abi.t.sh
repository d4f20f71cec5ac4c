#!/usr/bin/env bash
# mptc's mirror of the CUDA ABI (codegen/cuda/driver.h, codegen/cuda/cuda.h)
# against the toolkit's headers: tests/cuda_abi.cpp, compiled here with the
# list of functions codegen/cuda/driver.c loads. NCCL's part against nccl.h,
# where it is installed (beside the toolkit's headers or in /usr/include):
# without it that part is left out and the script says so. Skips where no
# CUDA headers are installed (mptc itself needs none to build).
set -u
cd "$(dirname "$0")/.."
inc=""
for d in ${CUDA_HOME:+"$CUDA_HOME/include"} \
         "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x/x)")")/include" \
         /usr/local/cuda/include /usr/include; do
    [ -f "$d/cuda.h" ] && [ -f "$d/cublasLt.h" ] && [ -f "$d/nvrtc.h" ] && { inc=$d; break; }
done
if [ -z "$inc" ]; then
    echo "no CUDA headers (cuda.h, cublasLt.h, nvrtc.h); install the CUDA toolkit"
    exit 77
fi
nccl_inc=""
for d in "$inc" /usr/include /usr/local/include; do
    [ -f "$d/nccl.h" ] && { nccl_inc=$d; break; }
done
CXX=${CXX:-g++}
command -v "$CXX" >/dev/null || { echo "no C++ compiler ($CXX)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# SYM(name, base, table, member) for each load_sym(h, "name", &a->member, ...)
sed -n 's/.*load_sym(h, "\([A-Za-z0-9_]*\)", &a->\([a-z0-9_]*\),.*/\1 \2/p' codegen/cuda/driver.c |
while read -r name member; do
    case "$name" in
        nvrtc*) table=mpt_nvrtc_api ;;
        cublasLt*) table=mpt_lt_api ;;
        nccl*) [ -n "$nccl_inc" ] || continue; table=mpt_nccl_api ;;
        cu*) table=mpt_cu_api ;;
        *) echo "cuda_abi: no table for $name" >&2; exit 1 ;;
    esac
    echo "SYM($name, ${name%_v[0-9]}, $table, $member)"
done >"$tmp/cuda_abi_syms.inc" || exit 1
n=$(wc -l <"$tmp/cuda_abi_syms.inc")
[ "$n" -ge 60 ] || { echo "FAIL: only $n load_sym calls found in codegen/cuda/driver.c"; exit 1; }
if [ -n "$nccl_inc" ]; then
    nccl_flags=(-isystem "$nccl_inc")
    grep -q "SYM(ncclAllReduce," "$tmp/cuda_abi_syms.inc" ||
        { echo "FAIL: codegen/cuda/driver.c loads no NCCL function"; exit 1; }
else
    nccl_flags=(-DMPT_ABI_NO_NCCL)
    echo "note: no nccl.h: NCCL's mirror is not checked (install NCCL's headers, libnccl-dev)"
fi

"$CXX" -std=c++20 -Wall -I. -I"$tmp" -isystem "$inc" "${nccl_flags[@]}" tests/cuda_abi.cpp -o "$tmp/cuda_abi" \
    >"$tmp/cc.log" 2>&1 || {
    echo "FAIL: the mirror does not match $inc:"
    cat "$tmp/cc.log"
    exit 1
}
echo "headers: $inc${nccl_inc:+ (nccl.h: $nccl_inc)}"
"$tmp/cuda_abi"
