#!/usr/bin/env bash
# The unattended GPU check from a checkout, with nothing installed:
#
#   bash benchmarks/gpu_check.sh --out DIR [--budget-s 300]     # PYTHON=... picks the interpreter
#
# It makes this checkout importable as mm_schedule (the package maps kernels/ and
# codemods/ into its namespace, so it links them into a temporary folder, removed on exit,
# instead of installing anything) and runs `python -m mm_schedule.kernels.tools.gpu_check`
# with the same arguments: AOT report, GPU tests, tuner, bandwidth sweep and benchmark in
# one process, everything left in DIR/gpu_check.tar.gz; see that module.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
SITE="$(mktemp -d "${TMPDIR:-/tmp}/mm_schedule_site.XXXXXX")"
trap 'rm -rf "$SITE"' EXIT
mkdir -p "$SITE/mm_schedule"
for entry in "$REPO"/mm_schedule/*; do ln -s "$entry" "$SITE/mm_schedule/"; done
ln -s "$REPO/kernels" "$SITE/mm_schedule/kernels"
ln -s "$REPO/codemods" "$SITE/mm_schedule/codemods"
# Folders given relative to where this was started, made absolute before leaving it.
args=()
while (($#)); do
  case $1 in
    --out|--results-dir|--configs-dir) args+=("$1" "$(realpath -m -- "${2:-}")"); shift; shift || true ;;
    --out=*|--results-dir=*|--configs-dir=*) args+=("${1%%=*}=$(realpath -m -- "${1#*=}")"); shift ;;
    *) args+=("$1"); shift ;;
  esac
done
# From the repository root, Python would import mm_schedule/ without kernels/ beside it.
cd "$SITE" || exit 1
PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m mm_schedule.kernels.tools.gpu_check ${args[@]+"${args[@]}"}
