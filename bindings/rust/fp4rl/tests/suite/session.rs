//! The RL session: reward closures (and their failures), hostile arguments, the split API,
//! metrics, checkpoints with bit-identical resume.
use std::cell::Cell;

use fp4rl::*;

use crate::common::{addition, all_params, assert_err, TempDir, TINY};

fn hif4_policy() -> Result<QuantPolicy> {
    let mut p = QuantPolicy::with_preset(Preset::Hif4Rl)?;
    p.set_train_numerics(Numerics::Fp4)?
        .set_rollout_numerics(Numerics::W4A4)?
        .set_resq(Resq::TwoFour)?;
    Ok(p)
}

/// tests/test_session.c's new_session: stop token, group 4, 4 new tokens, lr 1e-3.
fn new_session<'m>(m: &'m Model<'_>, p: Option<&QuantPolicy>) -> Result<RlSession<'m>> {
    let mut s = RlSession::new(m, p)?;
    s.set_stop_tokens(&[addition::END])?
        .set(RlParam::GroupSize, 4.0)?
        .set(RlParam::MaxNewTokens, 4.0)?
        .set(RlParam::Lr, 1e-3)?;
    Ok(s)
}

/// A reward that prefers completions with many 7s: learnable from scratch.
fn sevens(_: usize, _: &[i32], c: &[i32]) -> f64 {
    c.iter().filter(|&&t| t == 7).count() as f64 / 4.0
}

fn prompts(seed: u64, n: usize) -> Vec<Vec<i32>> {
    addition::Rng(seed).prompts(9, n)
}

#[test]
fn hyper_parameters() -> Result<()> {
    let ctx = Context::cpu()?;
    let m = Model::from_config(&ctx, TINY, None, 1)?;
    let mut s = RlSession::new(&m, None)?;
    let defaults = [
        (RlParam::GroupSize, 8.0),
        (RlParam::MaxNewTokens, 64.0),
        (RlParam::Temperature, 1.0),
        (RlParam::TopK, 0.0),
        (RlParam::Lr, 1e-6),
        (RlParam::ClipLow, 0.2),
        (RlParam::ClipHigh, 0.2),
        (RlParam::TisCap, 5.0),
        (RlParam::AdvNorm, 1.0),
        (RlParam::GradClip, 1.0),
        (RlParam::Seed, 0.0),
    ];
    for (p, v) in defaults {
        assert_eq!(s.get(p)?, v, "{p:?}");
    }
    s.set(RlParam::ClipHigh, 0.28)?.set(RlParam::Epochs, 2.0)?;
    assert_eq!((s.get(RlParam::ClipHigh)?, s.get(RlParam::Epochs)?), (0.28, 2.0));
    assert_err(s.set(RlParam::GroupSize, 1.0), Status::InvalidArgument, &["group_size"]);
    assert_err(
        s.set(RlParam::Temperature, 0.0),
        Status::InvalidArgument,
        &["fp4rl_rl_session_set"],
    );
    assert_err(
        s.set(RlParam::TisCap, 0.5),
        Status::InvalidArgument,
        &["fp4rl_rl_session_set"],
    );
    assert_eq!(s.get(RlParam::GroupSize)?, 8.0, "rejected values change nothing");
    assert_err(
        s.set_stop_tokens(&[77]),
        Status::InvalidArgument,
        &["fp4rl_rl_session_set_stop_tokens"],
    );
    s.set_stop_tokens(&[])?;
    assert!(std::ptr::eq(s.model(), &m));
    assert_eq!(s.step_count()?, 0);
    Ok(())
}

