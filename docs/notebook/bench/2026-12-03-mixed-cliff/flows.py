"""How the interactive and batch classes left flow control, and why the misses missed.

Usage: python3 flows.py OUT [OUT...]   (each OUT a `headroom-bench run --out` directory with requests/*.jsonl)

Per run, seed and class: the requests by flow control's outcome (the per-request log's `flow`: `unmeetable`
placed at once on arrival, `released` from the queue, `expired` there), each with the share that met its SLOs
(`met` of by_class.py in ../2026-11-27-flow-neighbours/, one definition), then the misses by what they missed
(TTFT, TPOT or both, against the class's SLOs), how long the released ones waited in the queue (mean, ms on the
gateway's clock) and the class's median TTFT, and the interactive class's attainment in each 3 s of the step (a
fleet that collapses within the step falls there). `by_flow.py` in ../2026-11-29-futile/ counts class and outcome
summed over a run's seeds; the arms here differ seed by seed, so this keeps each request file apart.
"""
import collections
import os
import statistics
import sys

sys.dont_write_bytecode = True  # no __pycache__ left in docs/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '2026-11-27-flow-neighbours'))
from by_class import met, request_files  # noqa: E402


def missed(r):
    """What a request that missed its SLOs missed: 'failed' (not a 200), 'e2e' (a non-streaming one, judged on
    its whole response), else 'ttft', 'tpot' or 'ttft+tpot'."""
    if r['status'] != 200:
        return 'failed'
    if not r['stream']:
        return 'e2e'
    ttft = r['ttft_ms'] is None or (r['slo_ttft_ms'] is not None and r['ttft_ms'] > r['slo_ttft_ms'])
    tpot = r['tpot_ms'] is not None and r['slo_tpot_ms'] is not None and r['tpot_ms'] > r['slo_tpot_ms']
    return '+'.join(k for k, v in [('ttft', ttft), ('tpot', tpot)] if v)


def main():
    print('| run | rate | seed | class | requests | met | by outcome: n (met) | misses by cause | released: waited, mean | TTFT, median | interactive met per 3 s |')
    print('| --- | ---: | ---: | --- | ---: | ---: | --- | --- | ---: | ---: | --- |')
    for f in request_files(sys.argv[1:]):
        windows = collections.defaultdict(lambda: [0, 0])
        for r in f.rows:
            if r['class'] == 'interactive':
                w = windows[int(r['at_s'] // 3)]
                w[0] += 1
                w[1] += met(r)
        per_3s = ' '.join(f'{100 * k / n:.0f}%' for _, (n, k) in sorted(windows.items()))
        for cls in ['interactive', 'batch']:
            c = [r for r in f.rows if r['class'] == cls]
            n = collections.Counter(r['flow'] or '-' for r in c)
            k = collections.Counter(r['flow'] or '-' for r in c if met(r))
            outcomes = ', '.join(f'{o} {n[o]} ({100 * k[o] / n[o]:.0f}%)' for o in sorted(n))
            causes = collections.Counter(missed(r) for r in c if not met(r))
            why = ', '.join(f'{x} {causes[x]}' for x in sorted(causes)) or '-'
            ok = 100.0 * sum(map(met, c)) / len(c)
            waits = [r['queued_ms'] or 0.0 for r in c if r['flow'] == 'released']
            waited = f'{statistics.mean(waits):.0f} ms' if waits else '-'
            ttfts = [r['ttft_ms'] for r in c if r['ttft_ms'] is not None]
            ttft = f'{statistics.median(ttfts):.0f} ms' if ttfts else '-'
            last = per_3s if cls == 'interactive' else ''
            print(f'| {f.run} | {f.rate} | {f.seed} | {cls} | {len(c)} | {ok:.1f}% | {outcomes} | {why} | {waited} | {ttft} | {last} |')


if __name__ == '__main__':
    main()
