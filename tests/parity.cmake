# The CUDA backend against the CPU reference (bitwise quantize / dequantize / transpose, matmul
# within the FP32 summation bound). Label `gpu`: it exits 77 (skipped) without a usable GPU or in a
# build without CUDA.
fp4rl_add_check_test(test_parity)
set_tests_properties(test_parity PROPERTIES LABELS "gpu" TIMEOUT 1200)