// tests/test_session.c's test_errors through the safe API, with Rust closures.
#[test]
fn failing_reward_closures_are_errors_and_leave_the_model() -> Result<()> {
    let ctx = Context::cpu()?;
    ctx.set_seed(5)?;
    let p = hif4_policy()?;
    let m = Model::from_config(&ctx, TINY, Some(&p), 4)?;
    let mut s = new_session(&m, Some(&p))?;
    let pr = prompts(2, 4);
    s.step(&pr, sevens)?; // one real step first
    let (before, step_before) = (all_params(&m)?, m.step()?);

    // a panic inside the closure: caught at the FFI boundary, the step's error
    let calls = Cell::new(0);
    let e = assert_err(
        s.step(&pr, |_, _, _| {
            calls.set(calls.get() + 1);
            if calls.get() == 5 {
                panic!("boom in the reward");
            }
            0.5
        }),
        Status::Callback,
        &[
            "fp4rl_rl_session_step",
            "completion 4",
            "returned 2",
            "model is unchanged",
            "panicked",
            "boom in the reward",
        ],
    );
    assert!(e.to_string().starts_with("FP4RL_ERR_CALLBACK: "));
    assert_eq!(calls.get(), 5, "the library stops at the failing completion");
    // a panic with a String payload
    assert_err(
        s.step(&pr, |i, _, _| -> f64 { panic!("prompt {i} is bad") }),
        Status::Callback,
        &["panicked", "prompt 0 is bad"],
    );
    // an Err from a Result-returning closure
    assert_err(
        s.step(&pr, |i, _, _| {
            if i == 2 {
                Err(format!("no reward for prompt {i}"))
            } else {
                Ok(1.0)
            }
        }),
        Status::Callback,
        &[
            "returned 1",
            "completion 8",
            "returned an error",
            "no reward for prompt 2",
        ],
    );
    // a NaN reward: the library's own check
    assert_err(
        s.step(&pr, |_, _, _| f64::NAN),
        Status::Callback,
        &["completion 0", "finite"],
    );
    // none of them changed anything
    assert_eq!(all_params(&m)?, before);
    assert_eq!(m.step()?, step_before);
    assert_eq!(s.step_count()?, 1);
    // and the session still works
    s.step(&pr, |_, _, _| Ok::<f64, String>(1.0))?;
    assert_eq!(s.step_count()?, 2);
    Ok(())
}

#[test]
fn reward_closures_see_every_completion_of_every_prompt() -> Result<()> {
    let ctx = Context::cpu()?;
    let m = Model::from_config(&ctx, TINY, None, 2)?;
    let mut s = new_session(&m, None)?;
    let pr = prompts(3, 3);
    let mut seen = Vec::new();
    s.step(&pr, |i, prompt, completion| {
        assert_eq!(prompt, pr[i].as_slice());
        assert!(!completion.is_empty() && completion.len() <= 4);
        seen.push(i);
        addition::reward(prompt, completion)
    })?;
    assert_eq!(
        seen,
        [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2],
        "group_size completions per prompt, in order"
    );
    // the CSR form of the same prompts
    let (mut tok, mut off) = (Vec::new(), vec![0usize]);
    for p in &pr {
        tok.extend_from_slice(p);
        off.push(tok.len());
    }
    let mut n = 0;
    s.step_csr(&tok, &off, |_, _, _| {
        n += 1;
        0.0
    })?;
    assert_eq!(n, 12);
    assert_eq!(s.step_count()?, 2);
    Ok(())
}

#[test]
fn hostile_prompts() -> Result<()> {
    let ctx = Context::cpu()?;
    let m = Model::from_config(&ctx, TINY, None, 4)?;
    let mut s = new_session(&m, None)?;
    let none: Vec<Vec<i32>> = Vec::new();
    assert_err(s.step(&none, sevens), Status::InvalidArgument, &["n_prompts is 0"]);
    assert_err(
        s.step_csr(&[], &[], sevens),
        Status::InvalidArgument,
        &["n_prompts is 0"],
    );
    assert_err(
        s.step(&[vec![], vec![1, 2, 3]], sevens),
        Status::InvalidArgument,
        &["prompt 0 is empty"],
    );
    assert_err(
        s.step_csr(&[1, 2, 3, 4], &[1, 4], sevens),
        Status::InvalidArgument,
        &["prompt_offsets[0] is 1"],
    );
    // an offset past the tokens: caught before C would read out of bounds
    assert_err(
        s.step_csr(&[1, 2, 3], &[0, 3, 9], sevens),
        Status::InvalidArgument,
        &["RlSession::step", "offset 9"],
    );
    assert_err(
        s.rollout_csr(&[1, 2, 3], &[0, 4]),
        Status::InvalidArgument,
        &["RlSession::rollout"],
    );
    assert_err(
        s.step(&[vec![0; 30]], sevens),
        Status::Shape,
        &["exceeds the model's context"],
    );
    assert_err(
        s.step(&[vec![1, 99, 2]], sevens),
        Status::InvalidArgument,
        &["outside the vocabulary"],
    );
    assert_err(s.train(), Status::InvalidArgument, &["fp4rl_rl_session_train"]);
    assert_err(
        s.set_rewards(&[0.0, 0.0]),
        Status::InvalidArgument,
        &["fp4rl_rl_session_set_rewards"],
    );
    assert_err(s.metric("nope"), Status::InvalidArgument, &["no metric \"nope\""]);
    assert_err(s.metric("a\0b"), Status::InvalidArgument, &["RlSession::metric", "NUL"]);
    assert_err(
        s.completion(0),
        Status::InvalidArgument,
        &["fp4rl_rl_session_completion", "no rollout yet"],
    );
    assert_err(s.load("/nonexistent/ckpt"), Status::Io, &["fp4rl_rl_session_load"]);
    assert_err(s.save("/nonexistent/dir/ckpt"), Status::Io, &[]);
    assert_err(s.save("a\0b"), Status::InvalidArgument, &["RlSession::save", "NUL"]);
    assert_err(
        s.set_metrics_file(Some(std::path::Path::new("/nonexistent/dir/m.jsonl"))),
        Status::Io,
        &["cannot open"],
    );
    assert_eq!(s.step_count()?, 0);
    Ok(())
}

