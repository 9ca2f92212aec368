#!/usr/bin/env bash
# Fuzzes the three parsers (tests/fuzz: safetensors, config.json, the RL checkpoint's state.json)
# with clang's libFuzzer for a bounded time each, from a copy of the committed seed corpus (the
# committed files stay as they are) and with a dictionary of its keys and edge-case numbers
# (tests/fuzz/dict). Fails when a target crashes, leaks or trips a sanitizer; the input that did it
# is kept under build/fuzz/crashes/<target>/ (add it to tests/fuzz/regressions/<target>/ once
# fixed, named bad_* when the parser must refuse it, so ctest fuzz_replay keeps it fixed).
# Skips, with a message and exit 0, when clang is not installed.
#   FP4RL_FUZZ_SECONDS   seconds per target (default 40)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang >/dev/null 2>&1; then
  echo "fuzz: clang not found; skipping the fuzz targets"
  exit 0
fi
seconds=${FP4RL_FUZZ_SECONDS:-40}
targets=(safetensors hf_config checkpoint)

CC=clang cmake -S . -B build/fuzz -DFP4RL_FUZZ=ON -DFP4RL_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build/fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1
export TMPDIR="$work" # fuzz_checkpoint's checkpoint directory goes here, and is removed with it
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$work/$t" "build/fuzz/crashes/$t"
  cp tests/fuzz/corpus/"$t"/* "$work/$t/"
  log="build/fuzz/$t.log"
  echo "== fuzz_$t (${seconds}s) =="
  if build/fuzz/tests/fuzz/fuzz_"$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
       -print_final_stats=1 -dict=tests/fuzz/dict/"$t".dict -artifact_prefix="build/fuzz/crashes/$t/" "$work/$t" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    echo "fuzz_$t: ${runs:-?} executions, no crash (corpus grew to $(ls "$work/$t" | wc -l) inputs)"
  else
    tail -n 60 "$log"
    echo "fuzz_$t: FAILED; the input is in build/fuzz/crashes/$t/, the log in $log"
    failed=1
  fi
done
exit "$failed"
