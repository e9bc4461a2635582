"""Where in a step the served p90 TPOT covered what requests measured, and where the interactive class missed.

Usage: python3 by_tenth.py OUT...   (`headroom-bench run --out` directories)

For each run's request log (requests/*.jsonl), splits the measured step into tenths by arrival and prints per
tenth: the share of answered requests whose measured TPOT was at or under the TPOT served at dispatch (what a
p90 objective aims to hold at 0.9), the interactive requests that missed their SLOs (`by_class.met`, as in the
per-class tables) out of those that arrived, the requests shed (429), and the share of all requests that met their
SLOs (flat over the tenths: the step measured a load; falling: the fleet was filling up). A step without a lead-in
starts on an empty fleet and a fresh predictor, so its first tenths show how fast the served predictions reach the
load's level.

Where the run also wrote observations (observations/ beside requests/, same file names), the TPOT coverage is
also split by the hardware class of the endpoint that served each request (`state_at_dispatch.hardware_class`),
with how many answered in each tenth, and the interactive requests each class served over the step, with how many
of them missed.
"""
import collections
import glob
import json
import os
import sys

# Whether a request met its SLOs: the one definition the per-class tables use (`Outcome::met_slo`).
sys.dont_write_bytecode = True  # no __pycache__ left in docs/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '2026-11-27-flow-neighbours'))
from by_class import met  # noqa: E402


def hardware_classes(observations):
    """Endpoint -> hardware class, from a run's observations file (empty when there is none)."""
    classes = {}
    if os.path.exists(observations):
        for line in open(observations):
            o = json.loads(line)
            state = o.get('state_at_dispatch') or {}
            if 'hardware_class' in state:
                classes[o['endpoint']] = state['hardware_class']
    return classes


def main():
    for out in sys.argv[1:]:
        for f in sorted(glob.glob(out + '/requests/*.jsonl')):
            rows = [json.loads(line) for line in open(f)]
            classes = hardware_classes(os.path.join(out, 'observations', os.path.basename(f)))
            end = max(r['at_s'] for r in rows) + 1e-9
            n, covered, missed, arrived, shed, sent, met_all = (collections.Counter() for _ in range(7))
            # Per (hardware class, tenth): answered, covered.
            by_class = collections.defaultdict(lambda: [0, 0])
            # Per hardware class: interactive requests served there, and how many of them missed.
            interactive_on = collections.defaultdict(lambda: [0, 0])
            for r in rows:
                k = int(10 * r['at_s'] / end)
                shed[k] += r['status'] == 429
                ok = met(r)
                sent[k] += 1
                met_all[k] += ok
                if r['class'] == 'interactive':
                    arrived[k] += 1
                    missed[k] += not ok
                    if classes and r['status'] == 200:
                        cell = interactive_on[classes.get(r['served_by'], '?')]
                        cell[0] += 1
                        cell[1] += not ok
                if r['status'] == 200 and r['tpot_ms'] and r['predicted_tpot_ms']:
                    n[k] += 1
                    covered[k] += r['tpot_ms'] <= r['predicted_tpot_ms']
                    if classes:
                        cell = by_class[(classes.get(r['served_by'], '?'), k)]
                        cell[0] += 1
                        cell[1] += r['tpot_ms'] <= r['predicted_tpot_ms']
            interactive = sum(arrived.values())
            print('%s: interactive met %.1f%%, shed %d' % (f, 100 - 100 * sum(missed.values()) / interactive, sum(shed.values())))
            print('  TPOT covered   ' + ' '.join('%5.2f' % (covered[k] / max(n[k], 1)) for k in range(10)))
            print('  interactive missed ' + ' '.join('%d/%d' % (missed[k], arrived[k]) for k in range(10)))
            print('  shed           ' + ' '.join('%5d' % shed[k] for k in range(10)))
            print('  all met        ' + ' '.join('%5.2f' % (met_all[k] / max(sent[k], 1)) for k in range(10)))
            for cls in sorted({c for c, _ in by_class}, key=str):
                cells = [by_class[(cls, k)] for k in range(10)]
                print('  TPOT covered, class %-3s' % cls + ' '.join('%5.2f/%-4d' % (c / max(a, 1), a) for a, c in cells))
            for cls, (served, miss) in sorted(interactive_on.items(), key=lambda kv: str(kv[0])):
                print('  interactive served on class %s: %d, missed %d' % (cls, served, miss))


if __name__ == '__main__':
    main()
