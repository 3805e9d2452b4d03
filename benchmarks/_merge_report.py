"""Turns the merge benchmark's records into the committed result files.

``kernels_<device>.md`` (tables a reviewer reads), ``.json`` (every number, for diffs
between runs) and ``.png`` (GB/s per case and path, when matplotlib is installed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import _common as C

CHUNK_CASE = "qwen2.5vl7b-chunk8192"
ONE_IMAGE_CASE = "llava1.5-1img"
PLANNED = "ours-planned"


@dataclass
class RunReport:
    env: dict
    gpu: bool
    copy_gbps: float | None = None
    empty_launch: dict | None = None
    sync_selftest: str = "n/a"
    copy_same_bytes_us: dict = field(default_factory=dict)  # case -> torch copy of its ideal bytes
    cases: list = field(default_factory=list)  # the Case objects measured so far
    records: list[dict] = field(default_factory=list)
    sweep: dict | None = None
    graph_check: dict | None = None
    notes: list[str] = field(default_factory=list)

    # -- derived numbers ----------------------------------------------------------------

    def attach_ratios(self) -> None:
        ours = {(r["case"], r["op"]): r for r in self.records if r["path"] == "ours" and "time_us" in r}
        for r in self.records:
            base = ours.get((r["case"], r["op"]))
            if "time_us" in r and base:
                r["vs_ours"] = r["time_us"] / base["time_us"]
            copy_us = self.copy_same_bytes_us.get(r["case"])
            if "time_us" in r and copy_us:
                # The same bytes copied by torch over this path's time: 100% is copy speed.
                r["pct_copy_bw"] = 100 * copy_us / r["time_us"]

    def _find(self, case: str, op: str, path: str) -> dict | None:
        return next((r for r in self.records if (r["case"], r["op"], r["path"]) == (case, op, path)), None)

    def targets(self) -> list[tuple[str, str, str]]:
        """The benchmark targets: what was measured and whether it was met. Each is judged
        on the path it is about: bandwidth and the speed-up on the planned launch
        (``plan_segments`` once, ``run_segments`` timed), the one-image latency on
        ``run_segments``'s host wall time, syncs on every path of ours."""
        if not self.gpu:
            return [("all targets", "CPU smoke run: the timing targets apply to GPUs only", "n/a")]
        rows = []
        moved = {c.name: c.ideal_bytes for c in self.cases}
        planned = [r for r in self.records if r["path"] == PLANNED and "pct_copy_bw" in r]
        big = [r for r in planned if moved[r["case"]] >= 32 * C.MiB]
        if big:
            worst = min(big, key=lambda r: r["pct_copy_bw"])
            rows.append(("≥ 85% of copy bandwidth when ≥ 32 MiB move: run_segments vs torch copying the same bytes "
                         f"(gather and merge, {len(big)} measurements)",
                         f"lowest {worst['pct_copy_bw']:.1f}% ({worst['case']}, {worst['op']}: "
                         f"{worst['time_us']:.1f} µs vs copy {self.copy_same_bytes_us[worst['case']]:.1f} µs)",
                         _verdict(worst["pct_copy_bw"] >= 85)))
        else:
            rows.append(("≥ 85% of copy bandwidth when ≥ 32 MiB move", "no such case measured", "n/a"))

        peer, mine = self._find(CHUNK_CASE, "merge", "masked_scatter"), self._find(CHUNK_CASE, "merge", PLANNED)
        if peer and mine and "time_us" in peer and "time_us" in mine:
            ratio = peer["time_us"] / mine["time_us"]
            rows.append(("≥ 2× cat + masked_scatter_ on an 8192-row bf16 chunk, H 3584 (merge, run_segments, "
                         "device time)",
                         f"{ratio:.2f}× ({peer['time_us']:.1f} µs vs {mine['time_us']:.1f} µs)", _verdict(ratio >= 2)))
        else:
            rows.append(("≥ 2× cat + masked_scatter_ on the 8192-row chunk", "not measured", "n/a"))

        one = self._find(ONE_IMAGE_CASE, "merge", PLANNED)
        if self.empty_launch and one and "wall_us" in one:
            ratio = one["wall_us"] / self.empty_launch["wall_us"]
            rows.append(("one image within 1.5× of an empty Triton launch (run_segments, host wall per call)",
                         f"{one['wall_us']:.1f} µs vs {self.empty_launch['wall_us']:.1f} µs = {ratio:.2f}×",
                         _verdict(ratio <= 1.5)))
        else:
            rows.append(("one image within 1.5× of an empty Triton launch", "not measured", "n/a"))

        counted = [r for r in self.records if r["ours"] and r.get("host_syncs") is not None]
        synced = [r for r in counted if r["host_syncs"]]
        listed = ", ".join(f"{r['case']}/{r['op']}/{r['path']}={r['host_syncs']}" for r in synced[:6])
        rows.append(("zero host syncs (every case, every path of ours)",
                     f"{len(synced)} of {len(counted)} measured calls synced" + (f": {listed}" if listed else ""),
                     _verdict(bool(counted) and not synced)))
        return rows

    def skipped(self) -> list[str]:
        return [f"{r['case']}/{r['op']}/{r['path']}" for r in self.records if "skipped" in r]

    def failures(self) -> list[str]:
        wrong = [f"{r['case']}/{r['op']}/{r['path']}: {r.get('error', 'wrong')}"
                 for r in self.records if "skipped" not in r and not r.get("bit_exact")]
        for check in (self.sweep, self.graph_check):
            if check:
                wrong += check["failures"]
        return wrong

    # -- files --------------------------------------------------------------------------

    def write(self, out_dir: Path, *, plot: bool) -> Path:
        """Write .md and .json (and the .png when ``plot``); return the .md path."""
        self.attach_ratios()
        out_dir.mkdir(parents=True, exist_ok=True)
        label = C.file_label(self.env["device"]) if self.gpu else "cpu-smoke"
        stem = out_dir / f"kernels_{label}"
        notes = list(self.notes)
        if plot:
            why_not = write_plot(stem.with_suffix(".png"), self.records, self.copy_gbps, self.env["device"])
            if why_not:
                notes.append(why_not)
        stem.with_suffix(".md").write_text(self.markdown(notes))
        stem.with_suffix(".json").write_text(json.dumps({
            "environment": self.env, "copy_gbps": self.copy_gbps, "empty_launch": self.empty_launch,
            "sync_selftest": self.sync_selftest, "copy_same_bytes_us": self.copy_same_bytes_us,
            "targets": self.targets(), "records": self.records,
            "sweep": self.sweep, "graph_check": self.graph_check, "notes": notes,
        }, indent=1, default=str))
        return stem.with_suffix(".md")

    def markdown(self, notes: list[str]) -> str:
        env = self.env
        lines = [f"# Segment gather and embedding merge: {env['device']}", ""]
        if not self.gpu:
            lines += ["**CPU smoke run** (tiny shapes, every path on the CPU): shows that each path runs and is "
                      "bit-exact; its times say nothing about GPU performance.", ""]
        device = env["device"]
        if self.gpu:
            device += (f" ({env.get('arch', '?')}, {env.get('multiprocessors', '?')} SMs/CUs, "
                       f"{env.get('memory_gib', '?')} GiB, L2 {env.get('l2_mib', '?')} MiB)")
        runtime = f"CUDA {env['cuda']}" if env.get("cuda") else f"HIP {env['hip']}" if env.get("hip") else "cpu"
        launch = self.empty_launch
        lines += [C.markdown_table(["run", ""], [
            ("date", env["date_utc"]),
            ("command", f"`{env['command']}`"),
            ("device", device),
            ("torch / triton / python", f"{env['torch']} / {env['triton']} / {env['python']}"),
            ("runtime", runtime),
            ("kernel backend", env.get("kernel_backend", "?")),
            ("kernel configs", env.get("config_dir", "?")),
            ("measured copy bandwidth",
             f"{self.copy_gbps:.0f} GB/s (`dst.copy_(src)` on 1 GiB, read + write)" if self.copy_gbps else "n/a"),
            ("empty Triton launch",
             f"{launch['wall_us']:.2f} µs host wall per launch, {launch['device_us']:.2f} µs device" if launch else "n/a"),
            ("sync counter self-check", self.sync_selftest),
        ]), ""]
        lines += ["## Targets", "", C.markdown_table(["target", "measured", "verdict"], self.targets()), ""]
        lines += ["## Results", "", RESULT_LEGEND, "", C.markdown_table(RESULT_HEADERS, [_row(r) for r in self.records]), ""]
        uncaptured = sorted({(r["path"], r["graph"]) for r in self.records if "graph" in r})
        if uncaptured:
            lines += ["Not timed in a CUDA graph: " + "; ".join(f"{p} ({why})" for p, why in uncaptured) + ".", ""]
        lines += ["## Cases", "", C.markdown_table(
            ["case", "shape from", "H", "dtype", "items", "multimodal rows", "tokens", "MiB moved"],
            [(c.name, c.model, c.hidden, f"{c.src_dtype}→{c.dtype}" if c.src_dtype else c.dtype, len(c.items),
              c.mm_rows, c.tokens, f"{c.ideal_bytes / C.MiB:.1f}") for c in self.cases]), ""]
        lines += ["## What each path mirrors", "", C.markdown_table(
            ["op", "path", "mirrors"], list(dict.fromkeys((r["op"], r["path"], r["mirrors"]) for r in self.records))), ""]
        for title, check in (("Correctness sweep (ours vs reference, random tables, poisoned outputs)", self.sweep),
                             ("CUDA-graph replay check (planned path, sources changed between replays)",
                              self.graph_check)):
            if check is not None:
                lines += [f"## {title}", "", f"{check['summary']}: {len(check['failures'])} failures.", ""]
                lines += [f"- {f}" for f in check["failures"][:20]] + ([""] if check["failures"] else [])
        lines += ["## How it was measured", "", *METHOD, ""]
        if notes:
            lines += ["## Notes", "", *[f"- {n}" for n in notes], ""]
        return "\n".join(lines)


