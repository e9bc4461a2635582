"""Where each class ran: per server, the interactive and batch requests it served and what that did to the
interactive decodes there.

Usage: python3 servers.py OUT [OUT...]   (each OUT a `headroom-bench run --out` directory with requests/*.jsonl and
observations/*.jsonl)

Per run, seed and server (most batch requests first): its GPU (the `hardware_class` the predictor reported at
dispatch in the observations: ids are the sorted hardware names, 1 `a100`, 2 `h100`), the interactive and batch
requests it served, the prompt tokens of all it served (thousands), and of its streamed interactive requests the
median TPOT and the share that met their SLOs (`met` of by_class.py in ../2026-11-27-flow-neighbours/). Loose work
gathered apart from tight work shows as servers of one class or the other; tight decodes among loose ones as
interactive TPOTs over their 40 ms SLO. `by_server.py` in ../2026-11-28-azure-held-prior/ groups the same servers
(the slow class, the two fast servers with the most batch, the rest) against the TPOT predicted there; this keeps
every server apart and names its GPU.

Then per run and seed, of the streamed batch requests released from the queue, those placed with no endpoint
positive for them (the policy's negative tier: pressed, beside tighter decodes wherever they went) and how many of
those went to the four servers that served the most interactive requests.
"""
import collections
import os
import statistics
import sys

sys.dont_write_bytecode = True  # no __pycache__ left in docs/
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, '..', '2026-11-27-flow-neighbours'))
sys.path.insert(0, os.path.join(here, '..', '2026-11-27-prior-time-scale'))
from by_class import met, request_files  # noqa: E402
from by_tenth import hardware_classes  # noqa: E402

GPU = {1: 'A100', 2: 'H100'}


def gpus(path):
    """Server address -> GPU name, from the observations file of request file `path` (its run's observations/ holds
    one of the same name)."""
    observations = os.path.join(os.path.dirname(os.path.dirname(path)), 'observations', os.path.basename(path))
    return {server: GPU.get(c, 'class %s' % c) for server, c in hardware_classes(observations).items()}


def count(rows, cls):
    """How many of `rows` are of SLO class `cls`."""
    return sum(1 for r in rows if r['class'] == cls)


def servers(files):
    print('| run | rate | seed | server | GPU | interactive | batch | prompt tokens (k) | interactive TPOT, median | interactive met |')
    print('| --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |')
    for f in files:
        gpu = gpus(f.path)
        served = collections.defaultdict(list)
        for r in f.rows:
            if r.get('served_by'):
                served[r['served_by']].append(r)
        for server, rs in sorted(served.items(), key=lambda kv: -count(kv[1], 'batch')):
            tight = [r for r in rs if r['class'] == 'interactive' and r['stream'] and r['tpot_ms'] is not None]
            tpot = f'{statistics.median(r["tpot_ms"] for r in tight):.1f} ms' if tight else '-'
            ok = f'{100 * sum(map(met, tight)) / len(tight):.0f}%' if tight else '-'
            tokens = sum(r['prompt_tokens'] for r in rs) / 1000
            print(f'| {f.run} | {f.rate} | {f.seed} | :{server.rsplit(":", 1)[-1]} | {gpu.get(server, "?")} | '
                  f'{count(rs, "interactive")} | {count(rs, "batch")} | {tokens:.0f} | {tpot} | {ok} |')


def pressed(files):
    print()
    print('| run | rate | seed | batch released (streamed) | of them placed negative | on the 4 most interactive servers |')
    print('| --- | ---: | ---: | ---: | ---: | ---: |')
    for f in files:
        tight = collections.Counter(r['served_by'] for r in f.rows if r['class'] == 'interactive')
        busiest = {s for s, _ in tight.most_common(4)}
        released = [r for r in f.rows if r['class'] == 'batch' and r['stream'] and r['flow'] == 'released']
        negative = [r for r in released if r['tier'] == 'negative']
        among = sum(1 for r in negative if r['served_by'] in busiest)
        print(f'| {f.run} | {f.rate} | {f.seed} | {len(released)} | {len(negative)} | {among} |')


def main():
    files = list(request_files(sys.argv[1:]))
    servers(files)
    pressed(files)


if __name__ == '__main__':
    main()
