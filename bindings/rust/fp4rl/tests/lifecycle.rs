//! No leak over 1000 create/destroy rounds of every handle. A binary with this one test, so
//! that the memory measurement sees no other test's allocations.
#[path = "common/mod.rs"]
mod common;

use fp4rl::*;

use common::TINY;

/// Resident memory of this process in bytes (Linux), or None elsewhere.
fn rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// One round: every kind of handle made, used and dropped.
fn round(i: usize, data: &[f32]) -> Result<()> {
    let ctx = Context::cpu()?;
    ctx.set_seed(i as u64)?;
    let policy = QuantPolicy::with_preset(Preset::Hif4Rl)?;
    let src = Tensor::from_slice(&ctx, data, &[256, 256])?;
    let q = src.quantize(DType::Hif4, Some(&policy), Role::Weight)?;
    drop(src); // a quantized tensor owns its data: its source can go first
    let deq = q.dequantize(DType::F32)?;
    assert_eq!(deq.numel(), 256 * 256);
    let model = Model::from_config(&ctx, TINY, Some(&policy), i as u64)?;
    let mut session = RlSession::new(&model, Some(&policy))?;
    drop(policy); // models and sessions copy the policy
    session.set(RlParam::GroupSize, 2.0)?;
    // an error in every round: its message must not leak either
    assert!(session.metric("nope").is_err());
    drop(session);
    drop(model);
    drop(q);
    drop(deq);
    drop(ctx);
    Ok(())
}

#[test]
fn a_thousand_create_destroy_rounds_do_not_leak() -> Result<()> {
    let data: Vec<f32> = (0..256 * 256).map(|i| (i as f32 * 0.01).sin()).collect();
    for i in 0..100 {
        round(i, &data)?; // warm up the allocator
    }
    let before = rss();
    for i in 100..1000 {
        round(i, &data)?;
    }
    if let (Some(a), Some(b)) = (before, rss()) {
        // A leak of any handle per round is at least a 256 KiB tensor or a model with its
        // optimizer state: 900 rounds would add hundreds of MiB.
        let grown = b.saturating_sub(a);
        println!(
            "RSS {:.1} MiB -> {:.1} MiB over 900 rounds",
            a as f64 / 1048576.0,
            b as f64 / 1048576.0
        );
        assert!(
            grown < 32 << 20,
            "RSS grew by {grown} bytes over 900 create/destroy rounds"
        );
    }
    Ok(())
}
