"""What a fault costs with many regions alive: a fault finds its region by
scanning the process's region table (regions.rs), so a region mapped
after N others is found after N entries.

An array 4x its budget on a compressed device, touched at random pages
(nearly every touch a fault), with 0, 250, 500 and 1,000 small regions
mapped before it, so that its entry is the last one scanned: the worst
case.  Rounds interleave the counts; the median per touch is printed.

    target/python-venv/bin/python crates/uswap-python/bench/many_regions.py
"""

import statistics
import sys
import time

import numpy as np

import uswap

COUNTS = (0, 250, 500, 1000)


def touch_cost(others: int, mode: str) -> float:
    with uswap.Swap(budget="64M", swap="zram:1G", mode=mode) as swap:
        before = [swap.map(4096) for _ in range(others)]
        a = uswap.array(256 << 20, np.uint8, swap=swap)
        a[::4096] = 1  # every page out once, most of them evicted
        pages = np.random.default_rng(3).permutation(a.size // 4096) * 4096
        t = time.perf_counter()
        total = int(a[pages].sum())
        took = time.perf_counter() - t
        assert total == pages.size
        st = swap.stats()
        del a
        for r in before:
            r.close()
        return took / pages.size * 1e9, st["faults"]


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "sigbus"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    ns = {n: [] for n in COUNTS}
    for _ in range(rounds):
        for n in COUNTS:
            ns[n].append(touch_cost(n, mode)[0])
    base = statistics.median(ns[0])
    print(f"mode {mode}, {rounds} rounds, median ns per random touch of a 256 MiB array under 64 MiB")
    for n in COUNTS:
        m = statistics.median(ns[n])
        print(f"{n:5d} regions before it: {m:8.0f} ns  ({m - base:+.0f} ns, {m / base:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
