#!/usr/bin/env bash
# Prints the path of the Envoy binary installed in the project's .venv by `make setup`.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in .venv/lib/python*/site-packages/envoy/_bin/envoy; do
  if [ -x "$f" ]; then echo "$(pwd)/$f"; exit 0; fi
done
exit 1