RESULT_LEGEND = (
    "time = median device time per call (µs); wall = host wall time per call, back to back; graph = device time "
    "per call inside a CUDA graph; GB/s = ideal bytes (multimodal rows read once + written once) / time; "
    "% copy BW = device time of torch copying the same bytes (`dst.copy_(src)`, cold) / this path's time; "
    "÷ ours = this path's time / ours (API) time, above 1 means ours is faster; transient = peak device memory "
    "beyond the call's own new output; host syncs = blocking device syncs during one call."
)
RESULT_HEADERS = ["case", "op", "path", "time µs", "wall µs", "graph µs", "GB/s", "% copy BW", "÷ ours",
                  "transient", "host syncs", "bit-exact"]

METHOD = [
    "- Correctness first: each path runs once on buffers whose multimodal rows (or whole packed output) are "
    "NaN-poisoned, and its output is compared bit for bit with an independent reference (one long-index gather "
    "over all sources laid end to end). A path that differs is listed as wrong and not timed.",
    "- Device time: CUDA events around each call. Before each call a scratch buffer of twice the last-level "
    "cache is overwritten and a spin kernel (`torch.cuda._sleep`) keeps the device busy while the host queues "
    "the call, so the events bracket device work, not Python; a path that syncs the host still pays for it, "
    "because what follows the sync cannot be queued before the device drains. Calls rotate over enough copies "
    "of the inputs (each image its own allocation) to cover 3× the cache. Median of the repeats.",
    "- Wall: host time per call for back-to-back calls, launch and Python overhead included (what a serving "
    "loop pays when the call is small).",
    "- Graph: one CUDA graph holding one call per rotation set, replayed with the scratch buffer overwritten "
    "before each replay; median replay time / calls. Only for "
    "paths that neither sync nor stage host data per call; a failed capture is reported.",
    "- Copy bandwidth: median of `dst.copy_(src)` over 1 GiB, counted as bytes read + bytes written (shown "
    "above). The % copy BW column and the bandwidth target compare each path with torch copying, with the "
    "same timer and cold caches, the bytes that case moves (half of its ideal bytes, read and written once).",
    "- Transient memory: `torch.cuda.max_memory_allocated` during one call minus memory allocated before it, "
    "minus the call's own new output (the packed tensor of `torch.cat`, HF's out-of-place result).",
    "- Host syncs: one call under `torch.cuda.set_sync_debug_mode(\"warn\")`. Torch sends every operation that "
    "blocks the host on the device (stream/device/event synchronize, `.item()`, the `nonzero` inside boolean "
    "indexing, blocking copies between host and device) through one hook that then warns; the warnings are "
    "caught and counted. The self-check above shows the counter sees a known `.item()` and ignores an "
    "in-place add. Triton's launcher does not synchronise.",
]


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _fmt(value, spec: str, missing: str = "—") -> str:
    return missing if value is None else format(value, spec)


