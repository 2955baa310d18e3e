"""numpy over an array larger than its memory budget: a sequential fill, a
sequential sum and a random gather, each timed, with the array held the
way `uswap bench program` says (USWAP_BENCH_RUNNER):

- library-zram, library-file: on a uswap region (`uswap.array`), the
  budget and device from USWAP_BENCH_BUDGET and USWAP_BENCH_SWAP;
- memcg: `numpy.memmap` on a file of the same size in --dir, inside a
  memory cgroup of the budget (the page cache is what it reclaims);
- anything else (plain, kernel-zram, kernel-file): plain numpy memory,
  which kernel swap pages in the runners' memory cgroup.

It prints the sum and the gather's sum (the same under every runner, which
`bench program` checks) and appends each phase's seconds as a JSON line to
--times.  Run it through the command in docs/history/PERFORMANCE-LOG.md ("numpy on
uswap"):

    uswap bench program --budget 2G --swap-size 12G --rounds 1 \\
        --runner library-zram,kernel-zram,library-file,kernel-file,memcg \\
        -- target/python-venv/bin/python crates/uswap-python/bench/numpy_scan.py \\
           --size 8G --times numpy.jsonl
"""

import argparse
import json
import mmap
import os
import sys
import tempfile
import time

import numpy as np

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size(s: str) -> int:
    s = s.strip().upper().removesuffix("IB").removesuffix("B")
    unit = s[-1] if s and s[-1] in UNITS else ""
    try:
        return int(float(s[: len(s) - len(unit)]) * UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a size: write 8G, 512M or bytes") from None


def hold(n: int, runner: str, where: str, huge: bool):
    """The array, held as `runner` says, and what keeps it alive."""
    if runner.startswith("library-"):
        import uswap

        swap = uswap.Swap(
            int(os.environ["USWAP_BENCH_BUDGET"]),
            os.environ["USWAP_BENCH_SWAP"],
            os.environ.get("USWAP_BENCH_MODE", "sigbus"),
        )
        return uswap.array(n, np.float64, swap=swap, huge=huge), swap
    if runner == "memcg":
        f = tempfile.TemporaryFile(dir=where)
        return np.memmap(f, np.float64, mode="w+", shape=(n,)), f
    return np.zeros(n, np.float64), None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=size, default=size("8G"), help="the array's bytes (default 8G)")
    p.add_argument("--gather", type=int, default=1 << 20, help="random elements gathered (default 1M)")
    p.add_argument("--dir", default="/var/tmp", help="where numpy.memmap's file goes (memcg)")
    p.add_argument("--huge", action="store_true", help="library runners: a region of 2 MB units")
    p.add_argument("--times", help="append each phase's seconds here, as a JSON line")
    a = p.parse_args()
    runner = os.environ.get("USWAP_BENCH_RUNNER", "plain")
    n = a.size // 8
    chunk = 1 << 21  # 16 MiB of float64

    array, keep = hold(n, runner, a.dir, a.huge)
    t0 = time.monotonic()
    for at in range(0, n, chunk):
        array[at : at + chunk] = np.arange(at, min(at + chunk, n), dtype=np.float64)
    t1 = time.monotonic()
    total = float(array.sum())
    t2 = time.monotonic()
    idx = np.random.default_rng(1).integers(0, n, a.gather)
    if runner == "memcg":
        # numpy.memmap at its best for a gather: no readaround of 128 KiB
        # for every 8 bytes wanted (without it, 100 K elements of 1 GiB
        # under a 256 MiB group took 579 s, all of it reclaim).
        array._mmap.madvise(mmap.MADV_RANDOM)
    gathered = float(array[idx].sum())
    t3 = time.monotonic()

    print(f"sum {total!r} gather {gathered!r}")
    times = {
        "runner": runner,
        "bytes": n * 8,
        "fill_s": round(t1 - t0, 3),
        "sum_s": round(t2 - t1, 3),
        "gather_s": round(t3 - t2, 3),
        "gather_n": a.gather,
        "huge": a.huge,
    }
    if runner.startswith("library-"):
        st = keep.stats()
        times.update(evictions=st["evictions"], swapins=st["swapins"], peak_resident_bytes=st["peak_resident_bytes"])
    line = json.dumps(times)
    print(line, file=sys.stderr)
    if a.times:
        with open(a.times, "a") as f:
            f.write(line + "\n")
    del array
    return 0


if __name__ == "__main__":
    sys.exit(main())
