"""Per-class SLO attainment of benchmark runs, every rate and seed: mean over the seeds and their range.

Usage: python3 by_class.py [--per-seed] OUT [OUT...]   (each OUT a `headroom-bench run --out` directory with
requests/*.jsonl; `--per-seed`: one row per seed instead of the mean, so two arms run on the same seeds pair up)

The bench report gives per-class figures for the first seed at the equal-load point only; this reads every
request file. `met` is `Outcome::met_slo` (loadgen/src/runner.rs): streaming requests against their TTFT and
TPOT SLOs, non-streaming ones against `ttft_slo + tpot_slo * max_tokens` for the whole response.
"""
import collections
import glob
import json
import os
import re
import sys

def met(o):
    if o['status']!=200: return False
    if o['stream']:
        ok=True
        if o['slo_ttft_ms'] is not None: ok = o['ttft_ms'] is not None and o['ttft_ms']<=o['slo_ttft_ms']
        if o['slo_tpot_ms'] is not None and o['tpot_ms'] is not None: ok = ok and o['tpot_ms']<=o['slo_tpot_ms']
        return ok
    d=(o['slo_ttft_ms'] or 0)+(o['slo_tpot_ms'] or 0)*o['max_tokens']
    return o['e2e_ms']<=d
def workload_names(d):
    """The run's workloads, longest first (from its results.json; the bench's own names when it has none), so a
    file of workload "shared-prefix" never reads as workload "shared"."""
    try:
        names=[w['workload'] for w in json.load(open(os.path.join(d,'results.json')))['workloads']]
    except (OSError, KeyError, TypeError, ValueError):
        names=['mixed','azure','hetero','shared-prefix','short-long','long-short']
    return sorted(names, key=len, reverse=True)

def request_file(d, f):
    """(workload, router, rate, seed) of request file `f` of run directory `d`, as the bench names them; exits on a
    file that is not one. The ladder's own seed writes no suffix: LADDER_SEED in bench/src/lib.rs, 11."""
    names='|'.join(re.escape(n) for n in workload_names(d))
    m=re.match(r'(%s)-(.*)-(\d+(?:\.\d+)?)(?:-seed(\d+))?\.jsonl'%names,os.path.basename(f))
    if m is None:
        sys.exit('%s: not a request file of this run (workloads %s)'%(f,names))
    wl,router,rate,seed=m.groups()
    return wl,router,rate,seed or '11'

RequestFile=collections.namedtuple('RequestFile','run workload router rate seed path rows')

def request_files(dirs):
    """A `RequestFile` for every request file of run directories `dirs`, in order: the run named by its directory,
    workload, router, rate and seed by `request_file`, and its rows."""
    for d in dirs:
        for f in sorted(glob.glob(os.path.join(d,'requests','*.jsonl'))):
            yield RequestFile(os.path.basename(d.rstrip('/')),*request_file(d,f),f,[json.loads(l) for l in open(f)])

def main():
    args=sys.argv[1:]
    per_seed='--per-seed' in args
    res=collections.defaultdict(list)
    for r in request_files([a for a in args if a!='--per-seed']):
        c=collections.Counter()
        for o in r.rows:
            c[o['class']]+=1; c[o['class']+'_met']+=met(o)
            if o['class']!='sheddable': c['crit']+=1; c['crit_met']+=met(o)
            c['all']+=1; c['all_met']+=met(o)
            if o['status']==429: c['shed']+=1
        run=r.run + (' seed %s'%r.seed if per_seed else '')
        res[(run,r.workload,r.router,float(r.rate))].append({k:100*c[k+'_met']/c[k] for k in ['interactive','batch','sheddable','crit','all']}|{'shed':100*c['shed']/c['all']})
    print('| run | workload | router | rate | seeds | all | interactive | batch | sheddable | non-sheddable | shed |')
    print('|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|')
    for k in sorted(res, key=lambda k:(k[1],k[2],k[3],k[0])):
        v=res[k]; 
        def f(x):
            xs=[r[x] for r in v]; m=sum(xs)/len(xs)
            return '%.1f%%'%m + (' (%.1f-%.1f)'%(min(xs),max(xs)) if len(xs)>1 else '')
        print('| %s | %s | %s | %g | %d | %s | %s | %s | %s | %s | %s |'%(k[0],k[1],k[2],k[3],len(v),f('all'),f('interactive'),f('batch'),f('sheddable'),f('crit'),f('shed')))


if __name__ == '__main__':
    main()
