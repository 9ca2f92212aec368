//! End to end on the addition task with a reward written in Rust: a supervised warm-up, then
//! FP4 RL raises the held-out reward (tests/test_session.c's test_rl_raises_reward, step for
//! step: the same model, recipe, batches and hyper-parameters).
use fp4rl::*;

use crate::common::addition;

const SMALL: &str = r#"{"model_type": "qwen2", "vocab_size": 16, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "max_position_embeddings": 32, "tie_word_embeddings": true}"#;

/// The mean reward of 8 samples for each fixed held-out prompt, with a fixed sampling seed: the
/// quantity RL maximises, without the noise of changing prompts.
fn held_out_reward(eval: &mut RlSession, prompts: &[Vec<i32>]) -> Result<f64> {
    eval.set(RlParam::Seed, 4242.0)?; // the same samples' randomness each time
    eval.rollout(prompts)?;
    let completions = eval.completions()?;
    assert_eq!(completions.len(), 8 * prompts.len());
    let sum: f64 = completions
        .iter()
        .map(|c| addition::reward(&prompts[c.prompt_index], &c.tokens))
        .sum();
    Ok(sum / completions.len() as f64)
}

#[test]
fn rl_with_a_rust_reward_raises_the_reward() -> Result<()> {
    let ctx = Context::cpu()?;
    ctx.set_seed(5)?;
    let mut p = QuantPolicy::with_preset(Preset::Hif4Rl)?;
    p.set_train_numerics(Numerics::Fp4)?
        .set_rollout_numerics(Numerics::W4A4)?
        .set_resq(Resq::TwoFour)?;
    let m = Model::from_config(&ctx, SMALL, Some(&p), 7)?;
    // two sessions share the model: one trains, one evaluates; supervised steps in between
    let mut s = RlSession::new(&m, None)?;
    let mut eval = RlSession::new(&m, None)?;
    s.set_stop_tokens(&[addition::END])?;
    eval.set_stop_tokens(&[addition::END])?
        .set(RlParam::GroupSize, 8.0)?
        .set(RlParam::MaxNewTokens, 4.0)?;
    m.set_hparam(MParam::Lr, 3e-3)?;
    let (mut rng, mut eval_rng) = (addition::Rng(77), addition::Rng(78));
    let held_out = eval_rng.prompts(9, 128);
    for _ in 0..150 {
        // warm up until partly right: the loss on the answer tokens only
        let (tok, len, mask) = addition::sft_batch(&mut rng, 9, 32, 8);
        m.train_step(&tok, Some(&len), Some(&mask), 8)?;
    }
    let r0 = held_out_reward(&mut eval, &held_out)?;
    s.set(RlParam::GroupSize, 8.0)?
        .set(RlParam::MaxNewTokens, 4.0)?
        .set(RlParam::Lr, 1e-3)?
        .set(RlParam::ClipHigh, 0.28)?;
    let mut calls = 0usize;
    for k in 0..24 {
        let batch = rng.prompts(9, 32);
        // the reward: a Rust closure (it may capture and mutate state)
        s.step(&batch, |_, prompt, completion| {
            calls += 1;
            addition::reward(prompt, completion)
        })?;
        if std::env::var_os("FP4RL_TEST_VERBOSE").is_some() {
            println!("rl step {k} reward {:.3}", s.metric("reward/mean")?);
        }
    }
    assert_eq!(calls, 24 * 32 * 8);
    assert_eq!(s.step_count()?, 24);
    let r1 = held_out_reward(&mut eval, &held_out)?;
    println!("rl: held-out mean reward {r0:.3} after the warm-up, {r1:.3} after 24 FP4 RL steps");
    assert!(r1 > r0 + 0.03, "held-out reward {r0:.3} -> {r1:.3}");
    Ok(())
}
