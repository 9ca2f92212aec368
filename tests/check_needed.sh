#!/usr/bin/env bash
# A libfp4rl built with the CUDA backend must load on a machine without CUDA: it links no CUDA
# library (cudart is static; cuBLASLt and NCCL are opened with dlopen when first used). Fails if
# the shared library has a NEEDED entry for cuBLAS / cuBLASLt / cudart / NCCL, or an undefined
# symbol of theirs (a direct call that would need the link back).
set -euo pipefail
lib=$1
needed=$(readelf -d "$lib" | awk '/\(NEEDED\)/ {print $NF}' | tr -d '[]')
bad=$(echo "$needed" | grep -E '^lib(cublas|cublasLt|cudart|nccl)\.' || true)
if [ -n "$bad" ]; then
  echo "check_needed failed: $lib needs at load time:"
  echo "$bad"
  exit 1
fi
undef=$(nm -D --undefined-only "$lib" | awk '{print $NF}' | grep -E '^(cublas|nccl|cuda[A-Z])' || true)
if [ -n "$undef" ]; then
  echo "check_needed failed: $lib has undefined CUDA-library symbols (call them through the loaders):"
  echo "$undef"
  exit 1
fi
echo "check_needed: $(basename "$lib") needs only: $(echo $needed)"
