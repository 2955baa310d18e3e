# Read MIB MiB of 1 MiB bytearrays ROUNDS times in order, a byte a page (and
# two more), and print their sum (0: the point is the touches): a walk in order
# over memory past the budget.
import sys
mib=int(sys.argv[1]); rounds=int(sys.argv[2])
blocks=[bytearray((bytes(range(256))*16)*256) for _ in range(mib)]  # 1 MiB each
s=0
for r in range(rounds):
    for b in blocks:
        s += b[0] + b[4096*100] + sum(b[::4096])
print(s)
