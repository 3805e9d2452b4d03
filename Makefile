# `make demo` and `make test` work on a brand-new machine: each creates .venv and
# installs pinned dependencies first (a stamp file skips that on later runs).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-v2

# torch is pinned to its CPU build: an unpinned torch would pull a multi-GB CUDA build.
TORCH      := torch==2.13.0
DEV_PINS   := triton==3.9.0 libcst==1.9.0 pytest==8.4.2 hypothesis==6.140.0 ruff==0.14.0
DEMO_PINS  := transformers==4.57.1 matplotlib==3.10.7

.PHONY: setup demo test lint bench bench-sglang clean

$(STAMP): pyproject.toml Makefile mm_schedule/_placeholder_set.c kernels/segment_copy/_stream_copy.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q $(DEV_PINS) $(DEMO_PINS)
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

setup: $(STAMP)

demo: setup
	$(BIN)/python examples/demo.py

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

clean:
	rm -rf $(VENV) build *.egg-info
