#!/usr/bin/env bash
# One SGD step of mptc against PyTorch from the same safetensors weights
# (issue 37): a pre-layer-norm GPT block, two LSTM models and a GRU
# (tests/models/torch_*.mpt), on the interpreter and the CPU JIT (and a
# CUDA device when `mptc devices` lists one), under float32 (tight bounds)
# and mixed_bfloat16 (bfloat16's bounds). The loss, every gradient and the
# weights after the step are compared with a float64 PyTorch reference;
# the bounds, and why, are in tests/torch_onestep.py's header, the results
# in docs/RESULTS.md. The script also checks that the bounds catch wrong
# references (tanh GELU, PyTorch's layer-norm epsilon, no causal mask, the
# LSTM's or GRU's gates out of order, an untransposed recurrent kernel).
#
# Skipped (77) when python3 cannot import torch and numpy, as in CI.
# MPTC_TORCH_PYTHON names another interpreter; an installed torch that
# needs its CUDA libraries on the path to import (even for CPU use) wants
# LD_LIBRARY_PATH set as its wheel's nvidia/*/lib folders say.
set -u
MPTC=${MPTC:-build/mptc}
PY=${MPTC_TORCH_PYTHON:-python3}
[ -x "$MPTC" ] || { echo "FAIL: $MPTC not built"; exit 1; }
if ! why=$("$PY" -c "import numpy, torch" 2>&1); then
  echo "skip: $PY cannot import torch and numpy ($(printf '%s\n' "$why" | tail -n 1))"
  exit 77
fi
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
devices=interp,cpu
"$MPTC" devices 2>/dev/null | grep -q '^cuda:[0-9]' && devices=$devices,cuda
"$PY" -W ignore tests/torch_onestep.py --mptc "$MPTC" --tmp "$tmp" \
  --devices "$devices" --policies float32,mixed_bfloat16
rc=$?
[ $rc = 0 ] || echo "FAIL: mptc's one step disagrees with PyTorch, or a run failed (status $rc); KEEP=1 keeps $tmp"
exit $rc
