//! `uswap --version` names the commit it was built from: a bug report
//! then says which code ran.  Outside a git checkout (a source tarball)
//! it says only the version.

use std::process::Command;

fn main() {
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
    println!("cargo:rerun-if-changed=build.rs");
}
