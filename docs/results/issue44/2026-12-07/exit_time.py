# Build SIZE_MIB of 64 KiB blocks of random bytes (as touch.py does), free
# them, and print to stderr how long each took and the wall clock time
# of the script's last line, to set against the time its command returns:
#   uswap run --mode sigbus --budget 512M --swap file:/var/tmp/fp:4G -- \
#       python3 exit_time.py 1536; date +%s.%N
import random, sys, time
size_mib = int(sys.argv[1])
BLOCK = 64 << 10
rng = random.Random(7)
t0 = time.time()
blocks = [bytearray(rng.randbytes(1024) * (BLOCK // 1024)) for _ in range(size_mib * 16)]
t1 = time.time()
del blocks
t2 = time.time()
sys.stderr.write("build %.2f s, free %.2f s, last line at %.3f\n" % (t1 - t0, t2 - t1, time.time()))
