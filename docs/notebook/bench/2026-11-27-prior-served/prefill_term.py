"""How much of the prior's TPOT dispersion its prefill term adds, by hardware class.

Usage: python3 prefill_term.py TIME_SCALE A100_SCALE OBSERVATIONS.jsonl...
       (a `headroom-bench run --out` directory's observations/; TIME_SCALE is the run's simulator speed,
       A100_SCALE the stack's `prior_hardware_scale` for class 1)

Recomputes the analytic prior's TPOT (predictor-svc/src/model/prior.rs, its constants copied here) from each
observation's state at dispatch with the prefill term weighted k (1: the prior as built; 0: the decode step
alone), and prints per class the spread of log(measured / predicted): its standard deviation, the median ratio
(what the live correction has to supply) and the gap between the 90th percentile and the median (how far a p90
prediction must sit above the median: the smaller, the tighter a p90 objective's tiers). The rows are the
requests as the router placed them, on predictions that used k = 1, so this does not say what another k would
do to the placements (docs/predictor.md, "The prefill term's share of the spread").
"""
import json
import math
import statistics
import sys

time_scale, a100 = float(sys.argv[1]), float(sys.argv[2])


def prior_tpot(o, k):
    s = o['state_at_dispatch']
    scale = (a100 if s['hardware_class'] == 1 else 1.0) / time_scale
    running = max(s['running'], s['in_flight'])
    step = scale * (0.8 + max(6.0, running * 0.024) + s['tokens_in_flight'] * 65e-6)
    decode = step + scale * o['request']['input_tokens'] * 65e-6
    share = min(max(k * scale * s['prefill_tokens_per_s'] * 0.024 / 1000, 0.0), 0.8)
    return decode / (1 - share)


rows = []
for f in sys.argv[3:]:
    rows += [json.loads(line) for line in open(f)]
rows = [o for o in rows if o.get('tpot_ms') and o['output_tokens'] > 1]
print('%d requests' % len(rows))
print('| prefill term weight | class | n | sd of log ratio | median measured / prior | p90 - p50 (log) |')
print('| ---: | ---: | ---: | ---: | ---: | ---: |')
for k in (1.0, 0.5, 0.0):
    for c in sorted({o['state_at_dispatch']['hardware_class'] for o in rows}):
        v = sorted(math.log(o['tpot_ms'] / prior_tpot(o, k)) for o in rows if o['state_at_dispatch']['hardware_class'] == c)
        print('| %.1f | %d | %d | %.2f | %.2f | %.2f |' % (k, c, len(v), statistics.pstdev(v), math.exp(v[len(v) // 2]),
                                                       v[int(0.9 * len(v))] - v[len(v) // 2]))
