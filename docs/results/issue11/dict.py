import hashlib, sys
n = int(sys.argv[1])
d = {}
for i in range(n):
    d[i] = ("x%dy" % i) * 8
h = hashlib.sha256()
for i in range(n):
    h.update(d[i].encode())
print(h.hexdigest(), len(d))
