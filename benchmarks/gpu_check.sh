#!/usr/bin/env bash
# The one unattended check for a machine with an NVIDIA or AMD GPU. Under 5 minutes:
#
#   1. finds a Python whose torch sees the GPU and makes this checkout importable
#      (no network, no install: it uses the torch/Triton already there)
#   2. GPU correctness tests:  pytest -m gpu tests/kernels
#   3. the tuner on a small search space for the benchmark's shapes
#   4. benchmarks/bench_merge.py: correctness sweep and CUDA-graph replay check of our
#      kernels on the GPU, then every case side by side with the peers (tuned configs)
#
# Results land in benchmarks/results/ and, when $OUT is set, are copied there as well
# (kernels_<device>.md/.json/.png, gpu_check_<device>.log, tuned_<device>.tar.gz).
#
#   bash benchmarks/gpu_check.sh           # PYTHON=/path/to/python picks the interpreter
#
# Exit status: 0 all steps passed; 1 a step failed (the log says which); 2 no GPU
# visible (only the CPU smoke run was done); 3 no usable torch.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RESULTS="$REPO/benchmarks/results"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mm_gpu_check.XXXXXX")"
LOG="$WORK/gpu_check.log"
BUDGET_S=290          # the whole script; every step's cap is cut to what is left
START_S=$SECONDS
mkdir -p "$RESULTS"

left() { echo $(( BUDGET_S - (SECONDS - START_S) )); }

# Run a step under `timeout`, capped at min(cap, time left - reserve); record its status.
STATUS=()
step() {
  local name=$1 cap=$2 reserve=$3; shift 3
  local limit; limit=$(( $(left) - reserve ))
  (( limit > cap )) && limit=$cap
  if (( limit < 10 )); then
    echo "== $name: SKIPPED (only $(left) s of the budget left)"; STATUS+=("$name: skipped (time)"); return 0
  fi
  echo "== $name (cap ${limit}s): $*"
  local t0=$SECONDS rc
  timeout -k 5 "$limit" "$@"; rc=$?
  local took=$(( SECONDS - t0 ))
  case $rc in
    0) STATUS+=("$name: ok (${took}s)") ;;
    124|137) STATUS+=("$name: TIMED OUT after ${took}s (partial results kept)") ;;
    *) STATUS+=("$name: FAILED rc=$rc (${took}s)") ;;
  esac
  return $rc
}

pick_python() {
  local c
  for c in "${PYTHON:-}" python3 python "$REPO/.venv/bin/python"; do
    [[ -n "$c" ]] || continue
    command -v "$c" >/dev/null 2>&1 || continue
    if "$c" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 4)' >/dev/null 2>&1; then
      PY=$c; HAVE_GPU=1; return 0
    fi
    if [[ -z "${PY:-}" ]] && "$c" -c 'import torch' >/dev/null 2>&1; then PY=$c; fi
  done
  HAVE_GPU=0
  [[ -n "${PY:-}" ]]
}

