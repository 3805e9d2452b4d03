"""Ahead-of-time compilation specs: what ``triton.compile`` needs to build each kernel
without a GPU, for the AOT tests and the tuner.

``registry`` names every JIT function; ``aot_specs(kernel, ...)`` returns the
signature, constexprs and divisibility attributes of each variant the launchers can pick
for one (dtype, hidden, aligned, config): exactly the specialisation the JIT would make
at run time, so the compiled code is the code that runs. Compile one with::

    from triton.compiler import ASTSource
    from triton.backends.compiler import GPUTarget
    spec = aot_specs("segment_gather", dtype=torch.bfloat16, hidden=4096, aligned=True, config=cfg)[0]
    triton.compile(spec.source(), target=GPUTarget("cuda", 90, 32), options=spec.options)

Needs a real ``triton.jit`` (not ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import KernelInputError
from ..dtypes import KERNEL_DTYPES, dtype_name, kernel_dtype, vector_width
from ..launch_config import CONFIG_KEYS, heuristic_config, unaligned_config, validate_config
from ..registry import KERNEL_NAMES, kernel_entry

_DIVISIBLE = [["tt.divisibility", 16]]


@dataclass(frozen=True)
class AotSpec:
    kernel: str
    variant: str
    fn: object
    signature: dict
    constexprs: dict
    attrs: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)

    def source(self):
        from triton.compiler import ASTSource

        return ASTSource(self.fn, self.signature, self.constexprs, self.attrs)


def _type(dtype) -> str:
    return "*" + kernel_dtype(dtype).short


def _divisibility(fn, names) -> dict:
    return {(fn.arg_names.index(n),): _DIVISIBLE for n in names}


@dataclass(frozen=True)
class Variant:
    """What every kernel's variants share for one (dtypes, hidden, aligned, config)."""

    kernel: str
    fn: object
    dtype: object  # destination
    src_dtype: object
    hidden: int
    aligned: bool
    config: dict  # what the launch uses (``unaligned_config`` applied when unaligned)
    vec: int  # elements per access the row length is counted in (1 when unaligned)

    @property
    def name(self) -> str:
        return "aligned" if self.aligned else "unaligned"

    @property
    def blocks(self) -> dict:
        return {"BLOCK_M": self.config["BLOCK_M"], "BLOCK_H": self.config["BLOCK_H"], "VEC": self.vec}

    def spec(self, name: str, signature: dict, constexprs: dict, divisible: list) -> AotSpec:
        signature = {**signature, **dict.fromkeys(constexprs, "constexpr")}
        options = {"num_warps": self.config["num_warps"], "num_stages": self.config["num_stages"]}
        return AotSpec(
            self.kernel, name, self.fn, signature, constexprs,
            _divisibility(self.fn, divisible), options,
        )  # fmt: skip


def aot_specs(
    kernel: str, *, dtype, hidden: int, aligned: bool, config: dict, src_dtype=None
) -> list[AotSpec]:
    """Every compile-time variant of ``kernel`` for these parameters (the kernel's
    ``registry`` entry names the builder that knows its signature).

    ``dtype`` is the destination dtype, ``src_dtype`` the sources' (default: the same).
    ``aligned`` selects the 16-byte specialisation; it requires ``hidden`` to be a
    multiple of the vector width, as the launchers do.
    """
    entry = kernel_entry(kernel)
    config = validate_config(config)
    if not aligned:
        config = unaligned_config(config)
    src_dtype = src_dtype or dtype
    vec = vector_width(dtype.itemsize, src_dtype.itemsize)
    if aligned and hidden % vec:
        raise KernelInputError(
            f"hidden={hidden} is not a multiple of {vec}: no aligned variant exists"
        )
    variant = Variant(
        kernel, entry.jit(), dtype, src_dtype, hidden, aligned, config, vec if aligned else 1
    )
    return SPEC_BUILDERS[entry.name](variant)


