"""numpy arrays four times their budget, paged by uswap, checked against
the same computation on plain memory; in both fault modes."""

import os
import threading
import time

import numpy as np
import pytest

import uswap
from conftest import BUDGET


# Freed slots wait in per-CPU slot caches (seed 000: two caches of 64 per
# CPU) before they go back to their clusters, and count as used meanwhile,
# as in the kernel.
SLOT_CACHES = 2 * 64 * os.cpu_count() * uswap.PAGE_SIZE


def within_budget(stats):
    # The budget is a promise with a margin: 10% over it by default
    # (docs/DESIGN.md, "overrun"), while reclaim catches up.
    return stats["peak_resident_bytes"] <= stats["budget_bytes"] * 1.1 + (2 << 20)


def test_array_four_times_the_budget_sums_as_plain_memory(mode):
    with uswap.Swap(budget=BUDGET, swap="zram:8G", mode=mode) as swap:
        budget = swap.budget
        n = 4 * budget // 8
        a = uswap.array(n, np.int64, swap=swap)
        assert a.nbytes == 4 * budget and not a.any()
        # Filled in slices, as a program fills a buffer it reads in.
        step = 1 << 22
        for at in range(0, n, step):
            a[at : at + step] = np.arange(at, min(at + step, n), dtype=np.int64) * 7 + 3
        plain = np.arange(n, dtype=np.int64) * 7 + 3
        # A sequential pass, a strided one, and a random gather, each
        # computed on both.
        assert a.sum() == plain.sum()
        assert a[::4097].sum() == plain[::4097].sum()
        idx = np.random.default_rng(1).integers(0, n, 1 << 16)
        assert np.array_equal(a[idx], plain[idx])
        # Every element, compared in slices (no second full-size array).
        for at in range(0, n, step):
            assert np.array_equal(a[at : at + step], plain[at : at + step]), f"elements {at}.. differ"
        st = swap.stats()
        assert st["evictions"] * uswap.PAGE_SIZE >= 3 * budget, st
        assert st["swapins"] + st["readahead"] > 0, st
        assert within_budget(st), st
        # The compressed store holds what went out, in less memory.
        assert 0 < st["store_compr_bytes"] < st["store_orig_bytes"], st
        del a
        st = swap.stats()
        assert st["resident_bytes"] == 0 and st["store_orig_bytes"] == 0, f"pages left after the array went: {st}"
        assert st["swap_used_bytes"] <= SLOT_CACHES, f"slots left after the array went: {st}"


def test_floats_and_two_dimensions(mode):
    with uswap.Swap(budget="32M", mode=mode) as swap:
        a = uswap.array((1024, 16384), np.float32, swap=swap)
        assert a.shape == (1024, 16384) and a.dtype == np.float32
        rng = np.random.default_rng(7)
        plain = rng.standard_normal((1024, 16384), dtype=np.float32)
        a[:] = plain
        assert np.array_equal(a.sum(axis=0), plain.sum(axis=0))
        assert np.array_equal(a.T @ np.ones(1024, np.float32), plain.T @ np.ones(1024, np.float32))
        f = uswap.array((64, 64), np.float64, swap=swap, order="F")
        assert f.flags.f_contiguous


def test_threads_fill_and_sum_their_own_arrays(mode):
    """Eight threads, each an array of its own over one budget; numpy lets
    the interpreter go in its loops, so faults meet on both CPUs."""
    with uswap.Swap(budget="64M", mode=mode) as swap:
        n = (32 << 20) // 8
        errors = []

        def work(k):
            try:
                a = uswap.array(n, np.int64, swap=swap)
                a[:] = k
                a[::513] += np.arange(a[::513].size)
                expect = k * n + np.arange(a[::513].size).sum()
                for _ in range(2):
                    if a.sum() != expect:
                        errors.append(f"thread {k}: {a.sum()} != {expect}")
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(f"thread {k}: {e!r}")

        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        st = swap.stats()
        assert st["evictions"] > 0 and within_budget(st), st


def test_frombuffer_and_memoryview_share_the_pages(mode):
    with uswap.Swap(budget="16M", mode=mode) as swap:
        r = swap.map(64 << 20)
        m = memoryview(r)
        assert m.nbytes == 64 << 20 and not m.readonly and m.format == "B"
        a = np.frombuffer(r, np.uint8)
        a[::4096] = np.arange(a[::4096].size) % 251
        # Pages written through numpy read back through the memoryview
        # after they were evicted.
        assert swap.stats()["evictions"] > 0
        assert bytes(m[4096 * 10 : 4096 * 10 + 1]) == bytes([10])
        assert m[4096 * 12345] == 12345 % 251
        m.release()
        del a
        r.close()


def test_budget_lowered_and_discard(mode):
    with uswap.Swap(budget="64M", mode=mode) as swap:
        a = uswap.array(48 << 20, np.uint8, swap=swap)
        a[:] = 1
        swap.budget = "16M"
        assert swap.budget == 16 << 20
        # The background reclaimer gets there.
        deadline = time.monotonic() + 10
        while swap.stats()["resident_bytes"] > (16 << 20) * 1.1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert swap.stats()["resident_bytes"] <= (16 << 20) * 1.1, swap.stats()
        assert a.sum() == 48 << 20
        r = swap.map(8 << 20)
        v = np.frombuffer(r, np.uint8)
        v[:] = 9
        r.discard(4096, 8192)
        assert v[:4096].sum() == 9 * 4096 and not v[4096 : 3 * 4096].any() and v[3 * 4096] == 9
        with pytest.raises(ValueError, match="not whole pages"):
            r.discard(1, 4096)
        with pytest.raises(ValueError, match="not a size"):
            swap.budget = "lots"


def test_huge_regions(mode):
    with uswap.Swap(budget="32M", mode=mode) as swap:
        a = uswap.array((96 << 20) // 8, np.uint64, swap=swap, huge=True)
        a[:] = np.arange(a.size, dtype=np.uint64)
        assert a[::1000].sum() == np.arange(a.size, dtype=np.uint64)[::1000].sum()
        assert swap.stats()["evictions"] > 0
