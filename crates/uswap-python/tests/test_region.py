"""Regions' lifetimes, errors and the process around them: views that
outlive a close, 1,000 regions, every error a caller can provoke, fork,
faulthandler."""

import errno
import gc
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import uswap


def test_close_with_a_live_view_raises_and_the_view_still_works(mode):
    with uswap.Swap(budget="8M", mode=mode) as swap:
        r = swap.map(32 << 20)
        a = np.frombuffer(r, np.uint32)
        a[:] = 5
        s = a[1000:2000]  # a view of the view
        del a
        with pytest.raises(BufferError, match="in use by 1 view"):
            r.close()
        with pytest.raises(BufferError):
            with r:
                pass
        assert not r.closed
        assert s.sum() == 5 * 1000
        del s
        r.close()
        assert r.closed
        r.close()  # twice does nothing
        with pytest.raises(ValueError, match="closed"):
            memoryview(r)
        with pytest.raises(ValueError, match="closed"):
            len(r)


def test_a_region_dropped_under_an_array_stays_mapped(mode):
    with uswap.Swap(budget="8M", mode=mode) as swap:
        r = swap.map(32 << 20)
        a = np.frombuffer(r, np.uint8)
        del r
        gc.collect()
        a[:] = 3  # the array holds the region: its pages are still there
        assert a.sum() == 3 * (32 << 20)
    # The handle is closed; the region (and so the instance) lives on.
    assert a[::4096].sum() == 3 * 8192
    del a
    gc.collect()


def test_a_thousand_regions_map_and_unmap_without_a_leak(mode):
    """UMap's users hit ENOMEM after about 900 regions; here 1,000 live at
    once, then go, twice, and the process holds what it held before:
    mappings, descriptors, resident memory and stored pages."""

    def maps():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    def fds():
        return len(os.listdir("/proc/self/fd"))

    gc.collect()
    with uswap.Swap(budget="16M", swap="zram:64M", mode=mode) as swap:
        # Warm up: the first region maps tables that stay.
        with swap.map(1 << 20):
            pass
        before = (maps(), fds())
        for turn in range(2):
            live = [swap.map((k % 7 + 1) * 4096) for k in range(1000)]
            for k, r in enumerate(live):
                v = memoryview(r)
                v[0] = (k + turn) % 256
                v[len(v) - 1] = 1
                v.release()
            for k, r in enumerate(live):
                assert memoryview(r)[0] == (k + turn) % 256
                r.close()
            del live
        gc.collect()
        after = (maps(), fds())
        assert after[0] <= before[0] and after[1] <= before[1], f"mappings or descriptors left behind: {before} -> {after}"
        st = swap.stats()
        assert st["resident_bytes"] == 0 and st["store_orig_bytes"] == 0, st
        # The table's bound (all instances of the process together) is
        # refused by name, and a region given back makes room.
        live = []
        with pytest.raises(uswap.LimitError, match="too many regions"):
            for _ in range(uswap.MAX_REGIONS + 1):
                live.append(swap.map(4096))
        assert uswap.MAX_REGIONS - 8 <= len(live) <= uswap.MAX_REGIONS
        live.pop().close()
        live.append(swap.map(4096))
        for r in live:
            r.close()
        assert maps() <= before[0]


