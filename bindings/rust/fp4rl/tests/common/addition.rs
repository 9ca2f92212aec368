//! The built-in addition task of examples/addition_task.{h,c}, in Rust: the reward of the RL
//! tests and of examples/grpo.rs is written in Rust, as a trainer using this crate would.
//!
//! Multi-digit addition in a 16-token vocabulary: 0..9 digits, 10 '+', 11 '=', 12 end of
//! answer (the stop token), 13 start of prompt. A prompt is `<s> a + b =`; the answer is the
//! digits of a + b and the stop token. Reward 1 for exactly that, else 0.
#![allow(dead_code)] // each user of this file (the tests, the example) needs a different part

pub const PLUS: i32 = 10;
pub const EQ: i32 = 11;
pub const END: i32 = 12;
pub const BOS: i32 = 13;
pub const VOCAB: i64 = 16;

/// The decimal digits of x, no leading zeros.
pub fn digits(mut x: i64) -> Vec<i32> {
    let mut d = Vec::new();
    loop {
        d.push((x % 10) as i32);
        x /= 10;
        if x == 0 {
            break;
        }
    }
    d.reverse();
    d
}

/// The prompt for a + b.
pub fn prompt(a: i64, b: i64) -> Vec<i32> {
    let mut p = vec![BOS];
    p.extend(digits(a));
    p.push(PLUS);
    p.extend(digits(b));
    p.push(EQ);
    p
}

fn number(t: &[i32], i: &mut usize) -> Option<i64> {
    let start = *i;
    let mut x = 0i64;
    while *i < t.len() && (0..=9).contains(&t[*i]) && *i - start < 18 {
        x = x * 10 + t[*i] as i64;
        *i += 1;
    }
    (*i > start).then_some(x)
}

/// a and b of a well-formed prompt.
pub fn parse(p: &[i32]) -> Option<(i64, i64)> {
    if p.len() < 5 || p[0] != BOS {
        return None;
    }
    let mut i = 1;
    let a = number(p, &mut i)?;
    if p.get(i) != Some(&PLUS) {
        return None;
    }
    i += 1;
    let b = number(p, &mut i)?;
    if p.get(i) != Some(&EQ) || i + 1 != p.len() {
        return None;
    }
    Some((a, b))
}

/// 1 when the completion is exactly the digits of a + b and the stop token, else 0.
pub fn reward(prompt: &[i32], completion: &[i32]) -> f64 {
    let Some((a, b)) = parse(prompt) else { return 0.0 };
    let mut want = digits(a + b);
    want.push(END);
    if completion == want.as_slice() {
        1.0
    } else {
        0.0
    }
}

/// The task's deterministic stream of problems (xorshift64*, the same numbers as add_rand).
pub struct Rng(pub u64);

impl Rng {
    /// Uniform in [0, n).
    pub fn below(&mut self, n: i64) -> i64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(2685821657736338717) >> 11) % n as u64) as i64
    }

    /// n prompts with operands in [0, max_operand].
    pub fn prompts(&mut self, max_operand: i64, n: usize) -> Vec<Vec<i32>> {
        (0..n)
            .map(|_| {
                let a = self.below(max_operand + 1);
                let b = self.below(max_operand + 1);
                prompt(a, b)
            })
            .collect()
    }
}

/// A teacher-forced sequence (prompt, answer, stop) and its loss mask (1 on the answer).
pub fn sequence(a: i64, b: i64) -> (Vec<i32>, Vec<f32>) {
    let mut t = prompt(a, b);
    let p = t.len();
    t.extend(digits(a + b));
    t.push(END);
    let mask = (0..t.len()).map(|i| if i >= p { 1.0 } else { 0.0 }).collect();
    (t, mask)
}

/// A right-padded supervised batch of `n` sequences of `seq_len`: tokens, lengths, loss mask.
pub fn sft_batch(rng: &mut Rng, max_operand: i64, n: usize, seq_len: usize) -> (Vec<i32>, Vec<i32>, Vec<f32>) {
    let (mut tok, mut len, mut mask) = (vec![0; n * seq_len], vec![0; n], vec![0.0; n * seq_len]);
    for b in 0..n {
        let x = rng.below(max_operand + 1);
        let y = rng.below(max_operand + 1);
        let (t, m) = sequence(x, y);
        tok[b * seq_len..b * seq_len + t.len()].copy_from_slice(&t);
        mask[b * seq_len..b * seq_len + t.len()].copy_from_slice(&m);
        len[b] = t.len() as i32;
    }
    (tok, len, mask)
}
