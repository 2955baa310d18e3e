//! `uswap run` pages all of a program's anonymous memory, however its
//! runtime maps it: OpenJDK and V8 (Node) reserve their heaps inaccessible
//! (`mmap(PROT_NONE)`) and commit them a part at a time (`mmap(MAP_FIXED)`
//! over the reservation, `mprotect`), none of it through `malloc`; Go's
//! runtime does the same through cgo's `mmap`, and sets its threads'
//! signal stacks with the raw system call.  Each
//! program needs three times its budget or more, gives the plain run's
//! output, and its tree's anonymous memory (measured in a cgroup v1
//! memory group) stays within budget + 10% + the fixed overhead
//! (docs/DESIGN.md, "All anonymous memory").  `scripts/check` installs
//! the runtimes where they are missing.  Release builds only: the debug
//! pass would add two minutes to CI's twenty for the same paths, which
//! the debug pass of the C programs' tests (guest.rs, run_cli.rs) covers
//! with its assertions on.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// `name` on PATH, or a failure saying how to get it.
fn require(name: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{name} is not installed: install {package} (apt-get install {package}), or run scripts/check, which does"
    );
}

/// Arrays of longs (the budget's multiple) and a `HashMap` of 200 000
/// boxed keys and strings, each read back: every array's sum is checked
/// against the formula that filled it, and the program prints a digest.
const FILL_JAVA: &str = r#"
import java.util.HashMap;
public class Fill {
    public static void main(String[] a) {
        int mib = Integer.parseInt(a[0]);
        long[][] arrs = new long[mib][];
        for (int i = 0; i < mib; i++) {
            arrs[i] = new long[131072];
            for (int j = 0; j < 131072; j += 16) arrs[i][j] = (long) i * 131072 + j;
        }
        HashMap<Integer, String> m = new HashMap<>();
        for (int i = 0; i < 200000; i++) m.put(i, "v" + i);
        long s = 0;
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < mib; i++) {
                long t = 0;
                for (int j = 0; j < 131072; j += 16) t += arrs[i][j];
                long want = 8192L * i * 131072 + 16L * 8191 * 8192 / 2;
                if (t != want) throw new AssertionError("array " + i + ": " + t + " != " + want);
                s += t;
            }
        for (int i = 0; i < 200000; i += 7)
            if (!m.get(i).equals("v" + i)) throw new AssertionError("key " + i);
        System.out.println("sum " + s + " keys " + m.size());
    }
}
"#;

/// OpenJDK as users start it (no flags: G1, a heap of a quarter of the
/// machine reserved at start), 150 MiB of arrays and a HashMap under
/// 48 MiB.  Before this work its heap was never paged: 727 MB at a
/// 160 MiB budget.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a whole program paged at 3x its budget: run in the release pass (CI runs both)"
)]
fn openjdk_arrays_and_a_hashmap() {
    require("java", "default-jdk-headless");
    require("javac", "default-jdk-headless");
    let dir = open_dir(true);
    std::fs::write(dir.path().join("Fill.java"), FILL_JAVA).unwrap();
    compile_java(dir.path());
    tree_within_budget("java -cp . Fill 150", 48, &[], dir.path());
}

/// The same with the serial collector and a 2 GiB heap, as the issue ran
/// it: its heap is committed with `mmap(MAP_FIXED)` over its reservation
/// as it grows.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a whole program paged at 3x its budget: run in the release pass (CI runs both)"
)]
fn openjdk_with_the_serial_collector() {
    require("java", "default-jdk-headless");
    require("javac", "default-jdk-headless");
    let dir = open_dir(true);
    std::fs::write(dir.path().join("Fill.java"), FILL_JAVA).unwrap();
    compile_java(dir.path());
    tree_within_budget("java -XX:+UseSerialGC -Xmx2g -cp . Fill 150", 48, &[], dir.path());
}