def test_errors_are_typed_with_one_line(tmp_path):
    cases = [
        (dict(budget="1G", swap="zorg:1G"), uswap.SpecError, "swap spec"),
        (dict(budget="1G", swap=f"file:{tmp_path}/no/such/dir:1G"), uswap.DeviceError, "no/such/dir"),
        (dict(budget="ten"), ValueError, "not a size"),
        (dict(budget=100), ValueError, "less than a page"),
        (dict(budget=-5), ValueError, "negative"),
        (dict(budget="1G", mode="kernel"), ValueError, "sigbus"),
        (dict(budget="1G", swap=42), TypeError, "spec string"),
        (dict(budget=[1]), TypeError, "size"),
    ]
    for kwargs, kind, words in cases:
        with pytest.raises(kind, match=words) as e:
            uswap.Swap(**kwargs)
        assert "\n" not in str(e.value), kwargs
        if isinstance(e.value, uswap.Error):
            assert isinstance(e.value, Exception)
    with uswap.Swap(budget="4M") as swap:
        with pytest.raises(ValueError, match="0 bytes"):
            swap.map(0)
        with pytest.raises(ValueError, match="negative"):
            swap.map(-1)
        with pytest.raises(uswap.LimitError, match="more swap"):
            swap.map(1 << 30)
        with pytest.raises(ValueError, match="too small"):
            swap.budget = 4096
    with pytest.raises(ValueError, match="closed"):
        swap.map(4096)


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a child as nobody: needs root")
def test_handler_mode_without_the_privilege_is_a_kernel_error():
    """As an ordinary user with vm.unprivileged_userfaultfd=0 handler mode
    is refused by name; SIGBUS mode works."""
    with open("/proc/sys/vm/unprivileged_userfaultfd") as f:
        if f.read().strip() != "0":
            pytest.skip("vm.unprivileged_userfaultfd=1 here: ordinary users may use handler mode")
    code = textwrap.dedent(
        """
        import uswap
        with uswap.Swap("4M") as s:
            r = s.map(16 << 20); m = memoryview(r); m[::4096] = b"x" * 4096; assert m[-4096] == ord("x")
        try:
            uswap.Swap("4M", mode="handler")
        except uswap.KernelError as e:
            print("refused:", e)
        """
    )
    # Debian's interpreter (one under /root, as pyenv's, is not nobody's
    # to run), importing this very package: the wheel is abi3.
    python = "/usr/bin/python3"
    if subprocess.run([python, "-c", "import sys; sys.exit(sys.version_info < (3, 11))"]).returncode != 0:
        pytest.skip(f"{python} is not CPython 3.11 or newer")
    package_dir = os.path.dirname(os.path.dirname(uswap.__file__))
    out = subprocess.run(
        [python, "-c", code],
        user="nobody",
        env={"PYTHONPATH": package_dir, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused:") and "userfaultfd" in out.stdout, out.stdout


def test_a_forked_child_reads_its_parents_pages(mode):
    with uswap.Swap(budget="8M", swap="zram:256M", mode=mode) as swap:
        a = uswap.array(8 << 20, np.int32, swap=swap)  # 32 MiB: mostly out
        a[:] = np.arange(a.size, dtype=np.int32)
        assert swap.stats()["evictions"] > 0
        pid = os.fork()
        if pid == 0:
            ok = a.sum(dtype=np.int64) == np.arange(a.size, dtype=np.int64).sum()
            # The child's own region, under the instance it adopted.
            b = uswap.array(4 << 20, np.int32, swap=swap)
            b[:] = 2
            ok = ok and b.sum() == 8 << 20
            a[:] = -1  # the child's copy, not the parent's
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert a[-1] == a.size - 1 and a[::4096].min() >= 0


def run_python(code, mode):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), mode], capture_output=True, text=True, timeout=120
    )


def test_faulthandler_stays_behind_uswaps_handler(mode):
    """pytest (this run) enables faulthandler before any Swap: uswap's
    handler goes in front and passes on every SIGBUS that is not a fault
    of its own, which faulthandler then reports as it would without uswap."""
    out = run_python(
        """
        import faulthandler, os, signal, sys
        import numpy as np, uswap
        faulthandler.enable()
        s = uswap.Swap("8M", mode=sys.argv[1])
        a = uswap.array(8 << 20, np.int32, swap=s)
        a[:] = 1
        assert a.sum() == 8 << 20 and s.stats()["evictions"] > 0
        print("served", flush=True)
        os.kill(os.getpid(), signal.SIGBUS)
        print("not reached", flush=True)
        """,
        mode,
    )
    assert out.stdout == "served\n", (out.stdout, out.stderr)
    assert "Fatal Python error: Bus error" in out.stderr, out.stderr
    assert out.returncode == -signal.SIGBUS


def test_faulthandler_enabled_after_is_put_behind(mode):
    out = run_python(
        """
        import faulthandler, sys, time
        import numpy as np, uswap
        s = uswap.Swap("8M", mode=sys.argv[1])
        a = uswap.array(8 << 20, np.int32, swap=s)
        faulthandler.enable()
        time.sleep(0.2)  # the watchdog looks every few milliseconds
        a[:] = 1
        assert a.sum() == 8 << 20 and s.stats()["evictions"] > 0
        print("served", flush=True)
        """,
        mode,
    )
    assert out.returncode == 0 and out.stdout == "served\n", (out.stdout, out.stderr)
    if mode == "sigbus":
        assert "installed after uswap's" in out.stderr, out.stderr


def test_readinto_needs_a_pin_in_sigbus_mode(mode, tmp_path):
    """The kernel stores into a region for `readinto`: in SIGBUS mode a
    page that is out fails the call with EFAULT, and a pin brings the
    pages in for it; handler mode serves the kernel's fault itself."""
    data = np.random.default_rng(5).integers(0, 256, 64 << 20, dtype=np.uint8)
    path = tmp_path / "data"
    data.tofile(path)
    with uswap.Swap(budget="16M", swap="zram:256M", mode=mode) as swap:
        r = swap.map(64 << 20)
        view = memoryview(r)
        with open(path, "rb", buffering=0) as f:
            if mode == "sigbus":
                with pytest.raises(OSError) as e:
                    f.readinto(view[: 1 << 20])
                assert e.value.errno == errno.EFAULT
                f.seek(0)
            step = 8 << 20
            for at in range(0, 64 << 20, step):
                with r.pin(at, step) as pin:
                    assert f.readinto(view[at : at + step]) == step
                assert pin.released
        # Read back after the budget pushed most of it out.
        assert swap.stats()["evictions"] > 0
        assert np.array_equal(np.frombuffer(view, np.uint8), data)
        with pytest.raises(BufferError, match="pin"):
            p = r.pin(0, 4096)
            view.release()
            r.close()
        p.release()
        p.release()  # twice does nothing
        r.close()
