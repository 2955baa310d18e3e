"""Memory larger than its budget, for Python and numpy.

uswap pages a region's memory out to swap (compressed RAM, a swap file, an
NBD export) and back in on access, in user space, under a hard budget of
resident memory: no root, no kernel setup, no cgroup.  A region is a
writable buffer, so numpy arrays and memoryviews use its pages directly::

    import numpy as np, uswap

    with uswap.Swap(budget="1G", swap="zram:4G") as swap:
        a = uswap.array((512, 1 << 20), np.float32, swap=swap)   # 2 GiB
        a[:] = 1.0
        print(a.sum(), swap.stats()["evictions"])

``Swap`` is one instance (a budget, its devices, its threads); ``Swap.map``
gives a ``Region``; ``array`` is a numpy array on a region of its own,
unmapped when the array is garbage.  Errors are ``uswap.Error`` and its
kinds (``SpecError``, ``DeviceError``, ``KernelError``, ``LimitError``,
``ForkedError``), each with a one-line message naming the cause and what
to do; bad arguments are ``ValueError`` and ``TypeError``.

Two things to know (docs/DESIGN.md, "The Python package"):

- SIGBUS mode (the default) serves faults in a SIGBUS handler on the
  faulting thread.  Python's ``faulthandler`` (which pytest and
  ``python -X faulthandler`` enable) is kept behind it and still sees every
  SIGBUS that is not uswap's: enable it before building a Swap; one enabled
  after is put back behind uswap's handler within milliseconds, with a
  line on stderr.
- In SIGBUS mode the kernel itself cannot fault a page in: a system call
  that writes into a region (``file.readinto``, ``socket.recv_into``)
  fails with ``EFAULT`` on a page that is out.  Pin the range for the
  call (``with region.pin(offset, n): f.readinto(view[offset:offset + n])``),
  a part of the budget at a time, or build the Swap with ``mode="handler"``.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any

from ._uswap import (
    MAX_REGIONS,
    PAGE_SIZE,
    DeviceError,
    Error,
    ForkedError,
    KernelError,
    LimitError,
    Pin,
    Region,
    SpecError,
    Swap,
)

__all__ = [
    "MAX_REGIONS",
    "PAGE_SIZE",
    "DeviceError",
    "Error",
    "ForkedError",
    "KernelError",
    "LimitError",
    "Pin",
    "Region",
    "SpecError",
    "Swap",
    "array",
    "default_swap",
]

_default: Swap | None = None
_default_lock = threading.Lock()


def default_swap() -> Swap:
    """The instance ``array`` uses when given none, built on first use.

    Its budget is ``$USWAP_BUDGET`` (default ``"1G"``), its device
    ``$USWAP_SWAP`` (default: a compressed store of four times the
    budget), its mode ``$USWAP_MODE`` (default ``"sigbus"``).
    """
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Swap(
                os.environ.get("USWAP_BUDGET", "1G"),
                os.environ.get("USWAP_SWAP") or None,
                os.environ.get("USWAP_MODE", "sigbus"),
            )
        return _default


def array(
    shape: int | tuple[int, ...],
    dtype: Any = float,
    *,
    swap: Swap | None = None,
    huge: bool = False,
    order: str = "C",
) -> Any:
    """A zero-filled numpy array on a region of its own.

    ``shape``, ``dtype`` and ``order`` are numpy's.  The region comes from
    ``swap`` (default: ``default_swap()``); with ``huge`` it is paged in
    2 MB units, which suits an array walked in order and never one read
    at random (each access brings 2 MB in).  It is unmapped when the array and every view of it are
    garbage; until then it counts as a view of its region.
    """
    import numpy as np

    dt = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, int) else tuple(int(n) for n in shape)
    if any(n < 0 for n in dims):
        raise ValueError(f"shape {dims}: dimensions cannot be negative")
    count = math.prod(dims)
    region = (swap if swap is not None else default_swap()).map(max(count * dt.itemsize, 1), huge=huge)
    flat = np.frombuffer(region, dtype=dt, count=count)
    return flat.reshape(dims, order=order)
