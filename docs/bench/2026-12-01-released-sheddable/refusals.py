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

def met(o):
    if o['status'] != 200:
        return False
    if o['stream']:
        ok = True
        if o['slo_ttft_ms'] is not None:
            ok = o['ttft_ms'] is not None and o['ttft_ms'] <= o['slo_ttft_ms']
        if o['slo_tpot_ms'] is not None and o['tpot_ms'] is not None:
            ok = ok and o['tpot_ms'] <= o['slo_tpot_ms']
        return ok
    return o['e2e_ms'] <= (o['slo_ttft_ms'] or 0) + (o['slo_tpot_ms'] or 0) * o['max_tokens']

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
