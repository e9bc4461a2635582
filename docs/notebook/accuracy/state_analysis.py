"""How much of TTFT and TPOT the state a predictor can know explains (docs/notebook/predictor.md,
"What the state knows"). An offline analysis, not part of `make test`:

    python3 -m venv /tmp/ana && /tmp/ana/bin/pip install lightgbm scikit-learn
    target/release/headroom-stack accuracy --floor 8 --report-lag-ms 100 --floor-dump /tmp/floor100
    target/release/headroom-stack accuracy --floor 8 --report-lag-ms 20 --floor-dump /tmp/floor20
    /tmp/ana/bin/python docs/notebook/accuracy/state_analysis.py /tmp/floor100 /tmp/floor20
    # and, on a live run's observations (accuracy --observations obs.jsonl):
    /tmp/ana/bin/python docs/notebook/accuracy/state_analysis.py --live obs.jsonl

Each figure is the mean relative error of gradient-boosted trees (fitted on log latency,
5-fold cross-validation, so out of sample) given one set of columns: the best a model of
that state does on that traffic, whatever its training.
"""

import csv
import json
import sys

import numpy as np
import lightgbm as lgb
from sklearn.model_selection import KFold


def cv_mape(X, y):
    errs = np.zeros(len(y))
    for tr, te in KFold(5, shuffle=True, random_state=0).split(X):
        m = lgb.LGBMRegressor(n_estimators=300, learning_rate=0.05, num_leaves=31, min_child_samples=10, verbose=-1)
        m.fit(X[tr], np.log(y[tr]))
        errs[te] = np.abs(np.exp(m.predict(X[te])) - y[te]) / y[te]
    return errs.mean()


SETS = {
    "prompt + server only": ["server", "prompt_tokens"],
    "tracked state, fresh": ["server", "prompt_tokens", "in_flight", "prefill_tokens", "tokens"],
    "tracked state, a report tick late": ["server", "prompt_tokens", "lagged_in_flight", "lagged_prefill_tokens", "lagged_tokens"],
    "fresh + scraped running/waiting": ["server", "prompt_tokens", "in_flight", "prefill_tokens", "tokens", "running", "waiting"],
    "fresh + the step clock (oracle)": ["server", "prompt_tokens", "in_flight", "prefill_tokens", "tokens", "step_left_ms"],
}


def simulated(dirs):
    print("| floor dump | phase | target | " + " | ".join(SETS) + " |")
    print("| --- | --- | --- |" + " ---: |" * len(SETS))
    for d in dirs:
        for phase in ["mixed", "shifted"]:
            rows = list(csv.DictReader(open(f"{d}/{phase}.csv")))
            for target in ["ttft_ms", "tpot_ms"]:
                rs = [r for r in rows if r[target]]
                y = np.array([float(r[target]) for r in rs])
                cells = []
                for cols in SETS.values():
                    X = np.array([[float(r[c]) for c in cols] for r in rs])
                    cells.append(f"{100 * cv_mape(X, y):.1f}%")
                print(f"| {d} | {phase} | {target[:4].upper()} | " + " | ".join(cells) + " |")


def live(path):
    rows = [json.loads(line) for line in open(path)]
    print("| phase | target | requests | the run's live error | prompt + hardware only | every dispatch-time column |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for phase in ["mixed", "shifted"]:
        obs = [r["observation"] for r in rows if r["phase"] == phase]
        obs = [o for o in obs if o["status"] == 200 and o["request"]["streaming"] and o["state_at_dispatch"]]
        for target in ["ttft_ms", "tpot_ms"]:
            os_ = [o for o in obs if o.get(target) and o.get("predicted_" + target)]
            y = np.array([o[target] for o in os_])
            live_err = np.mean([abs(o["predicted_" + target] - o[target]) / o[target] for o in os_])
            s = [o["state_at_dispatch"] for o in os_]
            basic = np.array([[o["request"]["input_tokens"], st["hardware_class"]] for o, st in zip(os_, s)], float)
            keys = ["running", "waiting", "kv_usage", "prefix_match", "in_flight", "uncached_tokens_in_flight",
                    "tokens_in_flight", "prefill_tokens_per_s"]
            full = np.column_stack([basic, np.array([[st.get(k) or 0 for k in keys] +
                                                     [st.get("recent_tpot_ms") or 0] for st in s], float)])
            print(f"| {phase} | {target[:4].upper()} | {len(y)} | {100 * live_err:.1f}% | "
                  f"{100 * cv_mape(basic, y):.1f}% | {100 * cv_mape(full, y):.1f}% |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--live"]:
        live(sys.argv[2])
    else:
        simulated(sys.argv[1:])
