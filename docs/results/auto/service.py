"""A service with cold memory: it loads MIB MiB of records, then serves
REQUESTS requests, each reading 16 records of a tenth of them (its hot
set: the first tenth loaded, or the last with `last`), and prints a
digest of what it served.  The rest of what it loaded is never read
again: memory a budget that finds itself should give back.

    python3 service.py MIB REQUESTS [first|last]
"""
import hashlib
import random
import sys

mib, requests = int(sys.argv[1]), int(sys.argv[2])
RECORD = 4096
records = [random.Random(i).randbytes(64) * (RECORD // 64) for i in range(mib * 256)]
hot = len(records) // 10
base = len(records) - hot if sys.argv[3:] == ["last"] else 0
rng = random.Random(42)
digest = hashlib.sha256()
for _ in range(requests):
    for _ in range(16):
        r = records[base + rng.randrange(hot)]
        digest.update(r[rng.randrange(RECORD - 8):][:8])
print(len(records), digest.hexdigest())
