// rustc-link-arg does not propagate from fp4rl-sys to the crates that use it, so the rpath to
// libfp4rl that lets this crate's tests, examples and doctests run without LD_LIBRARY_PATH is
// added here, from the library directory fp4rl-sys found (its `links` metadata,
// DEP_FP4RL_LIBDIR). Crates depending on `fp4rl` add their own rpath the same way or set
// LD_LIBRARY_PATH.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_FP4RL_LIBDIR");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if let Ok(dir) = std::env::var("DEP_FP4RL_LIBDIR") {
        if target_os != "windows" {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
