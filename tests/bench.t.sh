#!/usr/bin/env bash
# mptc bench: every (policy, batch) cell runs and lands in the JSON with a
# positive median; a batch that cannot fit is reported as OOM, never a crash.
# Uses only grep/awk to read the JSON, since jq is not a dependency.
# MPTC_TEST_SERIAL: tests/run_all.sh runs it alone (the profile's ceilings
# are measured on every core, and other tests' load would lower them).
set -u
MPTC=${MPTC:-build/mptc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# field NAME FILE: every value of "NAME": in cJSON's printed output, one a line
field() { grep -o "\"$1\":[[:space:]]*[^,}]*" "$2" | sed 's/^[^:]*:[[:space:]]*//; s/"//g'; }

# 1. Two policies x two batch sizes, fused: four cells with positive ms/step.
"$MPTC" bench examples/mlp_small.mpt --policy float32,mixed_bfloat16 --batch-sizes 8,16 \
    --steps 2 --warmup 1 --json "$tmp/b.json" >"$tmp/out1" 2>&1
rc=$?
[ $rc -eq 0 ] || { bad "bench exited $rc"; cat "$tmp/out1"; }
[ -s "$tmp/b.json" ] || bad "no JSON written"
n_ok=$(field status "$tmp/b.json" | grep -c '^ok$')
[ "$n_ok" = 4 ] || bad "expected 4 ok cells, got $n_ok"
n_pos=$(field ms_per_step "$tmp/b.json" | awk '$1 > 0 { n++ } END { print n + 0 }')
[ "$n_pos" = 4 ] || bad "expected 4 positive ms_per_step, got $n_pos"
for p in float32 mixed_bfloat16; do
  [ "$(field policy "$tmp/b.json" | grep -c "^$p$")" = 2 ] || bad "policy $p should have 2 cells"
done
[ "$(field batch "$tmp/b.json" | sort -n | uniq | tr '\n' ' ')" = "8 16 " ] || bad "batch sizes in the JSON are not 8 and 16"
grep -q "f32/bfloat16" "$tmp/out1" || bad "the table has no float32/mixed speedup column"
# the CUDA kernel variants a GPU run switches, recorded with the figures
[ "$(field cuda_tensor_core "$tmp/b.json")" = "mma.sync" ] || bad "cuda_tensor_core is not mma.sync"
[ "$(field cuda_simt_tile "$tmp/b.json")" = "wide" ] || bad "cuda_simt_tile is not wide"

# 2. An impossible batch next to a possible one: an OOM cell, the other runs, exit 0.
"$MPTC" bench examples/mlp_small.mpt --policy float32 --batch-sizes 8,100000000 \
    --steps 1 --warmup 0 --json "$tmp/c.json" >"$tmp/out2" 2>&1
rc=$?
[ $rc -eq 0 ] || { bad "bench with one OOM cell exited $rc"; cat "$tmp/out2"; }
[ "$(field status "$tmp/c.json" | tr '\n' ' ')" = "ok oom " ] || bad "expected cells ok, oom: $(field status "$tmp/c.json" | tr '\n' ' ')"
grep -q "OOM" "$tmp/out2" || bad "the table does not say OOM"

# 3. Only impossible cells: a clear message and exit 1, not a crash.
"$MPTC" bench examples/mlp_small.mpt --policy float32 --batch-sizes 100000000 --steps 1 \
    >"$tmp/out3" 2>&1
rc=$?
[ $rc -eq 1 ] || bad "bench with no runnable cell exited $rc, want 1"
grep -q "no configuration ran" "$tmp/out3" || bad "no clear message when nothing ran"

# 4. Option errors are usage errors (exit 2) with a message.
"$MPTC" bench examples/mlp_small.mpt --policy float64 >"$tmp/out4" 2>&1
[ $? -eq 2 ] || bad "unknown policy should exit 2"
grep -q "unknown policy 'float64'" "$tmp/out4" || bad "no message for an unknown policy"
"$MPTC" bench examples/mlp_small.mpt --batch-sizes 8,x >"$tmp/out5" 2>&1
[ $? -eq 2 ] || bad "a bad batch size should exit 2"
"$MPTC" bench "$tmp/missing.mpt" >"$tmp/out6" 2>&1
[ $? -eq 1 ] || bad "a missing model file should exit 1"

# 5. The peers report keeps each cell's fastest round (run_peers.sh --rounds):
# two rounds of one peer and of mptc, the table shows the faster of each.
if command -v python3 >/dev/null 2>&1; then
  cat >"$tmp/rows.jsonl" <<'ROWS'
{"peer": "pytorch", "variant": "eager", "model": "m", "policy": "float32", "batch": 8, "status": "ok", "ms_per_step": 20.0}
{"peer": "pytorch", "variant": "eager", "model": "m", "policy": "float32", "batch": 8, "status": "failed", "reason": "x"}
{"peer": "pytorch", "variant": "eager", "model": "m", "policy": "float32", "batch": 8, "status": "ok", "ms_per_step": 30.0}
ROWS
  for r in 1 2; do
    printf '{"cells": [{"backend": "cpu", "variant": "fused", "policy": "float32", "batch": 8, "status": "ok", "ms_per_step": %s, "samples_per_s": 1}]}\n' \
      "$([ $r = 1 ] && echo 10.0 || echo 12.5)" >"$tmp/mptc.r$r.json"
  done
  printf '# Benchmarks\n\n## Peers\n' >"$tmp/doc.md"
  python3 bench/peers/report.py --rows "$tmp/rows.jsonl" --mptc "m=$tmp/mptc.r1.json" --mptc "m=$tmp/mptc.r2.json" \
      --doc "$tmp/doc.md" --png "$tmp/p.png" --machine test --threads 1 --date 2026-01-01 --commit x \
      --note "pytorch 9.9" --note "pytorch 9.9" \
      >"$tmp/out7" 2>&1 || { bad "report.py failed"; cat "$tmp/out7"; }
  grep -q '| m | float32 | 8 | \*\*10.0 (1.00x)\*\* | 20.0 (2.00x) |' "$tmp/doc.md" ||
    { bad "the report does not keep each cell's fastest round"; grep '| m |' "$tmp/doc.md"; }
  [ "$(grep -c '^- pytorch 9.9$' "$tmp/doc.md")" = 1 ] || bad "a note repeated by a second round is written more than once"

  # 5b. Busy rounds (run_peers.sh --busy-round): a cell takes its quiet
  # round even when a busy one was faster; a cell measured only in busy
  # rounds is marked, with a warning above the table; a row's setup is a note.
  cat >"$tmp/rows2.jsonl" <<'ROWS'
{"round": 1}
{"peer": "pytorch", "variant": "eager", "model": "m", "policy": "float32", "batch": 8, "status": "ok", "ms_per_step": 15.0, "setup": "optimizer fused"}
{"peer": "jax", "variant": "jit", "model": "m", "policy": "float32", "batch": 8, "status": "ok", "ms_per_step": 40.0}
{"round": 2}
{"peer": "pytorch", "variant": "eager", "model": "m", "policy": "float32", "batch": 8, "status": "ok", "ms_per_step": 20.0, "setup": "optimizer fused"}
ROWS
  printf '# Benchmarks\n\n## Peers\n' >"$tmp/doc2.md"
  python3 bench/peers/report.py --rows "$tmp/rows2.jsonl" --mptc "m@1=$tmp/mptc.r1.json" --mptc "m@2=$tmp/mptc.r2.json" \
      --busy-round 1 --doc "$tmp/doc2.md" --png "$tmp/p.png" --machine test --threads 1 --date 2026-01-01 \
      --commit x >"$tmp/out7b" 2>&1 || { bad "report.py --busy-round failed"; cat "$tmp/out7b"; }
  grep -q '| m | float32 | 8 | \*\*12.5 (1.00x)\*\* | 20.0 (1.60x) | 40.0 (3.20x) † |' "$tmp/doc2.md" ||
    { bad "busy rounds: quiet cells first, busy-only cells marked"; grep '| m |' "$tmp/doc2.md"; }
  grep -q '^\*\*Measured on a busy host: 1 of 3 cells' "$tmp/doc2.md" || bad "no busy warning above the table"
  grep -q '^- pytorch eager (m): optimizer fused$' "$tmp/doc2.md" || bad "a row's setup is not in the notes"

  # 5c. The peers' data is mptc's synthetic(...) data (bench/peers/common.py
  # ports runtime/data's generator): values runtime/data gives, bit for bit.
  if python3 -c "import numpy" >/dev/null 2>&1; then
    python3 - >"$tmp/out7c" 2>&1 <<'PY' || { bad "the peers' synthetic data is not runtime/data's"; cat "$tmp/out7c"; }
import sys
sys.path.insert(0, "bench/peers")
import numpy as np
import common
x, y = common.mptc_synthetic(np, (784,), 10, 1, 0, 4)
assert y.tolist() == [6, 9, 0, 4], y
assert x[0, :4].tolist() == [-0.68402099609375, -0.1423187255859375, -0.3885498046875, 0.3874969482421875], x[0, :4]
assert x[3, -4:].tolist() == [-0.210601806640625, 0.120574951171875, -0.0540924072265625, -0.2389678955078125]
x, y = common.mptc_synthetic(np, (8, 8, 3), 1000, 7, 5, 2)
assert y.tolist() == [391, 57], y
assert x[1, 7, 7].tolist() == [0.658416748046875, -0.012939453125, -0.2144927978515625], x[1, 7, 7]
# token ids and a class per position, as `mptc bench` feeds gpt_tiny at a
# context of 512 (synthetic(shape=[512], dtype=i32, vocab=256, classes=256,
# ids=[512], seed=1); values runtime/data's mpt_data_batch gives)
x, y = common.mptc_synthetic_tokens(np, 512, 256, 256, 1, 0, 8)
assert x[0, :6].tolist() == [41, 75, 150, 70, 111, 109], x[0, :6]
assert y[0, :6].tolist() == [212, 248, 58, 94, 52, 214], y[0, :6]
assert x[7, -4:].tolist() == [247, 23, 220, 71], x[7, -4:]
assert y[7, -4:].tolist() == [113, 82, 210, 3], y[7, -4:]
PY
  fi
fi

# 6. --profile: the measured f32 ceiling is above what any f32 GEMM reaches
# (a ceiling loop bound by something else than the FMAs would read low)
"$MPTC" bench examples/mlp_cpu.mpt --policy float32 --batch-sizes 256 --steps 2 --warmup 1 \
    --device cpu --profile >"$tmp/out8" 2>&1 || { bad "bench --profile failed"; cat "$tmp/out8"; }
grep -q "^ceilings on .* f32 [0-9]* GFLOP/s" "$tmp/out8" || bad "no ceilings line in the profile"
over=$(awk '$2 == "gemm" && $8 + 0 > 100 { print $0 }' "$tmp/out8")
[ -z "$over" ] || bad "an f32 GEMM above its ceiling: $over"
n_gemm=$(awk '$2 == "gemm" && $8 ~ /%$/ { n++ } END { print n + 0 }' "$tmp/out8")
[ "$n_gemm" -ge 3 ] || bad "expected the profile's GEMM rows with a share of the ceiling, got $n_gemm"

[ $fail -eq 0 ] && echo "bench: ok"
exit $fail
