"""How each class fared per run and rate, and how every 429 left flow control.

Usage: python3 refusals.py OUT [OUT...]   (each OUT a `headroom-bench run --out` directory with requests/*.jsonl)

Per request file: per class the requests, the share that met its SLOs (as `by_class.py` in
../2026-11-27-flow-neighbours/ counts it), and the 429s by the filter's `x-headroom-flow` (the per-request log's
`flow`): `saturated` (refused at admission), `expired` (its deadline passed while it waited), `released` /
`immediate` (the filter's tiers shed it after flow control answered).
"""
import collections
import glob
import json
import os
import sys

# One definition of a met SLO (Outcome::met_slo, loadgen/src/runner.rs): by_class.py's.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '2026-11-27-flow-neighbours'))
from by_class import met  # noqa: E402

def main():
    print('| run | file | class | requests | met | 429 by flow outcome |')
    print('| --- | --- | --- | ---: | ---: | --- |')
    for d in sys.argv[1:]:
        for f in sorted(glob.glob(os.path.join(d, 'requests', '*.jsonl'))):
            rows = [json.loads(line) for line in open(f)]
            for cls in ['interactive', 'batch', 'sheddable']:
                c = [r for r in rows if r['class'] == cls]
                if not c:
                    continue
                refused = collections.Counter(r['flow'] or '-' for r in c if r['status'] == 429)
                why = ', '.join(f'{k} {v}' for k, v in sorted(refused.items())) or '-'
                ok = 100.0 * sum(map(met, c)) / len(c)
                print(f'| {d} | {os.path.basename(f)} | {cls} | {len(c)} | {ok:.1f}% | {why} |')

if __name__ == '__main__':
    main()