def _row(r: dict) -> tuple:
    if "skipped" in r:
        return (r["case"], r["op"], r["path"], r["skipped"], *["—"] * 7, "not run")
    graph = _fmt(r.get("graph_us"), ".1f", "no" if "graph" in r else "—")
    return (
        r["case"], r["op"], f"**{r['path']}**" if r["ours"] else r["path"],
        _fmt(r.get("time_us"), ".1f", r.get("error", "—")), _fmt(r.get("wall_us"), ".1f"), graph,
        _fmt(r.get("gbps"), ".0f" if r.get("gbps", 0) >= 100 else ".3g"), _fmt(r.get("pct_copy_bw"), ".1f"), _fmt(r.get("vs_ours"), ".2f"),
        C.human_bytes(r.get("transient_bytes")) if "host_syncs" in r else "—",
        _fmt(r.get("host_syncs"), "d", "n/a" if "host_syncs" in r else "—"),
        "yes" if r.get("bit_exact") else "**NO**",
    )


def write_plot(path: Path, records: list[dict], copy_gbps: float | None, title: str) -> str | None:
    """A PNG of GB/s per case and path; returns why not when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no PNG written"
    fig, axes = plt.subplots(2, 1, figsize=(15, 10))
    for ax, op in zip(axes, ("gather", "merge")):
        rows = [r for r in records if r["op"] == op and "gbps" in r]
        cases = list(dict.fromkeys(r["case"] for r in rows))
        paths = list(dict.fromkeys(r["path"] for r in rows))
        width = 0.8 / max(len(paths), 1)
        for j, name in enumerate(paths):
            values = [next((r["gbps"] for r in rows if r["case"] == c and r["path"] == name), 0) for c in cases]
            ax.bar([i + j * width for i in range(len(cases))], values, width, label=name)
        if copy_gbps:
            ax.axhline(copy_gbps, color="black", linestyle="--", linewidth=1, label="measured copy_ bandwidth")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))])
        ax.set_xticklabels(cases, rotation=25, ha="right", fontsize=8)
        ax.set_ylabel("GB/s (ideal bytes / device time)")
        ax.set_title(f"{op}: {title}")
        ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
