"""Python's exit, taken apart: load MIB MiB of 4 KiB bytes objects (in
mimalloc's 5 KiB blocks under `uswap run`), then run the collector (it
reads every object's header, twice) and free them (a third time), each
phase timed on stderr.  Under a budget below MIB, every page that went
out comes back to be read and freed.

    uswap run --mode sigbus --budget 512M -- python3 collect_free.py 2048
"""
import gc
import random
import sys
import time

mib = int(sys.argv[1])
t0 = time.time()
records = [random.Random(i).randbytes(64) * 64 for i in range(mib * 256)]
t1 = time.time()
gc.collect()
t2 = time.time()
del records
t3 = time.time()
print(f"load {t1 - t0:.2f} s, collect {t2 - t1:.2f} s, free {t3 - t2:.2f} s", file=sys.stderr)
