"""Swap-in in bulk: load MIB MiB of 4 KiB records, then walk them in the
order ORDER gives, a letter a pass (f: first to last, b: last to first),
each pass reading a byte of every record and timing itself; then `free`
frees them all, timed (a walk from the last record down, as CPython's
list deallocation goes, and as its exit frees a program's data), and
`quick` leaves at once with os._exit, freeing nothing.  Prints a digest
on stdout, the times on stderr.

    python3 walk.py MIB ORDER [free|quick]
"""
import os
import sys
import time

mib, order = int(sys.argv[1]), sys.argv[2]
t0 = time.time()
records = [bytes([i % 251]) * 4096 for i in range(mib * 256)]
t1 = time.time()
s = 0
times = []
for p, o in enumerate(order):
    t = time.time()
    walk = records if o == "f" else reversed(records)
    s += sum(r[p] for r in walk)
    times.append(time.time() - t)
    del walk
print(len(records), s, flush=True)
print("load %.2f passes %s" % (t1 - t0, " ".join("%s %.2f" % (o, x) for o, x in zip(order, times))), file=sys.stderr, flush=True)
if sys.argv[3:] == ["quick"]:
    os._exit(0)
if sys.argv[3:] == ["free"]:
    t = time.time()
    del records
    print("free %.2f" % (time.time() - t), file=sys.stderr, flush=True)
