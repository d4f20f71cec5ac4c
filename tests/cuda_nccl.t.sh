#!/usr/bin/env bash
# Data-parallel CUDA ranks joining under mpirun (runtime/cuda/cuda_nccl.c,
# runtime/train/session.c), on the recording driver and NCCL of tests/fake/
# (build/tests/fake/libfakecuda.so): real processes, real MPI. No kernel
# computes on that driver, so the values of the steps are not looked at
# here (test_cuda_nccl checks them in one process); what is checked is
# what only several processes show: rank 0's NCCL id reaches every rank
# through MPI (the recording NCCL logs the id each rank initialised with,
# and an id names the process that made it), each rank takes its local
# rank's device (modulo the devices), and a missing NCCL stops every rank
# with a hint instead of leaving one waiting. Skips without Open MPI or
# mptc's MPI library.
set -u
MPTC=${MPTC:-build/mptc}
BUILD=$(cd "$(dirname "$MPTC")" && pwd)
FAKE=$BUILD/tests/fake/libfakecuda.so
command -v mpirun >/dev/null || { echo "skip: no mpirun (apt-get install openmpi-bin libopenmpi-dev)"; exit 77; }
[ -e "$BUILD/lib/libmptc_mpi.so" ] || { echo "skip: $BUILD/lib/libmptc_mpi.so not built (make, with mpicc installed)"; exit 77; }
[ -e "$FAKE" ] || { echo "FAIL: $FAKE not built (make $FAKE)"; exit 1; }
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
MPI=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
export MPTC_LIBCUDA=$FAKE MPTC_LIBCUBLASLT=$FAKE MPTC_LIBNCCL=$FAKE MPTC_CACHE=0
MPI+=(-x MPTC_LIBCUDA -x MPTC_LIBCUBLASLT -x MPTC_LIBNCCL -x MPTC_CACHE -x FAKE_CUDA_DEVICES -x FAKE_NCCL_LOG)
# two ranks, bounded (a rank left waiting would hang the suite); the
# run's own status is not the point (the driver computes nothing)
two() { timeout 300 "${MPI[@]}" -np 2 "$MPTC" train tests/models/dropout_mlp.mpt --device cuda \
        --max-steps 1 --no-test --quiet; }

# 1. the id and the devices: 2 devices, local ranks 0 and 1
export FAKE_CUDA_DEVICES=2 FAKE_NCCL_LOG=$tmp/nccl2.log
two >"$tmp/run2.out" 2>&1
[ "$(wc -l <"$tmp/nccl2.log" 2>/dev/null)" = 2 ] || bad "2 ranks initialised NCCL $(wc -l <"$tmp/nccl2.log" 2>/dev/null) times: $(tail -5 "$tmp/run2.out")"
grep -q "^rank 0 of 2 device 0 id " "$tmp/nccl2.log" || bad "rank 0 is not rank 0 of 2 on device 0: $(cat "$tmp/nccl2.log")"
grep -q "^rank 1 of 2 device 1 id " "$tmp/nccl2.log" || bad "rank 1 is not rank 1 of 2 on device 1: $(cat "$tmp/nccl2.log")"
[ "$(sed 's/.* id //' "$tmp/nccl2.log" | sort -u | wc -l)" = 1 ] || bad "the ranks initialised NCCL with different ids"
# 2. one device for both: the local rank modulo the devices
export FAKE_CUDA_DEVICES=1 FAKE_NCCL_LOG=$tmp/nccl1.log
two >"$tmp/run1.out" 2>&1
[ "$(grep -c " device 0 id " "$tmp/nccl1.log" 2>/dev/null)" = 2 ] || bad "with one device, not both ranks on device 0: $(cat "$tmp/nccl1.log" 2>/dev/null)"
# 3. no NCCL: every rank says so, with a hint, and the run ends
export MPTC_LIBNCCL=/nonexistent/libnccl.so.2 FAKE_NCCL_LOG=$tmp/none.log
two >"$tmp/none.out" 2>&1
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || bad "a run without NCCL ended with status $rc"
[ "$(grep -c "sum their gradients through NCCL, which cannot be loaded" "$tmp/none.out")" = 2 ] &&
  grep -q "hint: .*--device cpu" "$tmp/none.out" || bad "no NCCL: $(head -5 "$tmp/none.out")"
[ ! -e "$tmp/none.log" ] || bad "a rank initialised an NCCL it could not load"

[ $fail = 0 ] && echo "cuda_nccl.t.sh: ok"
exit $fail
