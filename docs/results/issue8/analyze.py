import json, glob, statistics as st, collections
def load(p): return json.load(open(p))
# fault: per (variant, threads) us_per_fault; ratio after/before per pair
rat = collections.defaultdict(list); val = collections.defaultdict(lambda: collections.defaultdict(list))
for i in range(1,5):
    try: b = load(f'/tmp/pair/fault-before-{i}.json'); a = load(f'/tmp/pair/fault-after-{i}.json')
    except Exception as e: continue
    bm = {(x['name'],x['threads']): x['us_per_fault'] for x in b['variants']}
    for x in a['variants']:
        k=(x['name'],x['threads'])
        if k in bm:
            rat[k].append(x['us_per_fault']/bm[k]); val[k]['before'].append(bm[k]); val[k]['after'].append(x['us_per_fault'])
print("bench fault: us per fault, median of pairs; after/before ratio per pair")
for k in sorted(rat, key=lambda k:(k[1],k[0])):
    r=rat[k]
    print(f"{k[0]:15s} t{k[1]}  before {st.median(val[k]['before']):7.2f}  after {st.median(val[k]['after']):7.2f}  ratio median {st.median(r):.3f}  range {min(r):.3f}-{max(r):.3f}  n={len(r)}")
pr=[]; pv={'before':[], 'after':[]}
for i in range(1,5):
    try: b = load(f'/tmp/pair/pm-before-{i}.json'); a = load(f'/tmp/pair/pm-after-{i}.json')
    except Exception: continue
    tb=b['variants'][0]['throughput']; ta=a['variants'][0]['throughput']
    pr.append(ta/tb); pv['before'].append(tb); pv['after'].append(ta)
if pr:
    print(f"pmbench uswap accesses/s: before {st.median(pv['before']):.0f}  after {st.median(pv['after']):.0f}  ratio median {st.median(pr):.3f} range {min(pr):.3f}-{max(pr):.3f} n={len(pr)}")
    print("pairs:", [f"{b:.0f}/{a:.0f}" for b,a in zip(pv['before'],pv['after'])])
