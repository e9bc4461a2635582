"""Requests and misses per SLO class and flow-control outcome, summed over every request file of each run.

Usage: python3 by_flow.py OUT [OUT...]   (each OUT a `headroom-bench run --out` directory with requests/*.jsonl)

`flow` is the request log's outcome (`x-headroom-flow`: immediate, released, expired, saturated, queue_full,
unmeetable; `-` when the answer carried none, as for a request shed at admission). An `unmeetable` request that
had waited (`queued_ms` > 0) is counted apart: found unmeetable in the queue, not on arrival. Whether a request met
its SLOs is by_class.py's `met` (`Outcome::met_slo` in loadgen/src/runner.rs).
"""
import collections
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '2026-11-27-flow-neighbours'))
from by_class import met  # noqa: E402


def main():
    for out in sys.argv[1:]:
        requests, missed, ttft_missed = collections.Counter(), collections.Counter(), collections.Counter()
        for f in sorted(glob.glob(os.path.join(out, 'requests', '*.jsonl'))):
            for line in open(f):
                o = json.loads(line)
                flow = o.get('flow') or '-'
                if flow == 'unmeetable' and (o.get('queued_ms') or 0) > 0:
                    flow = 'unmeetable after waiting'
                k = (o['class'], flow)
                requests[k] += 1
                if not met(o):
                    missed[k] += 1
                    timed = o['status'] == 200 and o['ttft_ms'] is not None and o['slo_ttft_ms'] is not None
                    ttft_missed[k] += timed and o['ttft_ms'] > o['slo_ttft_ms']
        print('## %s\n' % out.rstrip('/').split('/')[-1])
        print('| class | flow | requests | missed | of which TTFT late |\n|---|---|---:|---:|---:|')
        for k in sorted(requests):
            print('| %s | %s | %d | %d | %d |' % (k[0], k[1], requests[k], missed[k], ttft_missed[k]))
        print()


if __name__ == '__main__':
    main()