fn compile_java(dir: &Path) {
    let out = Command::new("javac")
        .arg("Fill.java")
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "javac: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // For `nobody`, in SIGBUS mode.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.join("Fill.class"), std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// Typed arrays (V8 backing stores, through `malloc` and V8's own pages)
/// and a Map of 300 000 strings (V8's heap: pages committed with
/// `mprotect` in a reservation), each read back and checked.
const FILL_JS: &str = r#"
const mib = parseInt(process.argv[2]);
const arrs = [];
for (let i = 0; i < mib; i++) {
  const a = new Float64Array(131072);
  for (let j = 0; j < a.length; j += 64) a[j] = i * 131072 + j;
  arrs.push(a);
}
const m = new Map();
for (let i = 0; i < 300000; i++) m.set(i, "v" + i);
let s = 0;
for (let r = 0; r < 2; r++)
  arrs.forEach((a, i) => {
    let t = 0;
    for (let j = 0; j < a.length; j += 64) t += a[j];
    const want = 2048 * i * 131072 + 64 * 2047 * 2048 / 2;
    if (t !== want) throw new Error(`array ${i}: ${t} != ${want}`);
    s += t;
  });
for (let i = 0; i < 300000; i += 7) if (m.get(i) !== "v" + i) throw new Error(`key ${i}`);
console.log(`sum ${s} keys ${m.size}`);
"#;

/// Node: 100 MiB of typed arrays and a Map under 32 MiB.  Before this
/// work about 160 MB of V8's memory lived outside the budget.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a whole program paged at 3x its budget: run in the release pass (CI runs both)"
)]
fn node_typed_arrays_and_a_map() {
    require("node", "nodejs");
    let dir = open_dir(true);
    std::fs::write(dir.path().join("fill.js"), FILL_JS).unwrap();
    tree_within_budget("node fill.js 100", 32, &[], dir.path());
}

/// Perl: an array of 1.2 M strings (133 MiB plain) and a hash of 60 000
/// of them, under 40 MiB.  (A hash of 600 000 keys at 3x its budget
/// faults at random a million times: minutes under uswap and the kernel
/// alike, measured by `scripts/bench-programs`, docs/history/PERFORMANCE-LOG.md.)
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a whole program paged at 3x its budget: run in the release pass (CI runs both)"
)]
fn perl_array_and_hash() {
    require("perl", "perl");
    let dir = open_dir(true);
    std::fs::write(
        dir.path().join("arr.pl"),
        "my @a; for my $i (0..1199999) { push @a, \"value-\" . ($i * 7) . \"-\" . (\"x\" x ($i % 50)); }\n\
         my %h; for my $i (0..59999) { $h{\"key\" . ($i * 20)} = $a[$i * 20]; }\n\
         my $s = 0; for my $i (0..$#a) { $s += length($a[$i]) if $i % 3 == 0; }\n\
         for my $k (keys %h) { $s += length($h{$k}); }\n\
         print \"$s \", scalar(@a), \" \", scalar(keys %h), \"\\n\";\n",
    )
    .unwrap();
    tree_within_budget("perl arr.pl", 40, &[], dir.path());
}

/// sqlite3: an in-memory database of 1.2 M rows with an index on a text
/// column (58 MiB plain), queried through the index, under 18 MiB.  The
/// keys go in in order, as a log's or a counter's do (an index of random
/// keys at 3x its budget faults at random: `scripts/bench-programs`).
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a whole program paged at 3x its budget: run in the release pass (CI runs both)"
)]
fn sqlite3_in_memory_with_an_index() {
    require("sqlite3", "sqlite3");
    let dir = open_dir(true);
    std::fs::write(
        dir.path().join("db.sql"),
        "CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v INTEGER);\n\
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1200000)\n\
         INSERT INTO t SELECT x, printf('%08d-%d', x, x % 977), x * 7 FROM c;\n\
         CREATE INDEX tk ON t(k);\n\
         SELECT count(*), sum(v) FROM t WHERE k > '00600000';\n",
    )
    .unwrap();
    tree_within_budget("sqlite3 :memory: < db.sql", 18, &[], dir.path());
}

