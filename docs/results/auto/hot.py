"""A program with no cold memory: it holds MIB MiB and reads all of it, a
byte a page, every pass, PASSES times; prints a digest.  A budget that
finds itself should stop lowering above what it holds.

    python3 hot.py MIB PASSES
"""
import hashlib
import sys

mib, passes = int(sys.argv[1]), int(sys.argv[2])
blocks = [bytes([i % 251]) * 1024 + hashlib.sha256(b"%d" % i).digest() * 96 for i in range(mib * 256)]
digest = hashlib.sha256()
for p in range(passes):
    s = 0
    for b in blocks:
        s += b[p % 4096]
    digest.update(b"%d" % s)
print(len(blocks), digest.hexdigest())
