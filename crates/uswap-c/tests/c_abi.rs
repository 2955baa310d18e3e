//! The C ABI as C and C++ programs use it, and its header in sync with
//! the code.

use std::path::{Path, PathBuf};
use std::process::Command;

const CRATE: &str = env!("CARGO_MANIFEST_DIR");

/// The header cbindgen writes from `src/lib.rs` equals the one checked in
/// (`USWAP_WRITE_HEADER=1` rewrites it).
#[test]
fn the_header_is_the_one_cbindgen_writes() {
    let config = cbindgen::Config::from_file(Path::new(CRATE).join("cbindgen.toml")).unwrap();
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(CRATE)
        .with_config(config)
        .generate()
        .expect("cbindgen")
        .write(&mut generated);
    let path = Path::new(CRATE).join("include/uswap.h");
    if std::env::var_os("USWAP_WRITE_HEADER").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/uswap.h is not what cbindgen writes from src/lib.rs: run `USWAP_WRITE_HEADER=1 cargo test -p uswap-c --test c_abi` and commit it\n--- generated\n{}",
        String::from_utf8_lossy(&generated)
    );
}

/// The static library of this build's profile, built (or found up to
/// date): `cargo test` builds the test harness, not the staticlib.
fn static_lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/c_abi-HASH
    let profile_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let release = profile_dir.ends_with("release");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "uswap-c"]);
    if release {
        cmd.arg("--release");
    }
    let out = cmd.output().expect("run cargo");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lib = profile_dir.join("libuswap_c.a");
    assert!(lib.exists(), "{} after the build", lib.display());
    lib
}

fn compile(compiler: &str, source: &Path, out: &Path, lib: &Path) {
    let built = Command::new(compiler)
        .args(["-O2", "-Wall", "-Werror", "-I"])
        .arg(Path::new(CRATE).join("include"))
        .arg(source)
        .arg(lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("{compiler}: {e}; install a C and C++ compiler (scripts/check does)"));
    assert!(
        built.status.success(),
        "{compiler} {}: {}",
        source.display(),
        String::from_utf8_lossy(&built.stderr)
    );
}

/// Run a compiled program; it must succeed.  Its standard output.
fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `examples/fill.c`: a region four times its budget written and verified
/// byte by byte, the statistics read, a discard, the budget changed,
/// every error code a caller can provoke, a forked child reading its
/// parent's memory and mapping its own; in SIGBUS mode, and in
/// handler-thread mode where this user may.  `tests/fill.cpp`: the same
/// header from C++, with RAII over the handles.
#[test]
fn c_and_cpp_programs_page_four_times_their_budget() {
    let lib = static_lib();
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("fill");
    compile("cc", &Path::new(CRATE).join("examples/fill.c"), &c, &lib);
    let mut modes = vec!["sigbus"];
    if root() {
        modes.push("handler");
    }
    for mode in modes {
        let text = run_ok(Command::new(&c).args(["128", mode]));
        assert!(text.contains("every byte read back as written"), "{mode}: {text}");
        assert!(
            text.contains("a forked child read its parent's memory"),
            "{mode}: {text}"
        );
        assert!(
            text.contains("1000 regions mapped and unmapped, nothing left"),
            "{mode}: {text}"
        );
        for code in [1, 2, 3, 4, 7] {
            assert!(
                text.contains(&format!("error {code} for")),
                "{mode}: code {code} not provoked: {text}"
            );
        }
    }
    let cpp = dir.path().join("fill_cpp");
    compile("c++", &Path::new(CRATE).join("tests/fill.cpp"), &cpp, &lib);
    let text = run_ok(&mut Command::new(&cpp));
    assert!(text.contains("every word read back"), "{text}");
}

/// The README's C program, as it is written there, compiles and runs.
#[test]
fn the_readme_c_program_runs() {
    let readme = std::fs::read_to_string(Path::new(CRATE).join("../../README.md")).unwrap();
    let start = readme.find("```c\n").expect("a C block in the README") + 5;
    let end = start + readme[start..].find("```").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("hello.c");
    std::fs::write(&src, &readme[start..end]).unwrap();
    let exe = dir.path().join("hello");
    compile("cc", &src, &exe, &static_lib());
    let text = run_ok(&mut Command::new(&exe));
    assert!(text.contains("pages evicted"), "{text}");
}
