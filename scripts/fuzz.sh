#!/usr/bin/env bash
# `make fuzz [FUZZ_S=60] [FUZZ_TARGETS="api_bodies openai_body"]`: runs every cargo-fuzz
# target in fuzz/ for FUZZ_S seconds each (libFuzzer, nightly), then prints one line a
# target: executions, corpus size, outcome. Installs what it needs and is missing: the
# nightly toolchain (rustup) and cargo-fuzz (into .tools/). Exits non-zero on any crash;
# the crashing input is kept under fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."

S=${FUZZ_S:-60}
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "fuzz: installing the nightly toolchain (rustup, minimal profile)"
  rustup toolchain install nightly --profile minimal
fi
if ! .tools/bin/cargo-fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz into .tools (a few minutes, once)"
  cargo install --quiet --locked --root .tools cargo-fuzz
fi
export PATH="$PWD/.tools/bin:$PATH"
# The targets that build the predictor's whole state load ONNX Runtime: the project's own.
if [ -z "${ORT_DYLIB_PATH:-}" ]; then
  ORT_DYLIB_PATH=$(ls "$PWD"/.venv/lib/python*/site-packages/onnxruntime/capi/libonnxruntime.so.* 2>/dev/null | head -1)
  export ORT_DYLIB_PATH
fi
targets=${FUZZ_TARGETS:-$(cd fuzz && cargo +nightly fuzz list)}
mkdir -p fuzz/logs
(cd fuzz && cargo +nightly fuzz build --release)
summary=()
failed=0
for t in $targets; do
  mkdir -p "fuzz/corpus/$t"
  echo "fuzz: $t for ${S}s"
  if (cd fuzz && cargo +nightly fuzz run --release "$t" -- -max_total_time="$S" -print_final_stats=1) \
      >"fuzz/logs/$t.log" 2>&1; then
    outcome=ok
  else
    outcome="CRASH (see fuzz/logs/$t.log, fuzz/artifacts/$t/)"
    failed=1
  fi
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "fuzz/logs/$t.log" | grep -oE '[0-9]+$' | tail -1)
  corpus=$(find "fuzz/corpus/$t" -type f | wc -l)
  summary+=("$(printf '%-16s %12s execs %8s corpus files  %s' "$t" "${execs:-?}" "$corpus" "$outcome")")
done
echo
echo "fuzz: ${S}s per target"
printf '%s\n' "${summary[@]}"
exit $failed
