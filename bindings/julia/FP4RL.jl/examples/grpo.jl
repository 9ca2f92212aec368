# grpo.jl - end-to-end FP4 RL (GRPO) from Julia, with the reward computed in Julia.
#
# A Qwen2-shaped model learns multi-digit addition from scratch (addition_task.jl): a short
# supervised warm-up until it is partly right, then GRPO with the HiFloat4 recipe (HiF4 W4A4
# rollout with Rollout-ResQ 2:4, FP4 training, truncated importance sampling). Held-out accuracy
# is measured before and after RL with greedy decoding in the rollout numerics; a checkpoint is
# saved at the end and resumed to show the round trip.
#
#   FP4RL_LIB=/path/to/libfp4rl.so julia --project=bindings/julia/FP4RL.jl \
#       bindings/julia/FP4RL.jl/examples/grpo.jl [--cpu] [--rl-steps N] [--seed S] [--out DIR]
#
# Writes DIR/metrics.jsonl (one JSON object per RL step) and DIR/checkpoint/.

using FP4RL
using Printf

include(joinpath(@__DIR__, "addition_task.jl"))
using .AdditionTask

const CONFIG = """{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 16,
 "hidden_size": 96, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "max_position_embeddings": 32, "rope_theta": 10000.0,
 "rms_norm_eps": 1e-6, "tie_word_embeddings": true}"""

const MAX_OPERAND = 99
const MAX_ANSWER = 5          # digits of 99 + 99, and the stop token

function parse_args(args)
    opts = Dict{String,Any}("cpu" => false, "rl-steps" => 60, "seed" => 1, "out" => "grpo_out")
    i = 1
    while i <= length(args)
        a = args[i]
        if a == "--cpu"
            opts["cpu"] = true
        elseif a in ("--rl-steps", "--seed") && i < length(args)
            opts[a[3:end]] = parse(Int, args[i += 1])
        elseif a == "--out" && i < length(args)
            opts["out"] = args[i += 1]
        else
            println(stderr, "usage: grpo.jl [--cpu] [--rl-steps N] [--seed S] [--out DIR]")
            exit(2)
        end
        i += 1
    end
    return opts
end

# The GPU when there is one and the model fits there, else the CPU.
function make_model(policy, seed, force_cpu)
    if !force_cpu
        try
            ctx = Context(DEVICE_CUDA)
            return ctx, Model(ctx, CONFIG; policy=policy, seed=seed)
        catch e
            e isa FP4RLError || rethrow()
            println("note: ", e.message, "; running on the CPU")
        end
    end
    ctx = Context(DEVICE_CPU)
    return ctx, Model(ctx, CONFIG; policy=policy, seed=seed)
end

# Greedy accuracy on a fixed held-out set: top-k 1 sampling in the rollout numerics.
function accuracy(evals, prompts)
    rollout!(evals, prompts)
    g = Int(evals[RL_GROUP_SIZE])
    right = sum(AdditionTask.reward(prompts[p], completion(evals, (p - 1) * g + 1).tokens) for p in eachindex(prompts))
    return right / length(prompts)
end

