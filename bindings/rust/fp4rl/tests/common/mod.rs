//! Helpers shared by the test binaries.
#![allow(dead_code)] // not every test binary uses every helper

pub mod addition;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use fp4rl::{Model, Result};

/// The tiny model of tests/test_session.c (vocabulary of the addition task).
pub const TINY: &str = r#"{"model_type": "qwen2", "vocab_size": 16, "hidden_size": 32, "intermediate_size": 64,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "max_position_embeddings": 32, "tie_word_embeddings": true}"#;

/// tests/fixtures/qwen2/<name> of the repository.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../tests/fixtures/qwen2")
        .join(name)
}

/// A fresh directory under the system's temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "fp4rl-rs-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The HF names of a Qwen2 model's parameters.
pub fn param_names(layers: usize, tied: bool) -> Vec<String> {
    let mut n = vec!["model.embed_tokens.weight".to_string()];
    for l in 0..layers {
        let p = format!("model.layers.{l}.");
        for s in [
            "input_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.q_proj.bias",
            "self_attn.k_proj.weight",
            "self_attn.k_proj.bias",
            "self_attn.v_proj.weight",
            "self_attn.v_proj.bias",
            "self_attn.o_proj.weight",
            "post_attention_layernorm.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        ] {
            n.push(format!("{p}{s}"));
        }
    }
    n.push("model.norm.weight".to_string());
    if !tied {
        n.push("lm_head.weight".to_string());
    }
    n
}

/// Every parameter of a model (2 layers unless it says otherwise), in param_names order.
pub fn all_params(m: &Model) -> Result<Vec<Vec<f32>>> {
    let layers = m.info(fp4rl::ModelInfo::NumLayers)? as usize;
    let tied = m.info(fp4rl::ModelInfo::TiedEmbeddings)? != 0;
    param_names(layers, tied).iter().map(|n| m.param(n)).collect()
}

/// A tensor of a safetensors file: its shape and raw little-endian bytes. Enough of the format
/// for the fixtures (compact JSON header written by the safetensors library); test-only.
pub fn safetensors_tensor(path: &Path, name: &str) -> (String, Vec<i64>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    let key = format!("\"{name}\":{{");
    let at = header
        .find(&key)
        .unwrap_or_else(|| panic!("{name} not in {}", path.display()))
        + key.len();
    let entry = &header[at..at + header[at..].find('}').unwrap()];
    let field = |f: &str| -> &str {
        let k = format!("\"{f}\":");
        let s = &entry[entry.find(&k).unwrap() + k.len()..];
        let end = if s.starts_with('[') {
            s.find(']').unwrap() + 1
        } else {
            s.find(',').unwrap_or(s.len())
        };
        &s[..end]
    };
    let list = |s: &str| -> Vec<i64> {
        s.trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .filter(|x| !x.is_empty())
            .map(|x| x.trim().parse().unwrap())
            .collect()
    };
    let dtype = field("dtype").trim_matches('"').to_string();
    let shape = list(field("shape"));
    let off = list(field("data_offsets"));
    let data = bytes[8 + n + off[0] as usize..8 + n + off[1] as usize].to_vec();
    (dtype, shape, data)
}

pub fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

pub fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Asserts that `r` failed with `status` and a message containing every `needle`.
#[track_caller]
pub fn assert_err<T: std::fmt::Debug>(r: Result<T>, status: fp4rl::Status, needles: &[&str]) -> fp4rl::Error {
    let e = r.expect_err("the call succeeded; an error was expected");
    assert_eq!(e.status(), status, "wrong status; message: {}", e.message());
    for n in needles {
        assert!(
            e.message().contains(n),
            "message {:?} does not contain {n:?}",
            e.message()
        );
    }
    e
}
