"""analyze-layouts.py CSV BASE: per fault variant, each layout build's
median us/fault over the rounds (a build: one source, its .text sections
shuffled by one seed, see relink.sh); per source, the median of its
layouts and their spread; each source against BASE: the ratio of the
medians, and in how many (layout, BASE layout) pairs it is faster."""
import csv
import statistics
import sys

# The CSV: build,seed,round,variant,us_per_fault, one row per variant of
# each `uswap bench fault --json-out` run that layouts.sh made (the
# tables and JSON themselves are not kept: these are all they said).
path, base = sys.argv[1], sys.argv[2]
data = {}
for r in csv.DictReader(open(path)):
    data.setdefault(r["variant"], {}).setdefault((r["build"], int(r["seed"])), []).append(float(r["us_per_fault"]))
for name, builds in data.items():
    med = {k: statistics.median(xs) for k, xs in builds.items()}
    sides = sorted({k[0] for k in med})
    print(f"## {name} (us per fault; rounds per layout: {min(len(x) for x in builds.values())})")
    b = [med[k] for k in med if k[0] == base]
    for side in sides:
        vals = [med[k] for k in sorted(med) if k[0] == side]
        line = (f"  {side}: " + " ".join(f"{x:.3f}" for x in vals)
                + f"   median {statistics.median(vals):.3f}, layouts' max/min {max(vals) / min(vals):.3f}")
        if side != base:
            faster = sum(x < y for x in vals for y in b)
            line += (f"; /{base} {statistics.median(vals) / statistics.median(b):.3f},"
                     f" faster in {faster}/{len(vals) * len(b)} layout pairs")
        print(line)