function main(args)
    opts = parse_args(args)
    seed, out = opts["seed"], opts["out"]
    mkpath(out)
    t_start = time()

    policy = QuantPolicy(PRESET_HIF4_RL)
    ctx, model = make_model(policy, seed, opts["cpu"])
    set_seed!(ctx, seed)
    @printf("fp4rl %s from Julia on the %s: Qwen2-shaped model, %d parameters, task: a + b with a, b <= %d\n",
            version_string(), FP4RL.device(ctx) == DEVICE_CUDA ? "GPU" : "CPU", model[MI_NUM_PARAMETERS], MAX_OPERAND)
    println("recipe: HiF4 FP4 training, HiF4 W4A4 rollout + Rollout-ResQ 2:4, GRPO with TIS (cap 5)\n")

    # a fixed held-out set, decoded greedily
    eval_prompts = AdditionTask.batch(AdditionTask.Rng(0x5eed0000 + seed), MAX_OPERAND, 256)
    evals = RLSession(model; stop_tokens=[AdditionTask.STOP], group_size=2, top_k=1, max_new_tokens=MAX_ANSWER)
    rng_ = AdditionTask.Rng(0xadd0000 + seed)

    # 1. supervised warm-up (FP4 training) until the model is partly right
    model[MP_LR] = 2e-3
    model[MP_GRAD_CLIP] = 1.0
    acc_before = 0.0
    println("supervised warm-up (FP4 training):")
    t0 = time()
    for step in 1:3000
        seqs = [AdditionTask.sequence(AdditionTask.rand_below(rng_, MAX_OPERAND + 1),
                                      AdditionTask.rand_below(rng_, MAX_OPERAND + 1)) for _ in 1:64]
        r = train_step!(model, first.(seqs); loss_mask=last.(seqs))
        if step % 100 == 0
            acc_before = accuracy(evals, eval_prompts)
            @printf("  step %4d  loss %.4f  held-out accuracy %5.1f%%  (%.0f s)\n", step, r.loss, 100acc_before, time() - t0)
            acc_before >= 0.30 && break
        end
    end

    # 2. FP4 RL: GRPO with a reward written in Julia
    session = RLSession(model; stop_tokens=[AdditionTask.STOP], group_size=8, max_new_tokens=MAX_ANSWER,
                        lr=5e-4, clip_high=0.28, seed=seed)
    metrics_path = joinpath(out, "metrics.jsonl")
    rm(metrics_path; force=true)
    set_metrics_file!(session, metrics_path)
    # Any Julia function or closure of (prompt_index, prompt, completion) -> reward. This one
    # also counts the answers it saw, to show that closures over local state work.
    answered = Ref(0)
    reward(_, prompt, completion) = (answered[] += 1; AdditionTask.reward(prompt, completion))

    println("\nFP4 RL (32 prompts x 8 completions per step):")
    @printf("  %5s %8s %8s %9s %10s %11s %9s\n", "step", "reward", "acc", "tis/mean", "mismatch", "act_zero", "tok/s")
    acc = acc_before
    n_steps = opts["rl-steps"]
    for step in 1:n_steps
        prompts = AdditionTask.batch(rng_, MAX_OPERAND, 32)
        m = step!(reward, session, prompts)
        acc_str = ""
        if step % 10 == 0 || step == n_steps
            acc = accuracy(evals, eval_prompts)
            acc_str = @sprintf("%7.1f%%", 100acc)
        end
        @printf("  %5d %8.3f %8s %9.3f %10.4f %10.2f%% %9.0f\n", step, m["reward/mean"], acc_str, m["tis/mean"],
                m["mismatch/logp_abs_diff_mean"], 100m["quant/act_zero_frac"], m["perf/rollout_tokens_per_s"])
        flush(stdout)
    end

    # 3. checkpoint, and resume it into a fresh model (same config) to continue training
    ckpt = joinpath(out, "checkpoint")
    save(session, ckpt)
    ctx2 = Context(FP4RL.device(ctx))
    resumed = RLSession(Model(ctx2, CONFIG; seed=0))
    load!(resumed, ckpt)
    @printf("\ncheckpoint: saved after %d steps to %s; resumed: %d steps, lr %.1e, group size %d\n",
            step_count(session), ckpt, step_count(resumed), resumed[RL_LR], Int(resumed[RL_GROUP_SIZE]))

    println("\n| phase                        | held-out accuracy (greedy, W4A4 HiF4 + ResQ) |")
    println("|------------------------------|----------------------------------------------|")
    @printf("| after supervised warm-up     | %43.1f%% |\n", 100acc_before)
    @printf("| after %3d FP4 RL steps       | %43.1f%% |\n", n_steps, 100acc)
    @printf("\nchange: %+.1f points; %d completions rewarded in Julia; wrote %s; %.0f s in all\n",
            100(acc - acc_before), answered[], metrics_path, time() - t_start)
    return nothing
end

main(ARGS)