# mm_schedule maps two top-level folders (kernels/, codemods/) into its namespace
# (pyproject's package-dir); mirror that with symlinks instead of installing anything.
make_import_path() {
  local site="$WORK/site" entry
  mkdir -p "$site/mm_schedule"
  for entry in "$REPO"/mm_schedule/*; do ln -s "$entry" "$site/mm_schedule/"; done
  ln -s "$REPO/kernels" "$site/mm_schedule/kernels"
  ln -s "$REPO/codemods" "$site/mm_schedule/codemods"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
}

main() {
  echo "== gpu_check $(date -u '+%Y-%m-%d %H:%M:%S UTC') in $REPO"
  if ! pick_python; then
    echo "ERROR: no Python with torch found (tried \$PYTHON, python3, python, .venv/bin/python)."
    echo "       Install a CUDA or ROCm build of torch (and triton) first; this script does not download anything."
    return 3
  fi
  make_import_path
  # Python puts the working directory first on sys.path; in the repository root that
  # would find mm_schedule/ without its kernels/ (they live beside it), so work elsewhere.
  cd "$WORK" || return 1
  export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
  # The kernel tests' conftest turns the Triton interpreter on unless told otherwise:
  # on a GPU the kernels must be compiled for it.
  export TRITON_INTERPRET=0
  unset MM_SCHEDULE_KERNEL_BACKEND MM_SCHEDULE_KERNEL_CONFIG_DIR

  MM_REPO="$REPO" "$PY" - <<'EOF'
import os, sys, torch
import mm_schedule.kernels as k
checkout = os.path.realpath(os.environ["MM_REPO"])
if not os.path.realpath(k.__file__).startswith(checkout + os.sep):
    sys.exit(f"ERROR: mm_schedule.kernels comes from {k.__file__}, not from this checkout {checkout}")
print(f"python {sys.version.split()[0]} ({sys.executable})")
print(f"torch {torch.__version__}, cuda {torch.version.cuda}, hip {torch.version.hip}")
try:
    import triton
    print(f"triton {triton.__version__}")
except ImportError:
    print("WARNING: triton is not importable: the kernels fall back to torch and the numbers are NOT ours")
print(f"mm_schedule.kernels from {k.__file__}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device {torch.cuda.get_device_name(0)}: {p.multi_processor_count} SMs/CUs, "
          f"{p.total_memory / 2**30:.0f} GiB, arch {getattr(p, 'gcnArchName', '') or f'sm_{p.major}{p.minor}'}")
EOF
  [[ $? -eq 0 ]] || { echo "ERROR: this checkout does not import (see above)"; return 1; }
  if command -v nvidia-smi >/dev/null 2>&1; then timeout 15 nvidia-smi; elif command -v rocm-smi >/dev/null 2>&1; then timeout 15 rocm-smi; fi

  if (( HAVE_GPU == 0 )); then
    echo "ERROR: torch in $PY sees no GPU; running only the CPU smoke benchmark."
    step "bench (cpu smoke)" 120 5 "$PY" "$REPO/benchmarks/bench_merge.py" --cpu-smoke --out-dir "$RESULTS"
    return 2
  fi

  LABEL=$("$PY" -c 'import re, torch; print(re.sub(r"[^A-Za-z0-9._-]+", "_", torch.cuda.get_device_name(0)).strip("_"))')
  local failed=0

  local collected
  local pytest_args=(-m pytest -q -m gpu -p no:cacheprovider --rootdir "$REPO" -c "$REPO/pyproject.toml" "$REPO/tests/kernels")
  collected=$("$PY" "${pytest_args[@]}" --collect-only 2>/dev/null | grep -c '::' || true)
  if (( collected > 0 )); then
    step "gpu tests ($collected)" 90 200 "$PY" "${pytest_args[@]}" || failed=1
  else
    echo "== gpu tests: none marked gpu under tests/kernels; the benchmark's sweep is the GPU correctness check"
  fi

  local tuned="$WORK/tuned"
  if "$PY" -c 'import mm_schedule.kernels.tools.tune' >/dev/null 2>&1; then
    # The benchmark's bf16 hidden sizes at two row buckets, the quick search space (the
    # fp16/fp32 cases keep the shipped configs or the heuristic).
    if step "tuner" 60 170 "$PY" -m mm_schedule.kernels.tools.tune --quick --out "$tuned" \
         --kernels segment_gather --dtypes bfloat16 --hidden 1152,2048,3584,4096,8192 \
         --rows 1024,16384 --reps 10 --timings "$WORK/tuner_timings.json"; then
      export MM_SCHEDULE_KERNEL_CONFIG_DIR="$tuned"
    else
      failed=1
      echo "   the benchmark runs with the shipped configs / heuristic instead"
    fi
  else
    echo "== tuner: mm_schedule.kernels.tools.tune not importable; skipped"
  fi

  # The benchmark writes its files after every case, so a cut-short run keeps what it measured.
  local bench_cap=$(( $(left) - 15 ))
  step "benchmark" "$bench_cap" 10 "$PY" "$REPO/benchmarks/bench_merge.py" --out-dir "$RESULTS" \
       --max-seconds $(( bench_cap - 35 )) --sweep-seconds 30 || failed=1
  return $failed
}

finish() {
  local rc=$1
  {
    echo "== summary (rc=$rc, $(( SECONDS - START_S ))s)"
    for s in ${STATUS[@]+"${STATUS[@]}"}; do echo "   $s"; done
  } | tee -a "$LOG"
  local label="${LABEL:-unknown}"
  cp "$LOG" "$RESULTS/gpu_check_${label}.log"
  [[ -d "$WORK/tuned" ]] && tar -czf "$RESULTS/tuned_${label}.tar.gz" -C "$WORK" tuned \
    $( [[ -f "$WORK/tuner_timings.json" ]] && echo tuner_timings.json )
  if [[ -n "${OUT:-}" ]]; then
    mkdir -p "$OUT"
    for f in "$RESULTS"/kernels_"${label}".{md,json,png} "$RESULTS"/kernels_cpu-smoke.{md,json} \
             "$RESULTS/gpu_check_${label}.log" "$RESULTS/tuned_${label}.tar.gz"; do
      [[ -f "$f" ]] && cp "$f" "$OUT/"
    done
    echo "copied results to $OUT: $(ls "$OUT" | tr '\n' ' ')"
  fi
  rm -rf "$WORK/site"
  exit "$rc"
}

# Status and labels are set inside main, so it runs in this shell; its output goes
# through tee by way of a process substitution.
main > >(tee -a "$LOG") 2>&1
rc=$?
sleep 1  # let tee drain
finish "$rc"