/// Go with cgo: the runtime maps its heap through libc's `mmap` (cgo's
/// `_cgo_mmap`: reserved `PROT_NONE`, committed with fixed mappings),
/// gives it back to the kernel with raw `madvise` (the scavenger,
/// `debug.FreeOSMemory`), runs its goroutines on stacks in that heap and
/// sets each thread's signal stack with the raw system call (in SIGBUS
/// mode the first signal on a signal stack that was out killed it, and a
/// trapped `write` overflowed a goroutine's 2 KiB stack: `signals.rs`,
/// "Alternate stacks").  150 MiB of slices and a map under 40 MiB, four
/// goroutines digesting them at once.
const CGO_GO: &str = r#"
package main

/*
static int twice(int x) { return 2 * x; }
*/
import "C"

import (
	"crypto/sha256"
	"fmt"
	"runtime/debug"
	"sync"
)

func fill(n, seed int) [][]byte {
	bufs := make([][]byte, n)
	for i := range bufs {
		b := make([]byte, 64<<10)
		for j := range b {
			b[j] = byte((i*31 + j + seed) % 251)
		}
		bufs[i] = b
	}
	return bufs
}

func main() {
	for r := 0; r < 3; r++ {
		g := fill(800, r)
		_ = g
		g = nil
		debug.FreeOSMemory()
	}
	bufs := fill(2400, 0)
	m := make(map[int]int, 200000)
	for i := 0; i < 200000; i++ {
		m[i*7] = i
	}
	sums := make([][32]byte, 4)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			h := sha256.New()
			for i := w; i < len(bufs); i += 4 {
				if bufs[i][1000] != byte((i*31+1000)%251) {
					panic(fmt.Sprint("slice ", i))
				}
				h.Write(bufs[i])
			}
			copy(sums[w][:], h.Sum(nil))
		}(w)
	}
	wg.Wait()
	s := 0
	for i := 0; i < 200000; i += 1000 {
		s += m[i*7]
	}
	fmt.Printf("%x %d %d %d\n", sha256.Sum256([]byte(fmt.Sprint(sums))), len(m), s, C.twice(21))
}
"#;

/// `go`, from PATH or where the official build installs it.
fn go() -> String {
    if Path::new("/usr/local/go/bin/go").exists() {
        return "/usr/local/go/bin/go".into();
    }
    require("go", "golang-go");
    "go".into()
}

/// Build the Go program `src` in `dir` as `name` (`cgo` false: a static
/// binary), with the user's Go build cache (an empty one builds the
/// standard library first: 20 s here).
fn go_build(dir: &Path, src: &str, name: &str, cgo: bool) {
    let pkg = dir.join(format!("{name}-src"));
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(pkg.join("main.go"), src).unwrap();
    std::fs::write(pkg.join("go.mod"), format!("module {name}\ngo 1.19\n")).unwrap();
    let out = Command::new(go())
        .args(["build", "-o"])
        .arg(dir.join(name))
        .arg(".")
        .current_dir(&pkg)
        .env("CGO_ENABLED", if cgo { "1" } else { "0" })
        .env("GOTOOLCHAIN", "local")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a whole program paged at 3x its budget: run in the release pass (CI runs both)"
)]
fn go_with_cgo() {
    let dir = open_dir(true);
    go_build(dir.path(), CGO_GO, "fill", true);
    for err in tree_within_budget("./fill", 40, &[], dir.path()) {
        // Go's runtime leaves through a raw `exit_group`: no exit handler
        // of the library runs, and `uswap run --stats` says the numbers
        // the program published last instead.
        assert!(
            err.contains("ended without exit handlers") && stat(&err, "evictions") > 0,
            "{err}"
        );
    }
}

/// A static Go binary (cgo off): uswap's library cannot enter it, so
/// `uswap run` refuses it in one line before it starts, and says how to
/// build one it can page.
#[test]
fn a_static_go_program_is_refused_in_one_line() {
    let dir = open_dir(false);
    go_build(
        dir.path(),
        "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"static go ran\") }\n",
        "st",
        false,
    );
    preload_built();
    let out = Command::new(env!("CARGO_BIN_EXE_uswap"))
        .args(["run", "--budget", "64M", "--", "./st"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused: {err}");
    assert!(
        out.stdout.is_empty(),
        "the static program ran: {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("is statically linked") && err.contains("CGO_ENABLED=1"),
        "{err}"
    );
}
