# The lead's tests: the ABI contract, the header as C99 and C++, the installed package.
fp4rl_add_check_test(test_api)

# The header compiles as C99 pedantic and as C++ (building these targets is the test).
add_executable(test_header_c99 test_header.c)
target_link_libraries(test_header_c99 PRIVATE fp4rl)
set_target_properties(test_header_c99 PROPERTIES C_STANDARD 99 C_EXTENSIONS OFF)
target_compile_options(test_header_c99 PRIVATE -std=c99 -pedantic -Wall -Wextra -Werror)
add_test(NAME test_header_c99 COMMAND test_header_c99)
include(CheckLanguage)
check_language(CXX)
if(CMAKE_CXX_COMPILER)
  enable_language(CXX)
  add_executable(test_header_cxx test_header_cxx.cpp)
  target_include_directories(test_header_cxx PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(test_header_cxx PRIVATE fp4rl)
  target_compile_options(test_header_cxx PRIVATE -std=c++11 -pedantic -Wall -Wextra -Werror)
  add_test(NAME test_header_cxx COMMAND test_header_cxx)
endif()

add_test(NAME check_abi COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_abi.sh $<TARGET_FILE:fp4rl> ${PROJECT_SOURCE_DIR})
# A CUDA build of libfp4rl loads without CUDA: no NEEDED cuBLAS(Lt) / cudart / NCCL (no GPU needed).
if(FP4RL_HAVE_CUDA)
  add_test(NAME check_needed COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_needed.sh $<TARGET_FILE:fp4rl>)
  set_tests_properties(check_needed PROPERTIES LABELS "layout" TIMEOUT 60)
endif()
if(NOT FP4RL_SANITIZE) # the consumer programs are built without the sanitizer runtime
  add_test(NAME test_install COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/test_install.sh ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR})
endif()
