"""Per run of `headroom-bench gateway` (the old-N / new-N outputs beside this file, in the order
they ran: old-1, new-2, old-2, new-3, old-3, new-4, old-4, new-5, then old-6, new-6, new-7, old-7):
plain Envoy's and SLO routing's mean rate at each connection count, their ratio, Envoy's CPU per
request on each path and the ratio of those, and the run's headline share. Then the means per build.

    python3 docs/notebook/perf/2026-11-28-header-map/compare.py
"""
import glob
import json
import os
import re
import statistics as st

HERE = os.path.dirname(os.path.abspath(__file__))
ROUTED = "Envoy + headroom, SLO routing"


def runs():
    for path in sorted(glob.glob(os.path.join(HERE, "*.json")), key=lambda p: int(re.sub(r"\D", "", p[-8:]))):
        name = os.path.basename(path)[:-5]
        yield name, json.load(open(path))


def main():
    print("| run | connections | plain req/s | SLO routing req/s | ratio | Envoy us/request plain | SLO routing | ratio | headline share |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    cpu_ratio, share = {}, {}
    for name, d in runs():
        build = name.split("-")[0]
        share.setdefault(build, []).append(d["throughput_share"])
        for conns in sorted({r["connections"] for r in d["throughput"]}):
            rows = lambda p: [r for r in d["throughput"] if r["path"] == p and r["connections"] == conns]
            rate = lambda p: st.mean(r["requests_per_s"] for r in rows(p))
            us = lambda p: st.mean(1e6 * r["envoy_cores"] / r["requests_per_s"] for r in rows(p))
            plain, routed = "plain Envoy", ROUTED
            if conns == 128:
                cpu_ratio.setdefault(build, []).append(us(routed) / us(plain))
            print(f"| {name} | {conns} | {rate(plain):.0f} | {rate(routed):.0f} | {rate(routed) / rate(plain):.2f} "
                  f"| {us(plain):.0f} | {us(routed):.0f} | {us(routed) / us(plain):.2f} | {d['throughput_share']:.1%} |")
    for build in sorted(share):
        s, c = share[build], cpu_ratio[build]
        print(f"{build}: headline share mean {st.mean(s):.1%} ({min(s):.1%}-{max(s):.1%}); "
              f"Envoy CPU per routed request / plain Envoy's at 128 connections mean {st.mean(c):.2f} ({min(c):.2f}-{max(c):.2f})")


if __name__ == "__main__":
    main()
