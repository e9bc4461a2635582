"""Where the batch work ran: per request log (a bench run's requests/*.jsonl), the servers ranked by
interactive requests served; batch requests on the four with the most interactive, and how many of
those left the flow queue in the positive tier (predicted to fit beside the interactive decodes).
Lead-in included. Usage: python3 split.py RUN_DIR..."""
import collections, glob, json, os, sys

print("| run | file | batch on the 4 interactive-heaviest servers (positive tier) | batch elsewhere | interactive met on those 4 |")
print("| --- | --- | ---: | ---: | ---: |")
for run in sys.argv[1:]:
    for f in sorted(glob.glob(os.path.join(run, "requests", "*.jsonl"))):
        rows = [json.loads(l) for l in open(f)]
        ok = [r for r in rows if r["status"] == 200]
        inter = collections.Counter(r["served_by"] for r in ok if r["class"] == "interactive")
        top = {s for s, _ in inter.most_common(4)}
        batch = [r for r in ok if r["class"] == "batch"]
        on = [r for r in batch if r["served_by"] in top]
        pos = sum(1 for r in on if r["tier"] == "positive")
        met = lambda r: r["ttft_ms"] <= r["slo_ttft_ms"] and (r["tpot_ms"] or 0) <= r["slo_tpot_ms"]
        it = [r for r in ok if r["class"] == "interactive" and r["served_by"] in top]
        print(f"| {os.path.basename(run.rstrip('/'))} | {os.path.basename(f)} | {len(on)} ({pos}) | {len(batch) - len(on)} | {sum(map(met, it)) / max(1, len(it)):.1%} |")
