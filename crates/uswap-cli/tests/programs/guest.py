# Python doing what Python programs do, in a heap several times the budget:
# subprocess (vfork and exec) with large argument lists from the heap,
# os.preadv and os.pwritev, a pipe read with poll while a thread that
# blocks every signal writes it, faulthandler on; prints one digest.
import faulthandler, hashlib, os, select, signal, subprocess, sys, tempfile, threading
n = int(sys.argv[1])
faulthandler.enable()
# A heap several times the budget.
data = [("%08d" % i) * 16 for i in range(n)]
h = hashlib.sha256()
# subprocess (vfork + exec) with large arguments built in the heap.
for k in range(8):
    args = ["/bin/sh", "-c", 'echo "$#"', "sh"] + [data[(k * 997 + j) % n] for j in range(4000)]
    out = subprocess.run(args, capture_output=True, check=True).stdout
    h.update(out)
# os.preadv / os.pwritev into heap buffers.
fd, path = tempfile.mkstemp()
os.pwritev(fd, [b"a" * 5000, b"b" * 7000], 0)
bufs = [bytearray(3000), bytearray(9000)]
got = os.preadv(fd, bufs, 0)
h.update(bytes(bufs[0]) + bytes(bufs[1]) + str(got).encode())
os.close(fd)
os.unlink(path)
# A pipe, select and poll with a thread writing, every signal blocked in it.
r, w = os.pipe()
def writer():
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    for i in range(200):
        os.write(w, data[i].encode())
    os.close(w)
t = threading.Thread(target=writer)
t.start()
p = select.poll()
p.register(r, select.POLLIN)
chunks = []
while True:
    p.poll(1000)
    b = os.read(r, 65536)
    if not b:
        break
    chunks.append(b)
t.join()
h.update(b"".join(chunks))
# The rest of the heap read back.
for s in data:
    h.update(s.encode())
print(h.hexdigest())
