# Build SIZE_MIB of pages in 64 KiB blocks (each 1 KiB of random bytes
# repeated: lz4 stores about a quarter), then touch random pages, reading
# one byte and writing another, and print a checksum.
import os, random, sys
size_mib = int(sys.argv[1]); touches = int(sys.argv[2])
BLOCK = 64 << 10
rng = random.Random(7)
blocks = [bytearray(rng.randbytes(1024) * (BLOCK // 1024)) for _ in range(size_mib * 16)]

pages = len(blocks) * (BLOCK // 4096)
s = 0
for _ in range(touches):
    p = rng.randrange(pages)
    b = blocks[p >> 4]; off = (p & 15) * 4096 + rng.randrange(4096)
    s = (s * 31 + b[off]) & 0xFFFFFFFF
    b[off] = (b[off] + 1) & 0xFF
print(pages, touches, s)
