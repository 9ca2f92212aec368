"""End to end on the addition task, mirroring tests/test_session.c's test_rl_raises_reward: a
short supervised warm-up, then FP4 RL with a reward written in Python raises the held-out reward."""

import time

import numpy as np

import addition_task as task
import fp4rl

SMALL = {"model_type": "qwen2", "vocab_size": 16, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 32, "tie_word_embeddings": True}


def held_out_reward(eval_session, prompts):
    """Mean reward of 8 samples per prompt, with the same sampling randomness every time."""
    eval_session.set(seed=4242)
    comps = eval_session.rollout(prompts)
    assert len(comps) == 8 * len(prompts)
    return float(np.mean([task.reward(prompts[c.prompt_index], c.tokens) for c in comps]))


def python_reward(prompt_index, prompt, completion):
    return task.reward(prompt, completion)


def test_rl_raises_reward():
    t0 = time.perf_counter()
    with fp4rl.Context(seed=5) as ctx:
        policy = fp4rl.QuantPolicy("hif4_rl", train_numerics="fp4", rollout_numerics="w4a4", resq="2_4")
        model = fp4rl.Model(ctx, SMALL, policy, seed=7)
        rl = fp4rl.RLSession(ctx, model, stop_tokens=[task.END])
        ev = fp4rl.RLSession(ctx, model, stop_tokens=[task.END], group_size=8, max_new_tokens=4)
        model.set_hparams(lr=3e-3)
        rng, eval_rng = task.Rng(77), task.Rng(78)
        eval_prompts = eval_rng.batch(9, 128)

        B, T = 32, 8
        for _ in range(150):  # supervised warm-up until partly right
            tok = np.zeros((B, T), np.int32)
            mask = np.zeros((B, T), np.float32)
            lens = np.zeros(B, np.int32)
            for b in range(B):
                seq, m = task.sequence(*task.warmup_pair(rng, 10))
                tok[b, : len(seq)], mask[b, : len(seq)], lens[b] = seq, m, len(seq)
            model.train_step(tok, lens, mask)
        r0 = held_out_reward(ev, eval_prompts)
        t1 = time.perf_counter()

        rl.set(group_size=8, max_new_tokens=4, lr=1e-3, clip_high=0.28)
        rewards = []
        for _ in range(24):
            metrics = rl.step(rng.batch(9, 32), python_reward)
            rewards.append(metrics["reward/mean"])
        r1 = held_out_reward(ev, eval_prompts)
        print(f"rl: held-out mean reward {r0:.3f} after the warm-up, {r1:.3f} after 24 FP4 RL steps "
              f"(rollout reward {rewards[0]:.3f} -> {rewards[-1]:.3f}); warm-up {t1 - t0:.1f} s, "
              f"RL {time.perf_counter() - t1:.1f} s")
        assert rl.step_count == 24
        assert r1 > r0 + 0.03, f"held-out reward {r0:.3f} -> {r1:.3f}"
