// Locates libfp4rl with the pkg-config program (crates.io is not reachable where this is built,
// so no pkg-config crate: the program is run directly and its output parsed).
//
// Honoured: PKG_CONFIG (the program), PKG_CONFIG_PATH / PKG_CONFIG_LIBDIR /
// PKG_CONFIG_SYSROOT_DIR (read by pkg-config itself; listed so cargo re-runs this script when
// they change). Emits:
//   rustc-link-search / rustc-link-lib from `pkg-config --libs fp4rl` (they propagate to every
//     crate that links this one);
//   an rpath to the library directory for this crate's own tests (rustc-link-arg does not
//     propagate, so dependents get the directory as DEP_FP4RL_LIBDIR and add their own);
//   metadata DEP_FP4RL_{LIBDIR,INCLUDE,VERSION} for dependents' build scripts;
//   FP4RL_SYS_INCLUDE_DIR for the header-drift test, which checks the installed header too.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

// The ABI these declarations were written from (abi/include/fp4rl/fp4rl.h). The library is
// 0.x, so a different minor version may change the ABI: refuse to link one.
const ABI_MAJOR: u32 = 0;
const ABI_MINOR: u32 = 1;

fn pkg_config(args: &[&str]) -> Result<String, String> {
    let program = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let out = Command::new(&program)
        .args(args)
        .arg("fp4rl")
        .output()
        .map_err(|e| format!("could not run `{program}` ({e}); install pkg-config or set PKG_CONFIG"))?;
    if !out.status.success() {
        return Err(format!(
            "`{program} {} fp4rl` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8(out.stdout)
        .map(|s| s.trim().to_string())
        .map_err(|_| format!("`{program} {}` printed non-UTF-8 output", args.join(" ")))
}

// "/p/lib/pkgconfig/../../lib" -> "/p/lib" when it exists: nicer in rpaths and messages.
fn tidy(dir: &str) -> PathBuf {
    Path::new(dir).canonicalize().unwrap_or_else(|_| PathBuf::from(dir))
}

fn fail(msg: &str) -> ! {
    // A build script reports a fatal problem by panicking; say how to fix it.
    panic!(
        "\n\nfp4rl-sys: {msg}\n\nlibfp4rl was not found. Build and install it, then point pkg-config at it:\n  \
         cmake -S . -B build && cmake --build build && cmake --install build --prefix PREFIX\n  \
         export PKG_CONFIG_PATH=PREFIX/lib/pkgconfig\n(bindings/rust/run_tests.sh does all of this.)\n\n"
    )
}

fn main() {
    for var in [
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    let version = pkg_config(&["--modversion"]).unwrap_or_else(|e| fail(&e));
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(ABI_MAJOR), Some(ABI_MINOR)) => {}
        _ => fail(&format!(
            "pkg-config found libfp4rl {version}, but these declarations are for the {ABI_MAJOR}.{ABI_MINOR} ABI"
        )),
    }

    let libs = pkg_config(&["--libs"]).unwrap_or_else(|e| fail(&e));
    let mut link_dirs = Vec::new();
    for flag in libs.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            let dir = tidy(dir);
            println!("cargo:rustc-link-search=native={}", dir.display());
            link_dirs.push(dir);
        } else if let Some(lib) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib={lib}");
        } else {
            // Nothing else is in fp4rl.pc today; pass anything new to the linker of our own
            // targets rather than dropping it silently.
            println!("cargo:warning=fp4rl-sys: passing pkg-config flag {flag} to the linker");
            println!("cargo:rustc-link-arg={flag}");
        }
    }

    let libdir = pkg_config(&["--variable=libdir"])
        .map(|d| tidy(&d))
        .unwrap_or_else(|e| fail(&e));
    let includedir = pkg_config(&["--variable=includedir"])
        .map(|d| tidy(&d))
        .unwrap_or_else(|e| fail(&e));
    // Re-run when the installed library's .pc file changes (a new version or location); an
    // unchanged .pc means the same ABI, and the library itself is linked dynamically.
    if let Ok(pcdir) = pkg_config(&["--variable=pcfiledir"]) {
        println!("cargo:rerun-if-changed={}", tidy(&pcdir).join("fp4rl.pc").display());
    }

    // Tests of this crate run without LD_LIBRARY_PATH: the library directory goes into their
    // rpath (ELF and Mach-O linkers both take -rpath; Windows has no rpath).
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os != "windows" {
        if !link_dirs.contains(&libdir) {
            link_dirs.push(libdir.clone());
        }
        for dir in &link_dirs {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
    }

    println!("cargo:libdir={}", libdir.display());
    println!("cargo:include={}", includedir.display());
    println!("cargo:version={version}");
    println!("cargo:rustc-env=FP4RL_SYS_INCLUDE_DIR={}", includedir.display());
    println!("cargo:rustc-env=FP4RL_SYS_LIB_VERSION={version}");
}
