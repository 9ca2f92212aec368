//! GRPO with FP4 end to end, from Rust: a complete training script to start from.
//!
//! A small Qwen2-shaped model learns multi-digit addition (the task of examples/addition_task.h,
//! in Rust in tests/common/addition.rs): a supervised warm-up, then FP4 RL with the HiFloat4
//! recipe (HiF4 W4A4 rollout with Rollout-ResQ 2:4, FP4 training, truncated importance
//! sampling) and a reward written as a Rust closure. Held-out accuracy (greedy decoding in the
//! rollout numerics) is reported before and after RL; metrics go to OUT/metrics.jsonl and the
//! full training state to OUT/checkpoint, from which `--resume` continues.
//!
//!   cargo run --release --example grpo -- [--cuda] [--out DIR] [--sft-steps N] [--rl-steps N]
//!                                           [--seed S] [--resume]
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use fp4rl::{Context, MParam, Model, ModelInfo, Preset, QuantPolicy, RlParam, RlSession};

// The task lives in one file shared with the tests; copy it along with this script.
#[path = "../tests/common/addition.rs"]
mod addition;

const CONFIG: &str = r#"{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 16,
 "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "max_position_embeddings": 32, "rope_theta": 10000.0,
 "rms_norm_eps": 1e-6, "tie_word_embeddings": true}"#;

const MAX_OPERAND: i64 = 9;
const MAX_ANSWER: f64 = 4.0; // two digits and the stop token fit in 4 new tokens

struct Args {
    cuda: bool,
    out: PathBuf,
    sft_steps: usize,
    rl_steps: usize,
    seed: u64,
    resume: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        cuda: false,
        out: PathBuf::from("grpo_out"),
        sft_steps: 150,
        rl_steps: 24,
        seed: 1,
        resume: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match flag.as_str() {
            "--cuda" => a.cuda = true,
            "--resume" => a.resume = true,
            "--out" => a.out = PathBuf::from(value("--out")?),
            "--sft-steps" => a.sft_steps = value("--sft-steps")?.parse().map_err(|e| format!("--sft-steps: {e}"))?,
            "--rl-steps" => a.rl_steps = value("--rl-steps")?.parse().map_err(|e| format!("--rl-steps: {e}"))?,
            "--seed" => a.seed = value("--seed")?.parse().map_err(|e| format!("--seed: {e}"))?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// Greedy accuracy on fixed held-out prompts, decoded in the rollout numerics.
fn accuracy(eval: &mut RlSession, prompts: &[Vec<i32>]) -> fp4rl::Result<f64> {
    eval.rollout(prompts)?;
    let completions = eval.completions()?;
    // group size 2 (the minimum) with top-k 1: both completions are the greedy one
    let right: f64 = completions
        .iter()
        .step_by(2)
        .map(|c| addition::reward(&prompts[c.prompt_index], &c.tokens))
        .sum();
    Ok(right / prompts.len() as f64)
}

fn run(args: &Args) -> fp4rl::Result<()> {
    let t0 = Instant::now();
    // The GPU when asked for and usable, else the CPU.
    let ctx = match args.cuda.then(|| Context::cuda(0)) {
        Some(Ok(ctx)) => ctx,
        Some(Err(e)) => {
            println!("note: no CUDA context ({e}); running on the CPU");
            Context::cpu()?
        }
        None => Context::cpu()?,
    };
    ctx.set_seed(args.seed)?;
    let policy = QuantPolicy::with_preset(Preset::Hif4Rl)?;
    let model = Model::from_config(&ctx, CONFIG, Some(&policy), args.seed)?;
    println!(
        "fp4rl {} on the {:?}: {} parameters; HiF4 FP4 training, HiF4 W4A4 rollout + ResQ 2:4, GRPO with TIS",
        fp4rl::version(),
        ctx.device(),
        model.info(ModelInfo::NumParameters)?
    );

    let mut rng = addition::Rng(0xadd0000 + args.seed);
    let held_out = addition::Rng(0x5eed0000 + args.seed).prompts(MAX_OPERAND, 128);
    let mut eval = RlSession::new(&model, None)?;
    eval.set_stop_tokens(&[addition::END])?
        .set(RlParam::GroupSize, 2.0)?
        .set(RlParam::TopK, 1.0)?
        .set(RlParam::MaxNewTokens, MAX_ANSWER)?;

    let mut rl = RlSession::new(&model, None)?;
    rl.set_stop_tokens(&[addition::END])?
        .set(RlParam::GroupSize, 8.0)?
        .set(RlParam::MaxNewTokens, MAX_ANSWER)?
        .set(RlParam::Lr, 1e-3)?
        .set(RlParam::ClipHigh, 0.28)?
        .set(RlParam::Seed, args.seed as f64)?;
    let checkpoint = args.out.join("checkpoint");
    if args.resume {
        rl.load(&checkpoint)?; // weights, optimizer, step, random state, hyper-parameters
        println!("resumed from {} at RL step {}", checkpoint.display(), rl.step_count()?);
    } else {
        // 1. supervised warm-up on the answer tokens until the model is partly right
        model.set_hparam(MParam::Lr, 3e-3)?;
        for step in 0..args.sft_steps {
            let (tok, len, mask) = addition::sft_batch(&mut rng, MAX_OPERAND, 32, 8);
            let s = model.train_step(&tok, Some(&len), Some(&mask), 8)?;
            if (step + 1) % 50 == 0 {
                println!(
                    "  sft step {:4}  loss {:.4}  grad norm {:.3}",
                    step + 1,
                    s.loss,
                    s.grad_norm
                );
            }
        }
    }
    let acc_before = accuracy(&mut eval, &held_out)?;
    println!("held-out greedy accuracy before RL: {:.1}%", 100.0 * acc_before);

    // 2. FP4 RL with a Rust reward
    rl.set_metrics_file(Some(&args.out.join("metrics.jsonl")))?;
    println!(
        "  {:>5} {:>8} {:>9} {:>10} {:>9}",
        "step", "reward", "tis/mean", "mismatch", "entropy"
    );
    for _ in 0..args.rl_steps {
        let prompts = rng.prompts(MAX_OPERAND, 32);
        rl.step(&prompts, |_, prompt, completion| addition::reward(prompt, completion))?;
        let m = rl.metrics()?;
        println!(
            "  {:>5} {:>8.3} {:>9.3} {:>10.4} {:>9.3}",
            rl.step_count()?,
            m["reward/mean"],
            m["tis/mean"],
            m["mismatch/logp_abs_diff_mean"],
            m["entropy"]
        );
    }
    rl.save(&checkpoint)?;
    let acc_after = accuracy(&mut eval, &held_out)?;
    println!(
        "held-out greedy accuracy after {} RL steps: {:.1}% ({:+.1} points); checkpoint in {}; {:.0} s",
        args.rl_steps,
        100.0 * acc_after,
        100.0 * (acc_after - acc_before),
        checkpoint.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "grpo: {e}\nusage: grpo [--cuda] [--out DIR] [--sft-steps N] [--rl-steps N] [--seed S] [--resume]"
            );
            return ExitCode::from(2);
        }
    };
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        eprintln!("grpo: cannot create {}: {e}", args.out.display());
        return ExitCode::FAILURE;
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("grpo: {e}");
            ExitCode::FAILURE
        }
    }
}
