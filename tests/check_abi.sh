#!/usr/bin/env bash
# The ABI check: the exported symbols of libfp4rl.so, with their version node, must be exactly
# the committed baseline abi/fp4rl.symbols (name@@FP4RL_0 per line) (a removal breaks users; an addition must be recorded
# in the baseline on purpose). Every exported symbol must be declared in the public header.
set -euo pipefail
lib=$1 src_dir=$2
actual=$(nm -D --defined-only "$lib" | awk '$2 == "T" {print $3}' | grep -v '^FP4RL_' | sort)
expected=$(grep -v '^#' "$src_dir/abi/fp4rl.symbols" | sort)
if [ "$actual" != "$expected" ]; then
  echo "ABI check failed: exported symbols differ from abi/fp4rl.symbols"
  diff <(echo "$expected") <(echo "$actual") || true
  exit 1
fi
for s in $actual; do  # each line is name@@NODE
  grep -q "\b${s%@@*}(" "$src_dir/abi/include/fp4rl/fp4rl.h" || { echo "ABI check failed: ${s%@@*} is exported but not in fp4rl.h"; exit 1; }
done
readelf -d "$lib" | grep -q 'SONAME.*libfp4rl\.so\.0' || { echo "ABI check failed: SONAME is not libfp4rl.so.0"; exit 1; }
echo "ABI check: $(echo "$actual" | wc -l) symbols match the baseline, all FP4RL_0, SONAME libfp4rl.so.0"
