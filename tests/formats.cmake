# Format-correctness suites: element and scale math and the spec vectors (test_formats), the
# traits table (test_format_traits),
# quantize / dequantize / transpose behaviour (test_quantize), matmul against a float64
# reference (test_matmul), and the element conversions against ml_dtypes (pytest).
fp4rl_add_check_test(test_formats)
fp4rl_add_check_test(test_quantize)
fp4rl_add_check_test(test_matmul)
# The traits table and the layout header against the formats (internal: it also asks the tensor layer).
fp4rl_add_internal_test(test_format_traits)
set_tests_properties(test_formats test_quantize test_matmul test_format_traits PROPERTIES LABELS "formats" TIMEOUT 120)

# pytest + ctypes + ml_dtypes. Skipped under the sanitizers: python is not built with ASan, so
# the instrumented library cannot be dlopen'ed into it.
if(NOT FP4RL_SANITIZE)
  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c "import pytest, numpy, ml_dtypes"
                    RESULT_VARIABLE _fp4rl_py_deps OUTPUT_QUIET ERROR_QUIET)
    if(_fp4rl_py_deps EQUAL 0)
      add_test(NAME test_mldtypes
               COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_SOURCE_DIR}/python/test_mldtypes.py)
      set_tests_properties(test_mldtypes PROPERTIES ENVIRONMENT "FP4RL_LIB=$<TARGET_FILE:fp4rl>" LABELS "formats;python" TIMEOUT 120)
    else()
      message(STATUS "fp4rl: pytest, numpy or ml_dtypes missing; test_mldtypes not registered")
    endif()
  endif()
endif()

# The decode GEMM's packed weight layout (cuda/decode_layout.h, header-only) decoded on the CPU
# against fp4rl_dequantize bit for bit; needs no GPU and runs without a CUDA build too.
fp4rl_add_check_test(test_decode_layout)
target_include_directories(test_decode_layout PRIVATE ${PROJECT_SOURCE_DIR}/cuda)
set_tests_properties(test_decode_layout PROPERTIES LABELS "formats" TIMEOUT 300)
