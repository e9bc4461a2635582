"""Copy a results.json without its measurements at the given rates (lead rungs, not merged)."""
import json, sys
src, dst, drop = sys.argv[1], sys.argv[2], {float(x) for x in sys.argv[3:]}
r = json.load(open(src))
for w in r['workloads']:
    for run in w['runs']:
        run['points'] = [p for p in run['points'] if p[0] not in drop]
        run['repeats'] = [p for p in run['repeats'] if p[0] not in drop]
json.dump(r, open(dst, 'w'), indent=2)
