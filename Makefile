# `make demo` and `make test` work on a brand-new machine: each creates .venv and
# installs pinned dependencies first (a stamp file skips that on later runs).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-v3

# torch is pinned to its CPU build: an unpinned torch would pull a multi-GB CUDA build.
TORCH      := torch==2.13.0
# What the tests, the demo and the peers' modules they load import, on both stacks below.
TEST_PINS  := libcst==1.9.0 pytest==8.4.2 hypothesis==6.140.0 ruff==0.14.0 matplotlib==3.10.7 pillow==13.0.0 \
              pyyaml==6.0.4
DEV_PINS   := triton==3.9.0 numpy==2.4.6 $(TEST_PINS)
# kernels is Hugging Face's kernel-hub package, which transformers imports when it is
# installed; 0.12.3 is its newest release that accepts transformers 4.57's huggingface-hub<1.
DEMO_PINS  := transformers==4.57.1 kernels==0.12.3

# `make test-stack2`: the suite once more on the other stack in use today, that of CUDA 13 GPU
# servers (Python 3.12 where there is one, else 3.11). PyPI has torch 2.11 only as its CUDA 13
# build, which imports and runs on a machine without a GPU once its nvidia-* wheels are
# installed beside it; pip brings them (about 3 GB, once: the environment is cached).
STACK2_VENV   := .venv-stack2
STACK2_BIN    := $(STACK2_VENV)/bin
STACK2_STAMP  := $(STACK2_VENV)/.installed-v2
STACK2_PYTHON ?= $(shell for p in python3.12 "$$(pyenv prefix "$$(pyenv latest 3.12 2>/dev/null)" 2>/dev/null)/bin/python3.12" python3.11; do \
                   "$$p" -c "" 2>/dev/null && { echo "$$p"; break; }; done)
STACK2_PINS   := torch==2.11.0 triton==3.6.0 numpy==2.4.6 transformers==5.25.0 kernels==0.19.1 $(TEST_PINS)

# The optional C helpers setup.py builds: an edit to one reinstalls, so it is rebuilt.
C_SOURCES := mm_schedule/_placeholder_set.c mm_schedule/_cache_hits.c mm_schedule/_output_checks.c \
             mm_schedule/plan/_flat_columns.c \
             kernels/segment_copy/_stream_copy.c

.PHONY: setup setup-stack2 demo demo-checks test test-stack2 lint bench bench-sglang clean bench-sglang-host bench-vllm

$(STAMP): pyproject.toml setup.py Makefile $(C_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q $(DEV_PINS) $(DEMO_PINS)
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

setup: $(STAMP)

$(STACK2_STAMP): pyproject.toml setup.py Makefile $(C_SOURCES)
	@test -n "$(STACK2_PYTHON)" || { echo "make test-stack2 needs python3.12 or python3.11"; exit 1; }
	$(STACK2_PYTHON) -m venv $(STACK2_VENV)
	$(STACK2_BIN)/python -m pip install -q --upgrade pip
	$(STACK2_BIN)/python -m pip install -q $(STACK2_PINS)
	$(STACK2_BIN)/python -m pip install -q --no-deps -e .
	touch $@

setup-stack2: $(STACK2_STAMP)

demo: setup
	$(BIN)/python examples/demo.py

# The demo's checks alone (no timing), on another numeric path than the default one:
# torch's scalar CPU kernels, MKL without AVX-512, one thread. Seconds; CI runs it.
demo-checks: setup
	ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=AVX2 $(BIN)/python examples/demo.py --checks-only --threads 1

test: setup
	$(BIN)/python -m ruff check .
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q

# ruff ran in `make test`; the same code on other library versions needs no second lint.
test-stack2: setup-stack2
	TRITON_INTERPRET=1 $(STACK2_BIN)/python -m pytest -q

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
	rm -rf $(VENV) $(STACK2_VENV) build *.egg-info