// tests/test_session.c's test_split_api_and_metrics.
#[test]
fn split_api_and_metrics() -> Result<()> {
    let ctx = Context::cpu()?;
    ctx.set_seed(5)?;
    let p = hif4_policy()?;
    let m = Model::from_config(&ctx, TINY, Some(&p), 6)?;
    let mut s = new_session(&m, Some(&p))?;
    let tmp = TempDir::new("metrics");
    let jsonl = tmp.path().join("metrics.jsonl");
    s.set_metrics_file(Some(&jsonl))?;
    s.rollout(&prompts(3, 3))?;
    assert_eq!(s.num_completions()?, 12);
    let completions = s.completions()?;
    let mut rewards = Vec::new();
    for (i, c) in completions.iter().enumerate() {
        assert_eq!(c.prompt_index, i / 4);
        assert!((1..=4).contains(&c.tokens.len()));
        assert_eq!(c.logprobs.len(), c.tokens.len());
        assert!(c.logprobs.iter().all(|&l| l <= 0.0 && l.is_finite()));
        rewards.push(sevens(c.prompt_index, &[], &c.tokens));
    }
    assert_eq!(s.completion(5)?, completions[5]);
    assert_err(
        s.completion(12),
        Status::InvalidArgument,
        &["completion 12 does not exist"],
    );
    let mut bad = rewards.clone();
    bad[3] = f64::INFINITY;
    assert_err(
        s.set_rewards(&bad),
        Status::InvalidArgument,
        &["completion 3", "not finite"],
    );
    assert_err(
        s.set_rewards(&rewards[1..]),
        Status::Shape,
        &["11 rewards for 12 completions"],
    );
    s.set_rewards(&rewards)?;
    s.train()?;
    assert_eq!(s.num_completions()?, 0);
    assert_eq!(s.step_count()?, 1);
    // metrics: by name, all of them, and as JSON
    assert!((s.metric("lr")? - 1e-3).abs() < 1e-12);
    assert!(s.metric("grad_norm")? > 0.0);
    assert!(s.metric("entropy")? > 0.0);
    let names = RlSession::metric_names();
    assert!(names.len() >= 10 && names.contains(&"reward/mean") && names.contains(&"tis/mean"));
    let all = s.metrics()?;
    assert_eq!(all.len(), names.len());
    for n in &names {
        assert_eq!(all[*n].to_bits(), s.metric(n)?.to_bits(), "{n}");
    }
    let mean = rewards.iter().sum::<f64>() / rewards.len() as f64;
    assert!((all["reward/mean"] - mean).abs() < 1e-9);
    let json = s.metrics_json()?;
    assert!(json.starts_with('{') && json.ends_with('}'));
    assert!(json.contains("\"step\": 1"));
    for n in &names {
        assert!(json.contains(n), "{n} missing from {json}");
    }
    // the metrics file got the step's line
    s.step(&prompts(4, 2), sevens)?;
    s.set_metrics_file(None)?;
    s.step(&prompts(5, 2), sevens)?;
    let lines = std::fs::read_to_string(&jsonl).unwrap();
    assert_eq!(lines.lines().count(), 2, "{lines}");
    assert!(lines.lines().nth(1).unwrap().contains("\"step\": 2"));
    Ok(())
}

