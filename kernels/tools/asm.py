"""Reading compiled kernels: which global accesses, loops and instructions PTX, SASS or
AMDGCN text holds. Used by the AOT tests to assert the code the kernels compile to
(vector width, waits in a loop, native conversions, the segment search) without a GPU.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import NamedTuple

_PTX_ACCESS = re.compile(r"\b(ld|st)\.global((?:\.[a-z0-9]+)*)")
_GCN_ACCESS = re.compile(r"\b(?:global|buffer|flat)_(load|store)_(\w+)")
_PTX_INSTRUCTION = re.compile(r"^\s+(?:@!?%p\d+\s+)?([a-z][a-z0-9]*)((?:\.[a-z0-9]+)*)", re.M)
_GCN_INSTRUCTION = re.compile(r"^\s+([sv]_[a-z0-9_]+|global_[a-z0-9_]+|buffer_[a-z0-9_]+)", re.M)
_LABEL = re.compile(r"^(\$L__BB\d+_\d+|\.LBB\d+_\d+):", re.M)
_BRANCH = re.compile(r"\b(?:bra(?:\.uni)?|s_branch|s_cbranch_\w+)\s+(\$L__BB\d+_\d+|\.LBB\d+_\d+)")


def is_ptx(text: str) -> bool:
    return re.search(r"^\.target\s+sm_", text, re.M) is not None


def global_accesses(text: str) -> Counter:
    """``(kind, width)`` -> count, kind ``"load"``/``"store"``; width in bits per
    instruction (128 for a 16-byte vector access)."""
    counts: Counter = Counter()
    if is_ptx(text):
        for op, suffix in _PTX_ACCESS.findall(text):
            parts = suffix.split(".")
            lanes = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d", p)), 1)
            bits = next((int(p[1:]) for p in parts if re.fullmatch(r"[bsuf]\d+", p)), 0)
            counts[("load" if op == "ld" else "store", lanes * bits)] += 1
        return counts
    widths = {"dwordx4": 128, "b128": 128, "dwordx3": 96, "dwordx2": 64, "b64": 64, "dword": 32,
              "b32": 32, "ushort": 16, "short": 16, "short_d16": 16, "short_d16_hi": 16, "b16": 16,
              "ubyte": 8, "sbyte": 8, "byte": 8, "b8": 8}  # fmt: skip
    for op, suffix in _GCN_ACCESS.findall(text):
        counts[(op, widths.get(suffix, -1))] += 1
    return counts


def instructions(text: str) -> Counter:
    """Opcode (with its PTX modifiers, e.g. ``cvt.rn.bf16x2.f32``) -> count."""
    if is_ptx(text):
        return Counter(op + mods for op, mods in _PTX_INSTRUCTION.findall(text))
    return Counter(_GCN_INSTRUCTION.findall(text))


def waits_before_stores(body: str) -> list[str]:
    """For each global store in AMDGCN ``body``, the ``s_waitcnt`` operand issued last
    before it (``"vmcnt(0)"`` waits for every load in flight), or ``""`` if none."""
    waits, last = [], ""
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("s_waitcnt"):
            last = line.removeprefix("s_waitcnt").strip()
        elif line.startswith(("global_store", "buffer_store")):
            waits.append(last)
            last = ""
    return waits


def loops(text: str) -> list[str]:
    """The text of every loop: from a label to the last branch back to it (blocks of the
    loop laid out in between), innermost loops included as loops of their own."""
    labels = {m.group(1): m.start() for m in _LABEL.finditer(text)}
    ends: dict[str, int] = {}
    for m in _BRANCH.finditer(text):
        target = m.group(1)
        if target in labels and labels[target] < m.start():
            ends[target] = max(ends.get(target, 0), m.end())
    return [text[labels[t] : end] for t, end in sorted(ends.items(), key=lambda kv: labels[kv[0]])]


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


class SassLoop(NamedTuple):
    start: int  # byte offset of the loop's first instruction
    instructions: int  # instructions from the first to the branch back, both included
    text: str


def sass_loops(text: str) -> list[SassLoop]:
    """Every loop of ``cuobjdump -sass`` text: a branch to an earlier address closes one."""
    lines = [(int(m.group(1), 16), m.group(3), m.group(0)) for m in _SASS_LINE.finditer(text)]
    found = []
    for i, (offset, op, _) in enumerate(lines):
        target = re.search(r"BRA\s+(?:`\()?(?:0x)?([0-9a-f]+)", lines[i][2]) if op.startswith("BRA") else None
        if target and int(target.group(1), 16) < offset:
            start = int(target.group(1), 16)
            body = [line for at, _, line in lines if start <= at <= offset]
            found.append(SassLoop(start, len(body), "\n".join(body)))
    return found
