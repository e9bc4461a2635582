"""Per tenth of each measured step and per hardware class: how often the served TPOT covered what requests took.

Usage: python3 by_tenth_class.py OUT...   (`headroom-bench run --out` directories, with requests/ and observations/)

For each request log (requests/*.jsonl) with its observations (observations/ of the same name, which give each
endpoint's hardware class in `state_at_dispatch`), splits the step into tenths by arrival and prints, per class,
the share of answered requests whose measured TPOT was at or under the TPOT served at dispatch (what a p90
objective aims to hold at 0.9), and how many answered. `by_tenth.py` (docs/bench/2026-11-27-prior-time-scale)
gives the same over all classes, with the interactive misses and sheds.
"""
import collections
import glob
import json
import os
import sys


def main():
    for d in sys.argv[1:]:
        for f in sorted(glob.glob(d + '/requests/*.jsonl')):
            name = os.path.basename(f)
            classes = {}
            observations = os.path.join(d, 'observations', name)
            if os.path.exists(observations):
                for line in open(observations):
                    o = json.loads(line)
                    state = o.get('state_at_dispatch') or {}
                    if 'hardware_class' in state:
                        classes[o['endpoint']] = state['hardware_class']
            requests = [json.loads(line) for line in open(f)]
            span = max(r['at_s'] for r in requests) or 1.0
            covered = collections.defaultdict(lambda: [0, 0])
            for r in requests:
                if r['status'] != 200 or r['tpot_ms'] is None or r['predicted_tpot_ms'] is None:
                    continue
                tenth = min(9, int(10 * r['at_s'] / span))
                c = covered[(classes.get(r['served_by'], '?'), tenth)]
                c[0] += r['tpot_ms'] <= r['predicted_tpot_ms']
                c[1] += 1
            print(f)
            for cls in sorted({k[0] for k in covered}, key=str):
                cells = (covered[(cls, t)] for t in range(10))
                print('  class %-3s' % cls, ' '.join('%5.2f/%-4d' % (c / max(1, n), n) for c, n in cells))


if __name__ == '__main__':
    main()
