//! The policy model: configs, the HF fixture, save/load, parameters, forward and training.
use fp4rl::*;

use crate::common::{
    addition, all_params, assert_err, f32s, fixture, i32s, param_names, safetensors_tensor, TempDir, TINY,
};

#[test]
fn from_config_info_and_hparams() -> Result<()> {
    let ctx = Context::cpu()?;
    let m = Model::from_config(&ctx, TINY, None, 1)?;
    let want = [
        (ModelInfo::VocabSize, 16),
        (ModelInfo::HiddenSize, 32),
        (ModelInfo::IntermediateSize, 64),
        (ModelInfo::NumLayers, 2),
        (ModelInfo::NumHeads, 4),
        (ModelInfo::NumKvHeads, 2),
        (ModelInfo::HeadDim, 8),
        (ModelInfo::MaxPositions, 32),
        (ModelInfo::TiedEmbeddings, 1),
        (ModelInfo::Step, 0),
    ];
    for (k, v) in want {
        assert_eq!(m.info(k)?, v, "{k:?}");
    }
    let n: i64 = param_names(2, true)
        .iter()
        .map(|p| m.param_shape(p).map(|s| s.iter().product::<i64>()))
        .sum::<Result<i64>>()?;
    assert_eq!(m.num_parameters()?, n, "the parameter names cover the model");
    let (mut listed, mut want) = (m.param_names()?, param_names(2, true));
    assert_eq!(listed[0], "model.embed_tokens.weight", "checkpoint order starts with the embedding");
    listed.sort();
    want.sort();
    assert_eq!(listed, want, "the model lists the same names");
    assert_eq!(m.vocab_size()?, 16);
    assert!(format!("{m:?}").contains("NumParameters"));
    // hyper-parameters: defaults, set/get, bounds
    assert_eq!(m.hparam(MParam::Lr)?, 1e-4);
    assert_eq!(m.hparam(MParam::Beta2)?, 0.999);
    m.set_hparam(MParam::Lr, 3e-3)?;
    m.set_hparam(MParam::GradClip, 1.0)?;
    assert_eq!((m.hparam(MParam::Lr)?, m.hparam(MParam::GradClip)?), (3e-3, 1.0));
    assert_err(
        m.set_hparam(MParam::Lr, -1.0),
        Status::InvalidArgument,
        &["fp4rl_model_set_hparam"],
    );
    assert_err(
        m.set_hparam(MParam::Beta1, 1.0),
        Status::InvalidArgument,
        &["fp4rl_model_set_hparam"],
    );
    assert_eq!(m.hparam(MParam::Lr)?, 3e-3, "a rejected value changes nothing");
    // BF16 optimizer moments: a 0/1 knob, anything else refused
    assert_eq!(m.hparam(MParam::OptimizerMoments)?, 0.0);
    m.set_hparam(MParam::OptimizerMoments, 1.0)?;
    assert_eq!(m.hparam(MParam::OptimizerMoments)?, 1.0);
    assert_err(
        m.set_hparam(MParam::OptimizerMoments, 2.0),
        Status::InvalidArgument,
        &["optimizer_moments"],
    );
    m.set_hparam(MParam::OptimizerMoments, 0.0)?;
    // the same seed, the same weights; another seed, others
    let m2 = Model::from_config(&ctx, TINY, None, 1)?;
    let m3 = Model::from_config(&ctx, TINY, None, 2)?;
    assert_eq!(all_params(&m)?, all_params(&m2)?);
    assert_ne!(all_params(&m)?, all_params(&m3)?);
    Ok(())
}

#[test]
fn config_errors() -> Result<()> {
    let ctx = Context::cpu()?;
    assert_err(
        Model::from_config(&ctx, "{", None, 1),
        Status::Corrupt,
        &["not valid JSON"],
    );
    let bad = TINY.replace("\"hidden_size\": 32", "\"hidden_size\": -32");
    assert_err(
        Model::from_config(&ctx, &bad, None, 1),
        Status::Corrupt,
        &["hidden_size"],
    );
    let llama = TINY.replace("qwen2", "llama");
    assert_err(
        Model::from_config(&ctx, &llama, None, 1),
        Status::Unsupported,
        &["llama"],
    );
    assert_err(
        Model::from_config(&ctx, "{\0}", None, 1),
        Status::InvalidArgument,
        &["Model::from_config", "NUL"],
    );
    assert_err(
        Model::from_pretrained(&ctx, "/nonexistent/model", None),
        Status::Io,
        &["/nonexistent/model"],
    );
    Ok(())
}

