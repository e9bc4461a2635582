"""How the served TPOT compared with the measured one over each step, by hardware class.

Usage: python3 served_by_class.py OBSERVATIONS.jsonl...   (a `headroom-bench run --out` directory's observations/)

Each step's requests (served by a prediction, streamed, more than one token) in dispatch order, split into six
equal parts; per part and hardware class (the predictor's class ids: 1 = a100, 2 = h100 in the benchmark's fleet):
the median of measured over served TPOT, then the share of requests that took no longer than served (coverage; a
p90 objective holds it at 90%, so its median ratio sits well under 1). docs/predictor.md, "Trained models past the
cliff".
"""
import glob
import json
import statistics
import sys

for pattern in sys.argv[1:]:
    for f in sorted(glob.glob(pattern)):
        rows = [json.loads(l) for l in open(f)]
        print(f.split('/')[-1], len(rows))
        for cls in (1, 2):
            v = [o for o in rows if o.get('tpot_ms') and o.get('predicted_tpot_ms') and o['request']['max_tokens'] > 1
                 and o['state_at_dispatch']['hardware_class'] == cls]
            parts = []
            for i in range(6):
                part = v[i * len(v) // 6:(i + 1) * len(v) // 6]
                if not part:
                    continue
                covered = sum(o['tpot_ms'] <= o['predicted_tpot_ms'] for o in part) / len(part)
                ratio = statistics.median(o['tpot_ms'] / o['predicted_tpot_ms'] for o in part)
                parts.append('%.2f/%.0f%%' % (ratio, 100 * covered))
            print('   class', cls, ' '.join(parts))
