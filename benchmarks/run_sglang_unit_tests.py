"""Run SGLang's own unit-test file for ``mm_schedule`` against SGLang's module and the stand-in.

    python benchmarks/run_sglang_unit_tests.py PATH/TO/test_mm_chunked_embedding_unit.py \
        [--release 0.5.19] [--out benchmarks/results/sglang_unit_tests_0.5.19.md]

The test file comes from SGLang's public repository (it is not part of mm-schedule). Each
target runs in its own process with the release's real modules loaded from its wheel on
CPU (``_sglang_process``), ``sglang.srt.managers.mm_schedule`` being:

* ``sglang``: the release's own module;
* ``stand-in``: ``mm_schedule.integrations.sglang.standin`` as it ships, bound as the
  release (``standin.use_release``);
* ``stand-in, SGLang behaviour``: the same inside ``sglang_behaviour()`` (every intended
  difference switched to SGLang's behaviour).

The table lists each test's outcome per target. The run fails (exit 1) when a test that
passes on SGLang's module fails on the stand-in and is not one of ``INTENDED`` (the
differences docs/sglang.md names), or fails on the stand-in with SGLang's behaviour.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGETS = ("sglang", "stand-in", "stand-in, SGLang behaviour")

# Tests that pass on SGLang's module and, by design, not on the stand-in's defaults: the
# difference (docs/sglang.md) that makes them fail. Each must pass with SGLang's behaviour.
INTENDED = {
    "test_tensor_cache_entries_share_storage": "own_storage: cache entries own their storage",
    "test_hip_cross_request_encode_batches_allowlisted_models[platform1-OtherVlForConditionalGeneration-2]":
        "batch_on_every_backend: misses of all requests are encoded together on ROCm too",
}


# Names SGLang's test file patches in an autouse fixture (``monkeypatch.setattr`` refuses a
# missing attribute), though later releases removed them.
PATCHED_BY_THE_FILE = ("_acknowledge_deferred_cuda_ipc_cache_hits",)


def _removed(*_args, **_kwargs):
    raise AssertionError("the release removed this name; only the test file's fixture may replace it")


def _run_target(test_file: str, release: str, target: str) -> dict[str, str]:
    """Inside the child process: run the file with ``target`` as mm_schedule."""
    sys.path.insert(0, str(HERE))
    import contextlib

    import pytest
    from _sglang_process import SGLangProcess

    process = SGLangProcess(release)
    outcomes: dict[str, str] = {}

    class Collect:
        def pytest_runtest_logreport(self, report):
            name = report.nodeid.split("::", 1)[-1]
            if report.when == "call" or report.outcome != "passed":
                outcome = report.outcome if report.when == "call" else f"{report.outcome} ({report.when})"
                if report.failed:
                    lines = [line for line in report.longreprtext.splitlines() if line.startswith("E ")]
                    outcome += ": " + (lines[0][1:].strip() if lines else "?")[:110]
                outcomes[name] = outcome

    with process:
        behaviour = contextlib.nullcontext()
        if target != "sglang":
            from mm_schedule.integrations.sglang import sglang_behaviour, standin

            standin.use_release(release)
            sys.modules["sglang.srt.managers.mm_schedule"] = standin
            sys.modules["sglang.srt.managers"].mm_schedule = standin
            if target == "stand-in, SGLang behaviour":
                behaviour = sglang_behaviour()
        module = sys.modules["sglang.srt.managers.mm_schedule"]
        for name in PATCHED_BY_THE_FILE:
            if not hasattr(module, name):
                # The file's autouse fixture replaces it, and the release removed it: give
                # the fixture a name to replace, on every target alike (nothing calls it).
                setattr(module, name, _removed)
        with behaviour:
            pytest.main([test_file, "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--no-header",
                         "-o", "addopts=", "--rootdir", str(Path(test_file).parent)], plugins=[Collect()])
    return outcomes


def run(test_file: Path, release: str) -> dict[str, dict[str, str]]:
    results = {}
    for target in TARGETS:
        proc = subprocess.run(
            [sys.executable, __file__, str(test_file), "--release", release, "--child", target],
            capture_output=True, text=True, check=False,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("OUTCOMES ")]
        if not lines:
            raise SystemExit(f"{target}: the test run produced no outcomes\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        results[target] = json.loads(lines[-1][len("OUTCOMES "):])
    return results


def problems(results: dict[str, dict[str, str]]) -> list[str]:
    found = []
    for name, outcome in results["sglang"].items():
        if _short(outcome) != "passed":
            continue
        if _short(results["stand-in"].get(name, "-")) != "passed" and name not in INTENDED:
            found.append(f"{name}: passes on SGLang's module, not on the stand-in")
        if _short(results["stand-in, SGLang behaviour"].get(name, "-")) != "passed":
            found.append(f"{name}: passes on SGLang's module, not on the stand-in with SGLang's behaviour")
    return found


def table(results: dict[str, dict[str, str]], test_file: Path, release: str) -> str:
    names = list(results["sglang"])
    names += [n for t in TARGETS for n in results[t] if n not in names]
    counts = {t: sum(_short(results[t].get(n, "-")) == "passed" for n in names) for t in TARGETS}
    lines = [
        f"# SGLang's unit tests for mm_schedule: SGLang {release} vs the stand-in",
        "",
        f"Test file: `{test_file.name}` from SGLang's repository (not shipped here; sha256"
        f" `{hashlib.sha256(test_file.read_bytes()).hexdigest()[:16]}`). Produced on"
        f" {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d} by",
        f"`python benchmarks/run_sglang_unit_tests.py PATH/{test_file.name} --release {release}` on CPU"
        f" (torch {_torch_version()}, Python {sys.version.split()[0]}).",
        "",
        "| test | " + " | ".join(TARGETS) + " | note |",
        "|---|" + "---|" * len(TARGETS) + "---|",
    ]
    for name in names:
        row = [_short(results[t].get(name, "-")) for t in TARGETS]
        note = INTENDED.get(name, "")
        if results["sglang"].get(name) != "passed":
            note = f"fails on SGLang {release}'s own module: {_reason(results['sglang'].get(name, '-'))}"
        lines.append(f"| `{name}` | " + " | ".join(row) + f" | {note} |")
    lines += ["", f"Names the file's autouse fixture patches and SGLang {release} lacks are given a placeholder"
              " first, on every target alike: "
              + (", ".join(f"`{n}`" for n in _lacking(release)) or "none") + "."]
    lines += ["", "Passed: " + ", ".join(f"{t} {counts[t]} of {len(names)}" for t in TARGETS) + "."]
    bad = problems(results)
    lines += ["", "Every test that passes on SGLang's module passes on the stand-in, or is an intended difference"
              " (and passes with SGLang's behaviour)." if not bad else "Problems:\n" + "\n".join(f"* {p}" for p in bad)]
    return "\n".join(lines) + "\n"


def _lacking(release: str) -> list[str]:
    from mm_schedule.integrations.sglang.versions import profile

    return [name for name in PATCHED_BY_THE_FILE if not profile(release).has(name)]


def _torch_version() -> str:
    import torch

    return torch.__version__


def _short(outcome: str) -> str:
    return outcome.split(":", 1)[0]


def _reason(outcome: str) -> str:
    return outcome.split(":", 1)[1].strip().replace("|", "/").replace("`", "'") if ":" in outcome else outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("test_file", type=Path)
    parser.add_argument("--release", default="0.5.19")
    parser.add_argument("--out", type=Path, default=None, help="write the table here (default: print it)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("OUTCOMES " + json.dumps(_run_target(str(args.test_file.resolve()), args.release, args.child)))
        return 0
    results = run(args.test_file.resolve(), args.release)
    text = table(results, args.test_file, args.release)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 1 if problems(results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
