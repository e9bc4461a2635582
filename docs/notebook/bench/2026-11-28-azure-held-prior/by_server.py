"""Where the interactive class missed, by the server that served it and how much batch work that server took.

Usage: python3 by_server.py OUT...   (`headroom-bench run --out` directories with requests/ and observations/)

For each run's request log, per hardware class (from observations/, `by_tenth.hardware_classes`), the servers
sorted by how many batch requests they served in the measured step; for each group the interactive requests it
served, how many missed their SLOs (`by_class.met`), and the TPOT predicted at dispatch (as served: the p90
objective's figure) against the TPOT measured, medians, in engine milliseconds. The fast class is split into the
two servers that took the most batch work and the rest.
"""
import collections
import glob
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ left in docs/
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, '..', '2026-11-27-flow-neighbours'))
sys.path.insert(0, os.path.join(here, '..', '2026-11-27-prior-time-scale'))
from by_class import met  # noqa: E402
from by_tenth import hardware_classes  # noqa: E402


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float('nan')


def groups(rows, classes):
    """(label, servers) groups: the slow class whole; the fast class's two most batch-laden servers, then the rest."""
    batch = collections.Counter(r['served_by'] for r in rows if r['class'] == 'batch' and r['served_by'])
    by_class = collections.defaultdict(list)
    for server in {r['served_by'] for r in rows if r['served_by']}:
        by_class[classes.get(server)].append(server)
    fast = max(by_class, key=lambda c: len(by_class[c]))
    out = []
    for c, servers in sorted(by_class.items(), key=lambda kv: str(kv[0])):
        servers.sort(key=lambda s: -batch[s])
        if c == fast:
            out.append(('class %s, the 2 with most batch' % c, servers[:2]))
            out.append(('class %s, the other %d' % (c, len(servers) - 2), servers[2:]))
        else:
            out.append(('class %s (%d)' % (c, len(servers)), servers))
    return out, batch


def main():
    print('| run | servers | batch served | interactive served | missed | TPOT predicted / measured (p50, ms) |')
    print('|---|---|---:|---:|---:|---|')
    for d in sys.argv[1:]:
        for f in sorted(glob.glob(d + '/requests/*.jsonl')):
            name = os.path.basename(f)
            classes = hardware_classes(os.path.join(d, 'observations', name))
            rows = [json.loads(line) for line in open(f)]
            grouped, batch = groups(rows, classes)
            for label, servers in grouped:
                inter = [r for r in rows if r['class'] == 'interactive' and r['served_by'] in servers]
                missed = sum(not met(r) for r in inter)
                pred = median([r['predicted_tpot_ms'] for r in inter if r['predicted_tpot_ms'] is not None])
                meas = median([r['tpot_ms'] for r in inter if r['tpot_ms'] is not None])
                print('| %s | %s | %d | %d | %d (%.0f%%) | %.1f / %.1f |' % (
                    name.replace('.jsonl', ''), label, sum(batch[s] for s in servers), len(inter), missed,
                    100 * missed / max(len(inter), 1), pred, meas))


if __name__ == '__main__':
    main()
