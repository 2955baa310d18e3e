"""After/before ratios per pair from run.sh's JSON: analyze.py DIR"""
import collections, json, statistics as st, sys

d = sys.argv[1] if len(sys.argv) > 1 else "."
load = lambda p: json.load(open(p))
rat = collections.defaultdict(list)
val = collections.defaultdict(lambda: collections.defaultdict(list))
for i in range(1, 7):
    try:
        b, a = load(f"{d}/fault-before-{i}.json"), load(f"{d}/fault-after-{i}.json")
    except OSError:
        continue
    bm = {(x["name"], x["threads"]): x["us_per_fault"] for x in b["variants"]}
    for x in a["variants"]:
        k = (x["name"], x["threads"])
        if k in bm:
            rat[k].append(x["us_per_fault"] / bm[k])
            val[k]["before"].append(bm[k])
            val[k]["after"].append(x["us_per_fault"])
print("| bench | before | after | after/before, median of pairs | range | pairs |")
print("|---|---|---|---|---|---|")
for k in sorted(rat, key=lambda k: (k[1], k[0])):
    r = rat[k]
    print(f"| fault {k[0]}, {k[1]} thread | {st.median(val[k]['before']):.2f} us | {st.median(val[k]['after']):.2f} us "
          f"| {st.median(r):.3f} | {min(r):.3f}-{max(r):.3f} | {len(r)} |")
pr, pv = [], {"before": [], "after": []}
for i in range(1, 7):
    try:
        b, a = load(f"{d}/pm-before-{i}.json"), load(f"{d}/pm-after-{i}.json")
    except OSError:
        continue
    tb, ta = b["variants"][0]["throughput"], a["variants"][0]["throughput"]
    pr.append(ta / tb)
    pv["before"].append(tb)
    pv["after"].append(ta)
if pr:
    print(f"| pmbench uswap, accesses/s | {st.median(pv['before']):,.0f} | {st.median(pv['after']):,.0f} "
          f"| {st.median(pr):.3f} | {min(pr):.3f}-{max(pr):.3f} | {len(pr)} |")
