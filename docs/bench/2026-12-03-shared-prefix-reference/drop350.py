"""Copy a results.json without its 350 req/s measurements (a lead rung, not merged)."""
import json, sys
src, dst = sys.argv[1], sys.argv[2]
r = json.load(open(src))
for w in r['workloads']:
    for run in w['runs']:
        run['points'] = [p for p in run['points'] if p[0] != 350.0]
        run['repeats'] = [p for p in run['repeats'] if p[0] != 350.0]
json.dump(r, open(dst, 'w'), indent=2)