// tests/test_session.c's test_checkpoint_resume: save after step 1; an uninterrupted run of
// steps 2-3 and a resumed one in a fresh context and model are bit-identical.
#[test]
fn checkpoint_resume_is_bit_identical() -> Result<()> {
    let tmp = TempDir::new("ckpt");
    let ck = tmp.path().join("ckpt");
    let batches: Vec<Vec<Vec<i32>>> = (0..3).map(|k| prompts(10 + k, 4)).collect();
    let ctx = Context::cpu()?;
    ctx.set_seed(5)?;
    let p = hif4_policy()?;
    let m = Model::from_config(&ctx, TINY, Some(&p), 8)?;
    let mut s = new_session(&m, Some(&p))?;
    s.set(RlParam::KlCoef, 0.01)?.set(RlParam::Minibatches, 2.0)?;
    s.step(&batches[0], sevens)?;
    s.save(&ck)?;
    s.save(&ck)?; // over an existing one
    for b in &batches[1..] {
        s.step(b, sevens)?;
    }
    let want = all_params(&m)?;

    // a fresh state: another context with another seed, another init, another policy
    let ctx2 = Context::cpu()?;
    ctx2.set_seed(999)?;
    let mut p0 = QuantPolicy::new()?;
    p0.set_train_numerics(Numerics::Bf16)?
        .set_rollout_numerics(Numerics::Bf16)?;
    let m2 = Model::from_config(&ctx2, TINY, Some(&p0), 123)?;
    let mut s2 = new_session(&m2, Some(&p0))?;
    s2.load(&ck)?;
    assert_eq!(s2.step_count()?, 1);
    for b in &batches[1..] {
        s2.step(b, sevens)?;
    }
    let got = all_params(&m2)?;
    assert!(want == got, "resumed weights differ from the uninterrupted run");
    assert_eq!(s2.metric("reward/mean")?.to_bits(), s.metric("reward/mean")?.to_bits());
    assert_eq!(s2.metric("pg/loss")?.to_bits(), s.metric("pg/loss")?.to_bits());
    assert_eq!(m2.step()?, m.step()?);
    // a corrupt checkpoint changes nothing
    std::fs::write(
        ck.join("state.json"),
        "{\"format\": \"fp4rl-rl-checkpoint\", \"version\": 1}",
    )
    .unwrap();
    assert_err(s2.load(&ck), Status::Corrupt, &["fp4rl_rl_session_load"]);
    assert!(all_params(&m2)? == got);
    assert_eq!(s2.step_count()?, 3);
    Ok(())
}

// A reward may itself use the library: here the log-likelihood of the completion under another
// model of the same context (a reference or reward model). The session being stepped is
// borrowed mutably for the step, so the closure cannot reach it; everything else it can.
#[test]
fn reward_closures_may_call_into_the_library() -> Result<()> {
    let ctx = Context::cpu()?;
    let m = Model::from_config(&ctx, TINY, None, 1)?;
    let reward_model = Model::from_config(&ctx, TINY, None, 2)?;
    let mut s = new_session(&m, None)?;
    let mut scored = 0;
    s.step(&prompts(6, 2), |_, prompt, completion| -> Result<f64> {
        let seq: Vec<i32> = prompt.iter().chain(completion).copied().collect();
        let lp = reward_model.token_logprobs(&seq, None, seq.len())?;
        scored += 1;
        Ok(lp[prompt.len()..].iter().map(|&x| x as f64).sum::<f64>() / completion.len() as f64)
    })?;
    assert_eq!(scored, 8);
    // an fp4rl::Error inside the closure becomes part of the step's error
    let e = assert_err(
        s.step(&prompts(6, 2), |_, _, _| reward_model.param("model.nope").map(|_| 0.0)),
        Status::Callback,
        &["returned 1", "no parameter \"model.nope\""],
    );
    assert!(e.message().starts_with("fp4rl_rl_session_step: "), "{e}");
    Ok(())
}
