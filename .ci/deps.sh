#!/usr/bin/env bash
# Installs what mptc needs on a Debian 12 machine, and nothing already there.
set -euo pipefail
need=()
for p in make gcc g++ clang-14 libclang-rt-14-dev flex bison llvm-14-dev zlib1g-dev libcjson-dev libopenblas-dev libpng-dev libjpeg62-turbo-dev dataset-fashion-mnist; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "installing: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