def segment_gather_specs(v: Variant) -> list[AotSpec]:
    """Both launch forms: through the segment table, and one segment passed as arguments."""
    from .._triton import tl_dtype

    specs = []
    for one_segment in (False, True):
        signature = {
            "table_ptr": "constexpr" if one_segment else "*i64",
            "dst_ptr": _type(v.dtype),
            "hidden_vecs": "i32",
            "seg_src": "i64" if one_segment else "i32",
            "seg_dst_row": "i32",
            "seg_rows": "i32",
        }
        constexprs = {
            "SRC_DTYPE": tl_dtype(v.src_dtype),
            **v.blocks,
            "EVEN_H": v.hidden % v.config["BLOCK_H"] == 0,
            "ONE_SEGMENT": one_segment,
        }
        divisible = ["dst_ptr"] if v.aligned else []
        if one_segment:
            constexprs["table_ptr"] = None
        else:
            divisible.append("table_ptr")
        name = v.name + ("-one" if one_segment else "")
        specs.append(v.spec(name, signature, constexprs, divisible))
    return specs


def placeholder_merge_specs(v: Variant) -> list[AotSpec]:
    """The merge into ``input_embeds`` and the fused text-embedding lookup."""
    specs = []
    for lookup_text in (False, True):
        signature = {
            "ids_ptr": "*i64",
            "is_mm_ptr": "*u8",
            "mm_count_ptr": "*i64",
            "weight_ptr": _type(v.dtype if lookup_text else v.src_dtype),
            "mm_ptr": _type(v.src_dtype),
            "out_ptr": _type(v.dtype),
            "n_tokens": "i32",
            "vocab": "i32",
            "n_mm": "i32",
            "hidden_vecs": "i32",
        }
        constexprs = {"LOOKUP_TEXT": lookup_text, **v.blocks,
                      "EVEN_H": v.hidden % v.config["BLOCK_H"] == 0}
        divisible = ["ids_ptr", "is_mm_ptr", "mm_count_ptr"]
        if v.aligned:
            divisible += ["weight_ptr", "mm_ptr", "out_ptr"]
        name = f"{v.name}-{'lookup' if lookup_text else 'merge'}"
        specs.append(v.spec(name, signature, constexprs, divisible))
    return specs


SPEC_BUILDERS = {"segment_gather": segment_gather_specs, "placeholder_merge": placeholder_merge_specs}


def placeholder_mask_specs() -> list[AotSpec]:
    """The placeholder mask's kernel (``placeholder_mask.py``; untuned, so outside the
    registry's per-config specs): int64 and int32 tokens against int64 and int32 ids, with
    every pointer 16-byte aligned and with none, as its launcher specialises them."""
    from ..placeholder_mask import BLOCK_IDS, BLOCK_TOKENS, NUM_WARPS, placeholder_mask_kernel

    specs = []
    for tokens in ("*i64", "*i32"):
        for ids in ("*i64", "*i32"):
            for aligned in (True, False):
                signature = {"tokens_ptr": tokens, "ids_ptr": ids, "out_ptr": "*u8", "n_tokens": "i32",
                             "n_ids": "i32", "BLOCK_T": "constexpr", "BLOCK_I": "constexpr"}
                divisible = ["tokens_ptr", "ids_ptr", "out_ptr"] if aligned else []
                specs.append(AotSpec(
                    "placeholder_mask", f"{tokens[1:]}-{ids[1:]}-{'aligned' if aligned else 'unaligned'}",
                    placeholder_mask_kernel, signature, {"BLOCK_T": BLOCK_TOKENS, "BLOCK_I": BLOCK_IDS},
                    _divisibility(placeholder_mask_kernel, divisible), {"num_warps": NUM_WARPS, "num_stages": 1},
                ))
    return specs


# --- compiling and inspecting (the AOT tests and ``python -m mm_schedule.kernels.tools.aot``) ---

