# The CUDA op table (cuda/ops_*.cu) against the CPU ops, op by op and end to end on the Qwen2 gqa
# fixture. Label `gpu`: it exits 77 (skipped) without a usable GPU or in a build without CUDA.
# The fixtures are compiled in; FP4RL_FIXTURES (tests/fixtures) in the environment overrides the path.
fp4rl_add_internal_test(test_ops_parity)
target_compile_definitions(test_ops_parity PRIVATE FP4RL_FIXTURES_DIR="${CMAKE_CURRENT_SOURCE_DIR}/fixtures")
set_tests_properties(test_ops_parity PROPERTIES LABELS "gpu")

# RL steps on the GPU against the CPU from the same weights and seeds (the demo's model and task).
fp4rl_add_internal_test(test_rl_parity)
target_link_libraries(test_rl_parity PRIVATE fp4rl_addition_task)
set_tests_properties(test_rl_parity PROPERTIES LABELS "gpu")

# The rollout engine on the GPU: CUDA-graph decode steps vs eager ones, batched vs lockstep, GPU vs CPU.
fp4rl_add_internal_test(test_rollout_graphs)
set_tests_properties(test_rollout_graphs PROPERTIES LABELS "gpu")
