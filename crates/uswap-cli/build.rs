//! Two things the executable carries from its build.
//!
//! `uswap --version` names the commit it was built from: a bug report
//! then says which code ran.  Outside a git checkout (a source tarball)
//! it says only the version.
//!
//! The preload library (crates/uswap-preload, a cdylib) is built here and
//! carried inside `uswap`, so that one copied file runs programs:
//! `cargo install`, a container image with `uswap` alone.  Cargo cannot
//! depend on a cdylib's file (artifact dependencies are unstable), so this
//! runs a cargo of its own for it, always release (the library runs in the
//! program's every fault and allocation), without debug information (it
//! would make `uswap` 30 MiB larger), into a target directory of its own
//! beside the outer one: the outer build holds its own directory's lock,
//! and the debug, release, clippy and doc builds share this one.
//! `USWAP_EMBED_PRELOAD=0` leaves it out (then `uswap run` needs the
//! library beside the executable, as the workspace's builds put it).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    version();
    preload();
    println!("cargo:rerun-if-changed=build.rs");
}

fn version() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    // The commit only: whether the tree had changes would go stale, as
    // edits to sources rebuild the crate without running this again.
    let version = match commit {
        Some(c) => format!("{} ({c})", env!("CARGO_PKG_VERSION")),
        None => env!("CARGO_PKG_VERSION").to_string(),
    };
    println!("cargo:rustc-env=USWAP_VERSION={version}");
    // Again when HEAD moves (a commit, a checkout); the files' own
    // changes rebuild this crate anyway.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={dir}/{r}");
        }
    }
}

fn preload() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let embedded = out.join("libuswap_preload.so");
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let crates = manifest.parent().expect("crates/uswap-cli has a parent");
    println!("cargo:rerun-if-env-changed=USWAP_EMBED_PRELOAD");
    for dir in ["uswap-preload", "uswap"] {
        println!(
            "cargo:rerun-if-changed={}",
            crates.join(dir).join("src").display()
        );
        println!(
            "cargo:rerun-if-changed={}",
            crates.join(dir).join("Cargo.toml").display()
        );
    }
    if let Some(root) = crates.parent() {
        println!("cargo:rerun-if-changed={}", root.join("Cargo.lock").display());
    }
    if std::env::var("USWAP_EMBED_PRELOAD").is_ok_and(|v| v == "0") {
        std::fs::write(&embedded, b"").expect("writing OUT_DIR");
        return;
    }
    let built = build_preload(&out, &crates.join("uswap-preload/Cargo.toml"));
    std::fs::copy(&built, &embedded).unwrap_or_else(|e| panic!("copying {}: {e}", built.display()));
}

/// Build the preload library with a cargo of its own; the path of the
/// library built.
fn build_preload(out: &Path, manifest: &Path) -> PathBuf {
    // OUT_DIR is TARGET/PROFILE/build/uswap-cli-HASH/out.
    let target = out
        .ancestors()
        .nth(4)
        .map(|t| t.join("embedded-preload"))
        .unwrap_or_else(|| out.join("embedded-preload"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--locked", "--lib", "--manifest-path"])
        .arg(manifest)
        .arg("--target-dir")
        .arg(&target);
    // What cargo tells a build script about the outer build is not for
    // the inner one: a wrapper (clippy's driver), the outer profile's
    // settings, the package's variables.  Left in, each would make the
    // inner build differ between outer ones and rebuild it every time.
    // The jobserver (CARGO_MAKEFLAGS) stays: the inner build shares the
    // outer one's jobs.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let outer = (k.starts_with("CARGO_") && k != "CARGO_MAKEFLAGS" && k != "CARGO_HOME")
            || k.starts_with("DEP_")
            || [
                "RUSTC",
                "RUSTC_WRAPPER",
                "RUSTC_WORKSPACE_WRAPPER",
                "RUSTC_LINKER",
                "RUSTDOC",
                "CLIPPY_ARGS",
                "OUT_DIR",
                "TARGET",
                "HOST",
                "PROFILE",
                "OPT_LEVEL",
                "DEBUG",
                "NUM_JOBS",
            ]
            .contains(&k.as_str());
        if outer {
            cmd.env_remove(&k);
        }
    }
    cmd.env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("running cargo for the preload library: {e}"));
    if !status.success() {
        panic!(
            "building the preload library failed ({status}); to build uswap without it inside, set USWAP_EMBED_PRELOAD=0"
        );
    }
    target.join("release/libuswap_preload.so")
}
