//! The test suite of the safe crate, one binary so that its tests share the two cores: each
//! test makes its own Context (contexts share no state), and cargo runs them in parallel.
#[path = "../common/mod.rs"]
mod common;

mod basics;
mod handles;
mod model;
mod rl_e2e;
mod session;
mod tensor;
mod zero_copy;
