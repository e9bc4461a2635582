"""Where the batch work ran: per request log (a bench run's requests/*.jsonl), the servers ranked by
interactive requests served; batch requests on the four with the most interactive, and how many of
those left the flow queue in the positive tier (predicted to fit beside the interactive decodes); and
the share of the interactive requests on those four that met their SLOs (`met` of by_class.py in
../2026-11-27-flow-neighbours/, one definition). Lead-in included. Usage: python3 split.py RUN_DIR..."""
import collections
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ left in docs/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '2026-11-27-flow-neighbours'))
from by_class import met, request_files  # noqa: E402

print("| run | file | batch on the 4 interactive-heaviest servers (positive tier) | batch elsewhere | interactive met on those 4 |")
print("| --- | --- | ---: | ---: | ---: |")
for f in request_files(sys.argv[1:]):
    ok = [r for r in f.rows if r["status"] == 200]
    inter = collections.Counter(r["served_by"] for r in ok if r["class"] == "interactive")
    top = {s for s, _ in inter.most_common(4)}
    batch = [r for r in ok if r["class"] == "batch"]
    on = [r for r in batch if r["served_by"] in top]
    pos = sum(1 for r in on if r["tier"] == "positive")
    it = [r for r in ok if r["class"] == "interactive" and r["served_by"] in top]
    print(f"| {f.run} | {os.path.basename(f.path)} | {len(on)} ({pos}) | {len(batch) - len(on)} | {sum(map(met, it)) / max(1, len(it)):.1%} |")
