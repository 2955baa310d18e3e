import json,glob,statistics,sys,os,re
d=sys.argv[1]
def us(path):
    j=json.load(open(path)); return {v["name"]:v["us_per_fault"] for v in j["variants"]}
rounds=sorted({int(re.search(r'-(\d+)\.json$',p).group(1)) for p in glob.glob(d+'/old-[0-9]*.json')})
data={b:{i:us(f'{d}/{b}-{i}.json') for i in rounds} for b in ['old','new','old-cgu1','new-cgu1']}
names=list(data['old'][rounds[0]].keys())
print('| variant | old default | new default | new/old default | new/old cgu1 | cgu1/default (new) | cgu1/default (old) |')
print('|---|---|---|---|---|---|---|')
for n in names:
    def r(a,b): 
        xs=[data[a][i][n]/data[b][i][n] for i in rounds]
        return f"{statistics.median(xs):.3f} ({sum(x>1 for x in xs)}/{len(xs)} >1)"
    print(f"| {n} | {statistics.median(data['old'][i][n] for i in rounds):.2f} | {statistics.median(data['new'][i][n] for i in rounds):.2f} | {r('new','old')} | {r('new-cgu1','old-cgu1')} | {r('new-cgu1','new')} | {r('old-cgu1','old')} |")
