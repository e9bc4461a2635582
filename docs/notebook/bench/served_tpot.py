"""Served against measured TPOT in a benchmark's request log, per second of the step.

Usage: python3 docs/notebook/bench/served_tpot.py RESULTS/requests/<workload>-<router>-<rate>.jsonl...

For each log: the ratio of the TPOT the predictor served at dispatch (`predicted_tpot_ms`, the
calibrated prediction the filter placed on) to the measured one, at its 10th/50th/90th
percentiles; the median of each per second of arrival (`at_s`, simulated seconds); the share
of sheddable requests shed (429) and the placements in the negative tier. docs/notebook/predictor.md
("Late reports wound the correction up", "A new model's level") reads its tables from it.
"""

import json
import statistics
import sys


def main(paths):
    for path in paths:
        rows = [json.loads(line) for line in open(path)]
        per_second, ratios = {}, []
        for r in rows:
            if r.get("predicted_tpot_ms") and r.get("tpot_ms"):
                served, measured = per_second.setdefault(int(r["at_s"]), ([], []))
                served.append(r["predicted_tpot_ms"])
                measured.append(r["tpot_ms"])
                ratios.append(r["predicted_tpot_ms"] / r["tpot_ms"])
        if not ratios:
            print(f"{path}: no request with both a served and a measured TPOT")
            continue
        ratios.sort()
        q = lambda p: ratios[int(p * (len(ratios) - 1))]
        print(f"{path}\n served/measured TPOT p10/p50/p90: {q(.1):.2f} / {q(.5):.2f} / {q(.9):.2f}")
        seconds = sorted(per_second)
        print(" second:      " + " ".join(f"{s:6d}" for s in seconds))
        print(" served p50:  " + " ".join(f"{statistics.median(per_second[s][0]):6.1f}" for s in seconds))
        print(" measured p50:" + " ".join(f"{statistics.median(per_second[s][1]):6.1f}" for s in seconds))
        sheddable = sum(1 for r in rows if r["class"] == "sheddable")
        shed = sum(1 for r in rows if r["class"] == "sheddable" and r["status"] == 429)
        negative = sum(1 for r in rows if r.get("tier") == "negative")
        print(f" sheddable shed {shed}/{sheddable} ({100 * shed / max(sheddable, 1):.1f}%), "
              f"negative tier {negative} of {len(rows)}")


if __name__ == "__main__":
    main(sys.argv[1:])
