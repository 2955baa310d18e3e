#!/usr/bin/env python3
"""Ratios after/before within each pair of run.sh's output: fault us per
fault (lower is better), pmbench accesses/s (higher is better)."""
import json, statistics, sys, glob, os

out = sys.argv[1]
pairs = sorted(int(os.path.basename(p)[3:-5]) for p in glob.glob(f"{out}/old*.json"))

def variants(path, key):
    d = json.load(open(path))
    return {v["name"]: v[key] for v in d["variants"]}

rows = []
for bench, prefix, key in [("fault", "", "us_per_fault"), ("pmbench", "p", "throughput")]:
    names = None
    per = {}
    for i in pairs:
        old = variants(f"{out}/{prefix}old{i}.json", key)
        new = variants(f"{out}/{prefix}new{i}.json", key)
        for n in old:
            if n in new and old[n]:
                per.setdefault(n, []).append((old[n], new[n], new[n] / old[n]))
    for n, v in per.items():
        r = [x[2] for x in v]
        rows.append((bench, n, statistics.median(x[0] for x in v), statistics.median(x[1] for x in v),
                     statistics.median(r), min(r), max(r), len(r)))
print("| bench | variant | before (median) | after (median) | after/before, median of pairs | range | pairs |")
print("|---|---|---|---|---|---|---|")
for b, n, o, nw, m, lo, hi, k in rows:
    unit = "us" if b == "fault" else "accesses/s"
    fmt = (lambda x: f"{x:.2f} {unit}") if b == "fault" else (lambda x: f"{x:,.0f}")
    print(f"| {b} | {n} | {fmt(o)} | {fmt(nw)} | {m:.3f} | {lo:.3f}-{hi:.3f} | {k} |")
