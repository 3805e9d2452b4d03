"""Host time of one step's multimodal gather + merge: vLLM's own code against ours, side by
side in one process, on the same inputs, on CPU with one torch thread.

vLLM runs from its official wheel (the few source files read out of it by
``_vllm_wheel.py``, heavy imports stubbed), on vLLM's own ``PlaceholderRange`` and
``MultiModalFeatureSpec`` objects:

* ``vllm-v2``: ``EncoderRunner.gather_mm_embeddings`` (model runner v2, the only runner
  from 0.34.0 on) then ``_merge_multimodal_embeddings``, from the newest release;
* ``vllm-v1``: ``GPUModelRunner._gather_mm_embeddings`` then ``_merge_multimodal_embeddings``,
  from the newest release that still has model runner v1 (0.33.0).

Ours, from the same runner state (the conversion of vLLM's structures is inside the
timed call):

* ``ours-fused``: ``plan_rows`` + ``StepRows.merge_into`` (rows written to their token
  rows, no mask);
* ``ours-drop-in``: our ``gather_mm_embeddings`` + our ``_merge_multimodal_embeddings``
  (the two drop-ins, vLLM's packed-rows-and-mask contract);
* ``copy-floor``: one ``torch.cat`` of exactly the step's rows into a buffer made
  beforehand, nothing else, for reference.

Workloads: R requests x 4 images x 64 embedding rows, hidden 64, float32, every encoder
output in the store, windows covering whole prompts (``plain``); and the same with an
``is_embed`` mask in every range (a text position after every 8 embedding positions, as
Qwen-VL-style processors lay out rows, ``is_embed``). Calls alternate between the sides
in a fresh seeded random order each round; each case's rounds are split over three
sweeps through all cases. The reported figure is each side's median thread CPU time
(``time.thread_time_ns``: on a shared machine it leaves out time spent waiting for a
core); wall-clock medians follow. Every side's ``inputs_embeds`` is compared bit for bit
with vLLM v2's before timing; any difference fails the run. Before the timing, every
release in ``SUPPORTED_RELEASES`` is loaded from its wheel and compared with ours on the
random cases of ``mm_schedule.integrations.vllm.verify``.

    python benchmarks/bench_vs_vllm.py           # full run, writes results/vs_vllm.md
    python benchmarks/bench_vs_vllm.py --quick   # fewer sizes and rounds, prints only
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import subprocess
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _vllm_wheel

import mm_schedule
from mm_schedule.integrations import vllm as ours
from mm_schedule.integrations.vllm import verify

RELEASE = "0.34.0"  # timed: the newest release
RELEASE_V1 = "0.33.0"  # the newest with model runner v1 (vllm/v1/worker/gpu_model_runner.py)
FULL_SIZES = (4, 16, 64, 256, 1024, 4096)
QUICK_SIZES = (4, 64, 1024)
ITEMS_PER_REQUEST, ROWS_PER_ITEM, HIDDEN, GAP = 4, 64, 64, 16
BREAK_EVERY = 8  # is_embed workload: one text position after this many embedding positions
SIDES = ("vllm-v2", "vllm-v1", "ours-fused", "ours-drop-in", "copy-floor")
RATIOS = (("ours-fused", "vllm-v2"), ("ours-drop-in", "vllm-v2"), ("ours-fused", "vllm-v1"))
TARGET = (1024, 4.0)  # items, ours-fused / vllm-v2 ratio to reach on the plain workload


@dataclass
class Step:
    """One step's runner state in vLLM's structures, and a fresh copy of its text rows."""

    workload: str
    n_items: int
    req_ids: list[str]
    features: dict[str, list]
    outputs: dict[str, torch.Tensor]
    scheduled: np.ndarray
    query_start_loc: np.ndarray
    prefill_lens: np.ndarray
    computed: np.ndarray
    text: torch.Tensor
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return int(self.scheduled.sum())


def build_step(code: verify.VllmCode, workload: str, n_items: int, seed: int) -> Step:
    gen = torch.Generator().manual_seed(seed)
    n_requests = max(1, n_items // ITEMS_PER_REQUEST)
    features, outputs, prompt_lens = {}, {}, []
    for r in range(n_requests):
        pos, feats = GAP, []
        for k in range(ITEMS_PER_REQUEST):
            key = f"mm-{r}-{k}"
            if workload == "is_embed":
                length = ROWS_PER_ITEM + ROWS_PER_ITEM // BREAK_EVERY
                is_embed = torch.ones(length, dtype=torch.bool)
                is_embed[BREAK_EVERY :: BREAK_EVERY + 1] = False
            else:
                length, is_embed = ROWS_PER_ITEM, None
            outputs[key] = torch.randn(ROWS_PER_ITEM, HIDDEN, generator=gen)
            feats.append(code.MultiModalFeatureSpec(data=None, modality="image", identifier=key,
                                                    mm_position=code.PlaceholderRange(pos, length, is_embed)))
            pos += length + GAP
        features[f"req-{r}"] = feats
        prompt_lens.append(pos)
    scheduled = np.array(prompt_lens, dtype=np.int32)
    query_start_loc = np.concatenate([[0], np.cumsum(scheduled)]).astype(np.int32)
    text = torch.randn(int(scheduled.sum()), HIDDEN, generator=gen)
    return Step(workload, n_requests * ITEMS_PER_REQUEST, list(features), features, outputs, scheduled,
                query_start_loc, scheduled + 1, np.zeros(n_requests, dtype=np.int32), text)


def make_sides(code: verify.VllmCode, code_v1: verify.VllmCode) -> dict:
    v2, vllm_merge = code.encoder_runner, code.merge
    v1, vllm_v1_merge = code_v1.gpu_model_runner, code_v1.merge

    def vllm_v2(step: Step, dst):
        runner = step.buffers.get("v2-runner")
        if runner is None:
            runner = step.buffers["v2-runner"] = v2.__new__(v2)
            runner.encoder_cache = types.SimpleNamespace(mm_features=step.features, encoder_outputs=step.outputs)
            runner.is_realtime = False
        embeds, mask = v2.gather_mm_embeddings(runner, step.req_ids, step.n_tokens, step.scheduled,
                                               step.query_start_loc, step.prefill_lens, step.computed)
        return vllm_merge(dst, embeds, mask)

    def vllm_v1(step: Step, dst):
        state = step.buffers.get("v1-state")
        if state is None:
            runner = v1.__new__(v1)
            requests = {r: types.SimpleNamespace(num_computed_tokens=0, mm_features=step.features[r])
                        for r in step.req_ids}
            runner.input_batch = types.SimpleNamespace(req_ids=step.req_ids)
            runner.requests, runner.encoder_cache = requests, step.outputs
            runner.is_multimodal_pruning_enabled = runner.uses_mrope = False
            output = types.SimpleNamespace(total_num_scheduled_tokens=step.n_tokens,
                                           num_scheduled_tokens=dict(zip(step.req_ids, step.scheduled.tolist())))
            state = step.buffers["v1-state"] = (runner, output)
        embeds, mask = v1._gather_mm_embeddings(*state)
        return vllm_v1_merge(dst, embeds, mask)

    def ours_fused(step: Step, dst):
        features = step.features
        rows = ours.plan_rows(step.req_ids, [features[r] for r in step.req_ids], step.computed, step.scheduled,
                              step.outputs, query_start_loc=step.query_start_loc, prefill_lens=step.prefill_lens)
        return rows.merge_into(dst)

    def ours_drop_in(step: Step, dst):
        cache = step.buffers.get("v2-cache")
        if cache is None:
            cache = step.buffers["v2-cache"] = types.SimpleNamespace(mm_features=step.features,
                                                                     encoder_outputs=step.outputs)
        embeds, mask = ours.gather_mm_embeddings(cache, step.req_ids, step.n_tokens, step.scheduled,
                                                 step.query_start_loc, step.prefill_lens, step.computed)
        return ours._merge_multimodal_embeddings(dst, embeds, mask)

    def copy_floor(step: Step, dst):
        rows = step.buffers.get("floor")
        if rows is None:
            rows = step.buffers["floor"] = torch.empty(step.n_items * ROWS_PER_ITEM, HIDDEN)
        return torch.cat(list(step.outputs.values()), out=rows)

    return {"vllm-v2": vllm_v2, "vllm-v1": vllm_v1, "ours-fused": ours_fused, "ours-drop-in": ours_drop_in,
            "copy-floor": copy_floor}


def _same_bits(a, b) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def check_step(sides: dict, step: Step) -> list[str]:
    expected = sides["vllm-v2"](step, step.text.clone())
    problems = []
    for name in ("vllm-v1", "ours-fused", "ours-drop-in"):
        got = sides[name](step, torch.full_like(step.text, float("nan")).copy_(step.text))
        if not _same_bits(got, expected):
            problems.append(f"{step.workload} {step.n_items} items: {name} leaves a different inputs_embeds than vllm-v2")
    return problems


@dataclass
class CaseTimes:
    step: Step
    cpu: dict[str, list[int]] = field(default_factory=lambda: {s: [] for s in SIDES})
    wall: dict[str, list[int]] = field(default_factory=lambda: {s: [] for s in SIDES})

    def median(self, side: str, wall: bool = False) -> float:
        return statistics.median((self.wall if wall else self.cpu)[side]) / 1e3  # µs

    def ratio(self, ours_side: str, theirs: str, wall: bool = False) -> float:
        return self.median(theirs, wall) / self.median(ours_side, wall)


def measure(sides: dict, cases: list[CaseTimes], *, passes: int, budget_s: float, min_rounds: int,
            max_rounds: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    order = list(SIDES)
    for _ in range(passes):
        for case in cases:
            dst = case.step.text.clone()  # every side rewrites the same rows: the result is the same each time
            deadline = time.perf_counter() + budget_s / passes
            rounds = 0
            while rounds < min_rounds // passes + 1 or (time.perf_counter() < deadline
                                                         and rounds < max_rounds // passes):
                rng.shuffle(order)
                for side in order:
                    fn = sides[side]
                    wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
                    fn(case.step, dst)
                    case.cpu[side].append(time.thread_time_ns() - cpu)
                    case.wall[side].append(time.perf_counter_ns() - wall)
                rounds += 1


def _fmt(us: float) -> str:
    return f"{us / 1e3:.2f} ms" if us >= 1000 else f"{us:.1f} µs"


def _table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _git(*args: str) -> str:
    root = Path(mm_schedule.__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.stdout.strip() or "?"


def report(cases: list[CaseTimes], releases: list[tuple[str, str, int, int]], wheels: list[str], stubbed: int) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", "mm_schedule", "kernels")
    lines = [
        "# vLLM's own gather + merge vs mm_schedule, side by side",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- command: `{' '.join(['python', *sys.argv])}`",
        f"- mm_schedule: commit {_git('rev-parse', '--short', 'HEAD')}"
        + (" (with uncommitted changes)" if dirty not in ("", "?") else ""),
        f"- vLLM: {' and '.join(wheels)} (official wheels; source files read out of them, see"
        f" benchmarks/_vllm_wheel.py; {stubbed} vLLM modules stubbed, import-only)",
        f"- python {platform.python_version()}, torch {torch.__version__}, {torch.get_num_threads()} torch thread(s)",
        f"- CPU: {cpu}",
        "",
        "Workload: R requests x 4 images x 64 embedding rows, hidden 64, float32, every encoder output",
        "in the store, windows over whole prompts; `is_embed`: the same rows with a text position after",
        "every 8 embedding positions of each range. Median thread CPU time per step over rounds in which",
        "the sides run in a fresh random order; every side's `inputs_embeds` equals vLLM v2's bit for bit.",
        "",
        f"Sides: `vllm-v2` = vLLM {RELEASE} EncoderRunner.gather_mm_embeddings + _merge_multimodal_embeddings;",
        f"`vllm-v1` = vLLM {RELEASE_V1} GPUModelRunner._gather_mm_embeddings + _merge_multimodal_embeddings (model",
        f"runner v1 is gone from {RELEASE} on);",
        "`ours-fused` = plan_rows + StepRows.merge_into (from the same runner state, conversion included);",
        "`ours-drop-in` = our gather_mm_embeddings + our _merge_multimodal_embeddings; `copy-floor` = one",
        "torch.cat of exactly the step's rows into a ready buffer, nothing else.",
        "",
        "## Host CPU time per step (median; µs per item in parentheses)",
        "",
    ]
    headers = ["workload", "items", "rounds", *SIDES, *(f"{o} / {t}" for o, t in RATIOS)]
    rows = []
    for case in cases:
        n = case.step.n_items
        rows.append([case.step.workload, n, len(case.cpu[SIDES[0]]),
                     *(f"{_fmt(case.median(s))} ({case.median(s) / n:.2f})" for s in SIDES),
                     *(f"{case.ratio(o, t):.2f}x" for o, t in RATIOS)])
    lines += [_table(headers, rows), "", "## Wall-clock time per step (median)", ""]
    rows = [[c.step.workload, c.step.n_items, len(c.cpu[SIDES[0]]), *(_fmt(c.median(s, True)) for s in SIDES),
             *(f"{c.ratio(o, t, True):.2f}x" for o, t in RATIOS)] for c in cases]
    lines += [_table(headers, rows), ""]
    target = next((c for c in cases if c.step.workload == "plain" and c.step.n_items == TARGET[0]), None)
    if target is not None:
        got = target.ratio("ours-fused", "vllm-v2")
        lines += [f"Target: ours-fused >= {TARGET[1]:.0f}x vllm-v2 at {TARGET[0]} items (plain): {got:.2f}x,"
                  f" {'met' if got >= TARGET[1] else 'NOT met'}.", ""]
    lines += ["## Releases compared with ours (mm_schedule.integrations.vllm.verify cases)", "",
              _table(["vLLM", "runners", "cases", "differences"], [list(r) for r in releases]), ""]
    return "\n".join(lines)


def verify_releases(n_cases: int) -> list[tuple[str, str, int, int]]:
    rows = []
    for version in ours.SUPPORTED_RELEASES:
        release = _vllm_wheel.load_release(version)
        code = verify.from_modules(version, release.modules)
        n, problems = verify.run_cases(code, n_cases)
        runners = ", ".join(name for name, cls in (("v2", code.encoder_runner), ("v1", code.gpu_model_runner)) if cls)
        rows.append((version, runners, n, len(problems)))
        print(f"vLLM {version} ({runners}): {n} cases, {len(problems)} differences", flush=True)
        for line in problems[:5]:
            print("  ", line)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="sizes 4, 64, 1024, few rounds; prints, writes no file")
    parser.add_argument("--write", action="store_true", help="write the results file even with --quick")
    parser.add_argument("--sizes", type=int, nargs="+", metavar="N")
    parser.add_argument("--budget", type=float, metavar="S", help="seconds of rounds per case")
    parser.add_argument("--verify-cases", type=int, default=200, metavar="N", help="cases per supported release")
    parser.add_argument("--output", type=Path, default=Path(__file__).resolve().parent / "results" / "vs_vllm.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        release = _vllm_wheel.load_release(RELEASE, allow_full_download=True)
        release_v1 = _vllm_wheel.load_release(RELEASE_V1, allow_full_download=True)
        verified = verify_releases(20 if args.quick else args.verify_cases)
    except _vllm_wheel.WheelUnavailable as exc:
        print(f"cannot load vLLM: {exc}", file=sys.stderr)
        return 2
    if any(r[3] for r in verified):
        print("a release differs from ours; no timing", file=sys.stderr)
        return 1
    code = verify.from_modules(RELEASE, release.modules)
    sides = make_sides(code, verify.from_modules(RELEASE_V1, release_v1.modules))
    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    cases = [CaseTimes(build_step(code, w, n, seed=n)) for w in ("plain", "is_embed") for n in sizes]
    problems = [p for case in cases for p in check_step(sides, case.step)]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    budget = args.budget or (0.6 if args.quick else 6.0)
    min_rounds, max_rounds = (3, 30) if args.quick else (9, 300)
    gc.collect()
    measure(sides, cases, passes=3, budget_s=budget, min_rounds=min_rounds, max_rounds=max_rounds)
    problems = [p for case in cases for p in check_step(sides, case.step)]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    text = report(cases, verified, [release.wheel, release_v1.wheel], len(release.stubbed))
    print(text)
    if not args.quick or args.write:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
