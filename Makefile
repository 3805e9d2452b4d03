# `make demo` and `make test` work on a brand-new machine: each creates .venv and
# installs pinned dependencies first (a stamp file skips that on later runs).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-v2

# torch is pinned to its CPU build: an unpinned torch would pull a multi-GB CUDA build.
TORCH      := torch==2.13.0
DEV_PINS   := triton==3.9.0 numpy==2.4.6 libcst==1.9.0 pytest==8.4.2 hypothesis==6.140.0 ruff==0.14.0
DEMO_PINS  := transformers==4.57.1 matplotlib==3.10.7

.PHONY: setup demo demo-checks test lint bench bench-sglang clean bench-sglang-host bench-vllm

$(STAMP): pyproject.toml setup.py Makefile mm_schedule/_placeholder_set.c mm_schedule/plan/_flat_columns.c \
          kernels/segment_copy/_stream_copy.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q $(DEV_PINS) $(DEMO_PINS)
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

setup: $(STAMP)

demo: setup
	$(BIN)/python examples/demo.py

# The demo's checks alone (no timing), on another numeric path than the default one:
# torch's scalar CPU kernels, MKL without AVX-512, one thread. Seconds; CI runs it.
demo-checks: setup
	ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=AVX2 $(BIN)/python examples/demo.py --checks-only --threads 1

test: setup
	$(BIN)/python -m ruff check .
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q

lint: setup
	$(BIN)/python -m ruff check .

bench: setup
	$(BIN)/python benchmarks/run_all.py

# SGLang's own get_embedding_and_mask (official wheels) against ours, side by side.
bench-sglang: setup
	$(BIN)/python benchmarks/bench_vs_sglang.py

# The same side by side with every tensor on the meta device: host overhead alone.
bench-sglang-host: setup
	$(BIN)/python benchmarks/bench_vs_sglang.py --host-overhead

# vLLM's own gather + merge (source files from the official wheel) against ours, side by side.
bench-vllm: setup
	$(BIN)/python benchmarks/bench_vs_vllm.py

clean:
	rm -rf $(VENV) build *.egg-info
