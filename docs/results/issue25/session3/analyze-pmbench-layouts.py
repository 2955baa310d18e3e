"""analyze-pmbench-layouts.py CSV BASE: pmbench accesses/s per layout build
(layouts-pmbench.sh's JSON), the median of each source's layouts, and
each source against BASE (higher is better)."""
import csv
import statistics
import sys

# The CSV: build,seed,round,backend,accesses_per_s, one row per backend of
# each run (the JSON itself is not kept: this is all it said).
path, base = sys.argv[1], sys.argv[2]
data = {}
for r in csv.DictReader(open(path)):
    data.setdefault(r["backend"], {}).setdefault((r["build"], int(r["seed"])), []).append(float(r["accesses_per_s"]))
for name, builds in data.items():
    med = {k: statistics.median(xs) for k, xs in builds.items()}
    b = [med[k] for k in med if k[0] == base]
    print(f"## pmbench {name} (accesses/s; runs per layout: {min(len(x) for x in builds.values())})")
    for side in sorted({k[0] for k in med}):
        vals = [med[k] for k in sorted(med) if k[0] == side]
        line = (f"  {side}: " + " ".join(f"{x:,.0f}" for x in vals)
                + f"   median {statistics.median(vals):,.0f}, layouts' max/min {max(vals) / min(vals):.3f}")
        if side != base:
            line += f"; /{base} {statistics.median(vals) / statistics.median(b):.3f}"
        print(line)
