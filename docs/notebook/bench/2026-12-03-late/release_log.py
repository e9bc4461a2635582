"""How requests left flow control's queue, from a predictor built with release-log.patch.

Usage: python3 release_log.py PREDICTOR_LOG [PREDICTOR_LOG...]   (the bench's .run/predictor.log after a run)

The patch logs one `FLOWDBG` line per request placed at once with room (`immediate`) and per release from the
queue, with the path that released it: `horizon` (an endpoint had room for it and the queue ahead there was within
the dispatch horizon), `fits-press` (an endpoint had room, past the horizon, and its TTFT SLO pressed) or
`own-press` (room only at its neighbours' expense, its TTFT SLO pressed: `least_harm_with_own_room`). Per class
(by the TTFT SLO in wall time: mixed at 0.5x doubles 400 / 4,000 / 1,000 ms): how many left each way, how long
they had waited (median and mean, wall ms) and how many endpoints had room for them then. The log covers the whole
run, lead-in included, so the counts are not the measured step's.
"""
import collections
import re
import sys

CLASS = {'Some(800.0)': 'interactive', 'Some(8000.0)': 'batch', 'Some(2000.0)': 'sheddable'}


def main():
    print('| log | class | left | requests | waited, median | waited, mean | endpoints with room, mean |')
    print('| --- | --- | --- | ---: | ---: | ---: | ---: |')
    for path in sys.argv[1:]:
        n = collections.Counter()
        waited = collections.defaultdict(list)
        room = collections.defaultdict(list)
        for line in open(path):
            if 'FLOWDBG' not in line:
                continue
            f = dict(re.findall(r'(\w+)=(\S+)', line))
            cls = CLASS.get(f['slo'], f['slo'])
            key = (cls, 'immediate') if ' imm ' in line else (cls, f['via'])
            n[key] += 1
            if 'waited' in f:
                waited[key].append(float(f['waited']))
                room[key].append(int(f['nfit']))
        for key in sorted(n):
            w = sorted(waited[key])
            med = f'{w[len(w) // 2]:.0f}' if w else '-'
            mean = f'{sum(w) / len(w):.0f}' if w else '-'
            fit = f'{sum(room[key]) / len(room[key]):.2f}' if room[key] else '-'
            print(f'| {path} | {key[0]} | {key[1]} | {n[key]} | {med} | {mean} | {fit} |')


if __name__ == '__main__':
    main()
