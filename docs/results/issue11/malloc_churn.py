import sys, hashlib
n = int(sys.argv[1])
rounds = 3
h = hashlib.sha256()
for r in range(rounds):
    d = {}
    for i in range(n):
        d[i] = [i, str(i), (i, r)]
    for i in range(0, n, 7):
        h.update(d[i][1].encode())
    del d
print(h.hexdigest())