// save_pretrained -> from_pretrained: identical weights, sharded or not; eos ids of
// generation_config.json are the sessions' default stop tokens; a foreign directory is refused.
#[test]
fn save_pretrained_round_trips_and_eos_are_stop_tokens() -> Result<()> {
    let ctx = Context::cpu()?;
    let m = Model::from_pretrained(&ctx, fixture("gqa"), None)?;
    let tmp = std::env::temp_dir().join(format!("fp4rl_rust_pretrained_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let (one, shards) = (tmp.join("one"), tmp.join("shards"));
    m.save_pretrained(&one, DType::F32, 0)?;
    m.save_pretrained(&shards, DType::F32, 40000)?;
    assert!(shards.join("model.safetensors.index.json").is_file());
    for d in [&one, &shards] {
        let r = Model::from_pretrained(&ctx, d, None)?;
        for name in param_names(2, false) {
            assert_eq!(r.param(&name)?, m.param(&name)?, "{name}");
        }
    }
    assert!(RlSession::new(&m, None)?.stop_tokens()?.is_empty());
    std::fs::write(one.join("generation_config.json"), "{\"eos_token_id\": [3, 9]}").unwrap();
    let r = Model::from_pretrained(&ctx, &one, None)?;
    let mut s = RlSession::new(&r, None)?;
    assert_eq!(s.stop_tokens()?, vec![3, 9]);
    s.set_stop_tokens(&[4])?;
    assert_eq!(s.stop_tokens()?, vec![4]);
    let mine = tmp.join("mine");
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::write(mine.join("notes.txt"), "keep").unwrap();
    assert_err(m.save_pretrained(&mine, DType::F32, 0), Status::InvalidArgument, &["mine"]);
    assert_eq!(std::fs::read_to_string(mine.join("notes.txt")).unwrap(), "keep");
    drop(s);
    std::fs::remove_dir_all(&tmp).unwrap();
    Ok(())
}

// The HF fixture: load it, compare the loaded weights with the file, and the FP32 logits with
// the ones transformers computed (tests/test_model.c's parity check, through the safe API).
#[test]
fn loads_the_hf_gqa_fixture_and_matches_its_logits() -> Result<()> {
    let ctx = Context::cpu()?;
    let dir = fixture("gqa");
    let mut p = QuantPolicy::new()?;
    p.set_train_numerics(Numerics::Fp32)?;
    let m = Model::from_pretrained(&ctx, &dir, Some(&p))?;
    assert_eq!(
        (
            m.vocab_size()?,
            m.info(ModelInfo::NumKvHeads)?,
            m.info(ModelInfo::TiedEmbeddings)?
        ),
        (96, 2, 0)
    );
    for name in param_names(2, false) {
        let (dtype, shape, data) = safetensors_tensor(&dir.join("model.safetensors"), &name);
        assert_eq!(dtype, "F32");
        assert_eq!(m.param_shape(&name)?, shape, "{name}");
        assert_eq!(m.param(&name)?, f32s(&data), "{name}");
    }
    let reference = dir.join("reference.safetensors");
    let (_, ids_shape, ids) = safetensors_tensor(&reference, "input_ids");
    let (_, _, lens) = safetensors_tensor(&reference, "lengths");
    let (_, _, want) = safetensors_tensor(&reference, "logits");
    let (tokens, lengths, want) = (i32s(&ids), i32s(&lens), f32s(&want));
    let logits = m.logits(&tokens, Some(&lengths), ids_shape[1] as usize)?;
    assert_eq!(logits.len(), want.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in logits.iter().zip(&want) {
        num += (*a as f64 - *b as f64).powi(2);
        den += (*b as f64).powi(2);
    }
    let rel = (num / den).sqrt();
    assert!(rel <= 1e-4, "logits relative error {rel:.3e} > 1e-4");
    let (_, _, want_loss) = safetensors_tensor(&reference, "loss");
    let loss = m.compute_gradients(&tokens, Some(&lengths), None, ids_shape[1] as usize)?;
    let want_loss = f32s(&want_loss)[0] as f64;
    assert!(
        (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
        "loss {loss} vs HF {want_loss}"
    );
    let (_, _, g) = safetensors_tensor(&reference, "grad.model.norm.weight");
    let (g, want_g) = (m.grad("model.norm.weight")?, f32s(&g));
    let e: f64 = g
        .iter()
        .zip(&want_g)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum::<f64>()
        .sqrt()
        / want_g.iter().map(|b| (*b as f64).powi(2)).sum::<f64>().sqrt();
    assert!(e <= 1e-3, "grad rel. error {e:.3e}");
    Ok(())
}

#[test]
fn load_errors_leave_the_weights() -> Result<()> {
    let ctx = Context::cpu()?;
    let m = Model::from_config(&ctx, TINY, None, 3)?;
    let before = all_params(&m)?;
    assert_err(
        m.load("/nonexistent/model.safetensors"),
        Status::Io,
        &["cannot open", "/nonexistent/model.safetensors"],
    );
    let tmp = TempDir::new("load");
    let junk = tmp.path().join("junk.safetensors");
    std::fs::write(&junk, b"\x10\0\0\0\0\0\0\0{\"a\": 1}       ").unwrap();
    assert_err(m.load(&junk), Status::Corrupt, &["junk.safetensors", "header length"]);
    // a valid file of another model: names or shapes do not fit
    assert_err(m.load(fixture("gqa").join("model.safetensors")), Status::Corrupt, &[]);
    assert_err(m.load("a\0b"), Status::InvalidArgument, &["Model::load", "NUL"]);
    assert_eq!(all_params(&m)?, before, "a failed load changes nothing");
    Ok(())
}

#[test]
fn save_and_load_round_trip() -> Result<()> {
    let ctx = Context::cpu()?;
    let tmp = TempDir::new("save");
    let m = Model::from_config(&ctx, TINY, None, 4)?;
    let path = tmp.path().join("model.safetensors");
    m.save(&path, DType::F32)?;
    let m2 = Model::from_config(&ctx, TINY, None, 5)?;
    m2.load(&path)?;
    assert_eq!(all_params(&m2)?, all_params(&m)?);
    // BF16: each weight rounded to 8 significant bits
    let pb = tmp.path().join("bf16.safetensors");
    m.save(&pb, DType::Bf16)?;
    m2.load(&pb)?;
    for (a, b) in all_params(&m)?.iter().flatten().zip(all_params(&m2)?.iter().flatten()) {
        assert!((a - b).abs() <= a.abs() / 128.0, "{a} vs {b}");
    }
    assert_err(m.save(&pb, DType::Mxfp4), Status::Dtype, &["fp4rl_model_save"]);
    assert_err(
        m.save(tmp.path().join("no/such/dir/m.safetensors"), DType::F32),
        Status::Io,
        &["cannot create"],
    );
    Ok(())
}

#[test]
fn parameters_and_gradients() -> Result<()> {
    let ctx = Context::cpu()?;
    let m = Model::from_config(&ctx, TINY, None, 6)?;
    let name = "model.layers.1.mlp.down_proj.weight";
    assert_eq!(m.param_shape(name)?, [32, 64]);
    assert_eq!(m.param_shape("model.norm.weight")?, [32]);
    let mut w = m.param(name)?;
    w.iter_mut().for_each(|x| *x = 0.25);
    m.set_param(name, &w)?;
    assert_eq!(m.param(name)?, w);
    assert_err(
        m.set_param(name, &w[1..]),
        Status::Shape,
        &["fp4rl_model_set_param", name],
    );
    assert_err(
        m.param("model.nope"),
        Status::InvalidArgument,
        &["no parameter \"model.nope\""],
    );
    assert_err(m.grad("model.nope"), Status::InvalidArgument, &["model.nope"]);
    assert_err(
        m.param("lm_head.weight"),
        Status::InvalidArgument,
        &["ties lm_head.weight"],
    );
    // a backward fills the gradients
    let tokens: Vec<i32> = (0..16).map(|i| i % 16).collect();
    let loss = m.compute_gradients(&tokens, None, None, 8)?;
    assert!(loss.is_finite() && loss > 0.0);
    let g = m.grad(name)?;
    assert_eq!(g.len(), 32 * 64);
    assert!(g.iter().any(|&x| x != 0.0) && g.iter().all(|x| x.is_finite()));
    Ok(())
}

#[test]
fn forward_shapes_and_batch_errors() -> Result<()> {
    let ctx = Context::cpu()?;
    let m = Model::from_config(&ctx, TINY, None, 7)?;
    let tokens: Vec<i32> = vec![13, 1, 10, 2, 11, 3, 12, 0, 13, 4, 10, 5, 11, 9, 0, 0];
    let lengths = [7, 6];
    let logits = m.logits(&tokens, Some(&lengths), 8)?;
    assert_eq!(logits.len(), 2 * 8 * 16);
    assert!(logits[..7 * 16].iter().all(|x| x.is_finite()));
    assert!(
        logits[7 * 16..8 * 16].iter().all(|&x| x == 0.0),
        "0 past a sequence's length"
    );
    let lp = m.token_logprobs(&tokens, Some(&lengths), 8)?;
    assert_eq!(lp.len(), 16);
    assert_eq!(lp[0], 0.0);
    assert!(lp[1..7].iter().all(|&x| x < 0.0));
    assert!(lp[14..].iter().all(|&x| x == 0.0));
    // the log-probs are the log-softmax of the logits at the previous position
    let row = &logits[16 * 2..16 * 3]; // position 2 predicts token 3
    let lse = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
    assert!((lp[3] as f64 - (row[tokens[3] as usize] as f64 - lse)).abs() < 1e-4);
    // Rust-side checks: slices that do not fit the batch
    assert_err(
        m.logits(&tokens[..15], None, 8),
        Status::Shape,
        &["Model::logits", "seq_len 8"],
    );
    assert_err(
        m.logits(&tokens, Some(&[7]), 8),
        Status::Shape,
        &["1 lengths", "2 sequences"],
    );
    assert_err(
        m.train_step(&tokens, None, Some(&[1.0; 3]), 8),
        Status::Shape,
        &["loss mask"],
    );
    // the library's checks
    assert_err(
        m.logits(&tokens, None, 0),
        Status::Shape,
        &["fp4rl_model_logits", ">= 1"],
    );
    assert_err(
        m.logits(&[], None, 8),
        Status::Shape,
        &["fp4rl_model_logits", "batch 0"],
    );
    assert_err(
        m.logits(&tokens, Some(&[9, 1]), 8),
        Status::InvalidArgument,
        &["lengths[0] = 9"],
    );
    let mut bad = tokens.clone();
    bad[3] = 16;
    assert_err(
        m.token_logprobs(&bad, None, 8),
        Status::InvalidArgument,
        &["outside the vocabulary"],
    );
    let long = vec![1i32; 33];
    assert_err(m.logits(&long, None, 33), Status::Shape, &["max_position_embeddings"]);
    Ok(())
}

#[test]
fn supervised_training_lowers_the_loss() -> Result<()> {
    let ctx = Context::cpu()?;
    let mut p = QuantPolicy::with_preset(Preset::Hif4Rl)?;
    p.set_train_numerics(Numerics::Fp4)?;
    let m = Model::from_config(&ctx, TINY, Some(&p), 8)?;
    m.set_hparam(MParam::Lr, 3e-3)?;
    let mut rng = addition::Rng(1);
    let (tok, len, mask) = addition::sft_batch(&mut rng, 9, 16, 8);
    let first = m.train_step(&tok, Some(&len), Some(&mask), 8)?;
    assert!(first.grad_norm > 0.0);
    let mut last = first;
    for _ in 0..15 {
        last = m.train_step(&tok, Some(&len), Some(&mask), 8)?;
    }
    assert_eq!(m.step()?, 16);
    assert!(last.loss < 0.7 * first.loss, "loss {} -> {}", first.loss, last.loss);
    // another policy for the same model
    let mut b = QuantPolicy::new()?;
    b.set_train_numerics(Numerics::Bf16)?;
    m.set_policy(&b)?;
    m.train_step(&tok, Some(&len), Some(&mask), 8)?;
    Ok(())
}
