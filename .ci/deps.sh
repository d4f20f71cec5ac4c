#!/usr/bin/env bash
# Installs what mptc needs on a Debian 12 machine, and nothing already there.
set -euo pipefail
# fortunes: 2.5 MB of English text in /usr/share/games/fortunes for text(...)
# openmpi-bin, libopenmpi-dev: data-parallel training (mpirun; libmptc_mpi.so)
need=()
for p in make gcc g++ clang-14 libclang-rt-14-dev flex bison llvm-14-dev zlib1g-dev libcjson-dev libopenblas-dev libpng-dev libjpeg62-turbo-dev dataset-fashion-mnist fortunes openmpi-bin libopenmpi-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "installing: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
# TensorBoard's own reader checks mptc's event files (tests/tensorboard.t.sh,
# which skips without it): a pip that fails or is missing costs that test only
if command -v python3 >/dev/null && ! python3 -c 'import tensorboard' >/dev/null 2>&1; then
  echo "installing: tensorboard (pip)"
  python3 -m pip install -q --break-system-packages tensorboard >/dev/null 2>&1 ||
    python3 -m pip install -q tensorboard >/dev/null 2>&1 ||
    echo "note: pip could not install tensorboard; tests/tensorboard.t.sh will be skipped"
fi
