#!/usr/bin/env bash
# Installs what fp4rl needs to build and test on a fresh Debian machine (idempotent).
set -euo pipefail
need=()
for pkg in build-essential cmake pkg-config libopenblas-dev check libcjson-dev swig; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
python3 -c "import numpy, ml_dtypes, pytest" 2>/dev/null || python3 -m pip install -q numpy ml_dtypes pytest
