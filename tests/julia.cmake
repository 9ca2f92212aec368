# The Julia binding (bindings/julia/FP4RL.jl) cannot be executed here: Julia is not installable
# on the project's machines. This test checks it structurally against the public header instead
# (every C function wrapped, ccall argument counts and C types, the reward callback's signature,
# GC.@preserve around host buffers, enum values and constants). Python 3 standard library only.
add_test(NAME check_julia_binding
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/check_julia_binding.py ${PROJECT_SOURCE_DIR})
set_tests_properties(check_julia_binding PROPERTIES LABELS "bindings;julia" TIMEOUT 60)