TARGETS = {
    "sm80": ("cuda", 80, 32),
    "sm90": ("cuda", 90, 32),
    "gfx90a": ("hip", "gfx90a", 64),
    "gfx942": ("hip", "gfx942", 64),
    "gfx950": ("hip", "gfx950", 64),
}
_PTX_V4_LOAD = re.compile(r"\bld\.global(?:\.\w+)*\.v4\.(?:b32|u32|f32|b64)")
_PTX_V4_STORE = re.compile(r"\bst\.global(?:\.\w+)*\.v4\.(?:b32|u32|f32|b64)")
_GCN_X4_LOAD = re.compile(r"\b(?:global|buffer)_load_dwordx4\b")
_GCN_X4_STORE = re.compile(r"\b(?:global|buffer)_store_dwordx4\b")


def _cuobjdump(cubin: bytes, flag: str) -> str:
    """``cuobjdump FLAG`` of a cubin, with the ``cuobjdump`` that ships in the triton wheel."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run(
            [str(tool), flag, str(path)], capture_output=True, text=True, check=True
        ).stdout


def sass(compiled) -> str:
    """The SASS of an NVIDIA compile (what the GPU runs; ``asm.sass_loops`` reads it)."""
    return _cuobjdump(compiled.asm["cubin"], "-sass")


def _cuda_spill_bytes(cubin: bytes) -> int:
    """Spill traffic (STACK + LOCAL bytes) from ``cuobjdump --dump-resource-usage``."""
    text = _cuobjdump(cubin, "--dump-resource-usage")
    usage = re.findall(r"\b(STACK|LOCAL):(\d+)", text)
    if not usage:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{text}")
    return sum(int(n) for _, n in usage)


def _amd_spill_bytes(amdgcn: str) -> int:
    counts = re.findall(r"(?:vgpr_spill_count|sgpr_spill_count|ScratchSize):\s*(\d+)", amdgcn)
    if not counts:
        raise RuntimeError("the AMDGCN text has no spill or scratch counters")
    return sum(int(n) for n in counts)


def compile_for(spec: AotSpec, target: str):
    """``triton.compile`` of one spec for a named target (``TARGETS``)."""
    import triton
    from triton.backends.compiler import GPUTarget

    return triton.compile(spec.source(), target=GPUTarget(*TARGETS[target]), options=spec.options)


def assembly(compiled) -> str:
    """The PTX of an NVIDIA compile, the AMDGCN of an AMD one."""
    return compiled.asm["ptx"] if "ptx" in compiled.asm else compiled.asm["amdgcn"]


def compile_spec(spec: AotSpec, target: str) -> dict:
    """Compile one spec for a named target and report what the AOT tests check."""
    start = time.perf_counter()
    compiled = compile_for(spec, target)
    seconds = time.perf_counter() - start
    if "ptx" in compiled.asm:
        text = compiled.asm["ptx"]
        v4_load, v4_store = bool(_PTX_V4_LOAD.search(text)), bool(_PTX_V4_STORE.search(text))
        spills = _cuda_spill_bytes(compiled.asm["cubin"])
    else:
        text = compiled.asm["amdgcn"]
        v4_load, v4_store = bool(_GCN_X4_LOAD.search(text)), bool(_GCN_X4_STORE.search(text))
        spills = _amd_spill_bytes(text)
    return {
        "vector_load": v4_load,
        "vector_store": v4_store,
        "spill_bytes": spills,
        "seconds": seconds,
    }


def _find_configs(node, path=()):
    if isinstance(node, dict):
        if all(k in node for k in CONFIG_KEYS):
            yield path, node
            return
        for key, value in node.items():
            yield from _find_configs(value, (*path, str(key)))
    elif isinstance(node, list):
        for value in node:
            yield from _find_configs(value, path)


def shipped_configs(config_dir: Path | None = None) -> list[tuple[str, str, int, dict, str]]:
    """``(kernel, dtype name, hidden, config, file)`` for every distinct config in the
    shipped JSON tables (``configs/<kernel>/*.json``, laid out as ``tuned_configs.py`` describes:
    ``configs -> dtype -> hidden -> rows -> config``). The dtype and hidden size come
    from the keys above each config (bfloat16 and 4096 when they cannot be read)."""
    config_dir = config_dir or Path(__file__).resolve().parent.parent / "configs"
    found = {}
    for path in sorted(config_dir.glob("*/*.json")):
        kernel = path.parent.name
        if kernel not in KERNEL_NAMES:
            continue
        for keys, config in _find_configs(json.loads(path.read_text())):
            dtype, hidden = "bfloat16", 4096
            for i, key in enumerate(keys):
                if key in KERNEL_DTYPES:
                    dtype = key
                    if i + 1 < len(keys) and keys[i + 1].isdigit():
                        hidden = int(keys[i + 1])
            cfg = {k: config[k] for k in CONFIG_KEYS}
            found.setdefault(
                (kernel, dtype, hidden, tuple(cfg.items())), (kernel, dtype, hidden, cfg, str(path))
            )
    return list(found.values())


def default_cases() -> list[dict]:
    """The heuristic configs (what runs when no table matches): every kernel and dtype,
    aligned at the smallest, a common and the largest supported hidden size, unaligned
    and casting variants once each."""
    import torch

    # (dtype, source dtype, hidden, aligned, rows) per kernel: every dtype at three sizes,
    # then one casting and one unaligned variant.
    shapes = [(dtype, dtype, hidden, True, rows)
              for dtype in (torch.bfloat16, torch.float16, torch.float32)
              for hidden, rows in ((64, 64), (4096, 16384), (16384, 1024))]
    shapes += [(torch.bfloat16, torch.float32, 3584, True, 8192), (torch.bfloat16, torch.bfloat16, 1001, False, 8192)]
    cases = [dict(kernel=kernel, dtype=dtype, src_dtype=src_dtype, hidden=hidden, aligned=aligned, n_rows=rows)
             for kernel in KERNEL_NAMES for dtype, src_dtype, hidden, aligned, rows in shapes]
    unique = {}
    for case in cases:
        case["config"] = heuristic_config(
            case["kernel"], dtype=case["dtype"], hidden=case["hidden"], n_rows=case.pop("n_rows")
        )
        case["origin"] = "heuristic"
        # Same config and same specialisation compile to the same code: keep one.
        key = (
            case["kernel"],
            case["dtype"],
            case["src_dtype"],
            case["aligned"],
            case["hidden"] % 16 == 0,
            tuple(case["config"].items()),
        )
        unique.setdefault(key, case)
    return list(unique.values())


def all_cases(config_dir: Path | None = None) -> list[dict]:
    import torch

    cases = default_cases()
    for kernel, dtype, hidden, config, path in shipped_configs(config_dir):
        torch_dtype = getattr(torch, dtype)
        aligned = hidden % vector_width(torch_dtype.itemsize) == 0
        cases.append(
            dict(
                kernel=kernel,
                dtype=torch_dtype,
                src_dtype=torch_dtype,
                hidden=hidden,
                aligned=aligned,
                config=config,
                origin=path,
            )
        )
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="AOT-compile every kernel variant and config for GPU targets."
    )
    parser.add_argument(
        "--targets",
        default=",".join(TARGETS),
        help="comma-separated subset of " + ",".join(TARGETS),
    )
    parser.add_argument(
        "--config-dir", type=Path, default=None, help="folder of <kernel>/<device>.json tables"
    )
    args = parser.parse_args(argv)
    json.dump(list(compile_reports(all_cases(args.config_dir), args.targets.split(","))), sys.stdout)
    return 0


def compile_reports(cases: list[dict], targets: list[str]):
    """``compile_spec``'s report for every spec of every case and target, one at a time
    (the GPU check writes each as it comes)."""
    for case in cases:
        specs = aot_specs(
            case["kernel"],
            dtype=case["dtype"],
            hidden=case["hidden"],
            aligned=case["aligned"],
            config=case["config"],
            src_dtype=case["src_dtype"],
        )
        for spec in specs:
            for target in targets:
                report = compile_spec(spec, target)
                report.update(
                    kernel=spec.kernel,
                    variant=spec.variant,
                    target=target,
                    hidden=case["hidden"],
                    dtype=dtype_name(case["dtype"]),
                    src_dtype=dtype_name(case["src_dtype"]),
                    aligned=case["aligned"],
                    config=case["config"],
                    origin=case["origin"],
                )
                yield report


if __name__ == "__main__":
    sys.exit(main())
