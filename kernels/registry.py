"""Every tuned kernel in one table: its name and where its runtime code lives.

(The placeholder mask, ``placeholder_mask.py``, has one block shape and no tuned configs; its
AOT specs are ``tools.aot.placeholder_mask_specs``.)

The name is the key of the tuned config tables (``configs/<name>/<device>.json``) and of
``tuned_configs.get_config``. The runtime module is named by dotted path and imported on
first use, so reading this table loads neither torch nor triton. The tooling points down
at this table, not the other way: ``tools.aot.SPEC_BUILDERS`` and ``tools.cases.CASES``
are keyed by these names (the runtime never imports ``tools/``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..errors import KernelInputError


@dataclass(frozen=True)
class KernelEntry:
    name: str
    module: str  # runtime module: the JIT function, its launchers and the torch reference
    jit_function: str
    launchers: tuple[str, ...]  # public entry points that run the kernel
    reference: str  # plain-torch reference in ``module``: the CPU fallback and test oracle
    rows: str  # what ``n_rows`` in a config lookup counts for this kernel

    def jit(self):
        """The ``@triton.jit`` function (imports torch and triton)."""
        return _resolve(f"{self.module}:{self.jit_function}")


def _resolve(path: str):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(f".{module}", __package__), attr)


KERNELS = {
    entry.name: entry
    for entry in (
        KernelEntry(
            name="segment_gather",
            module="segment_copy.launch",
            jit_function="segment_copy_kernel",
            launchers=(
                "plan_segments",
                "run_segments",
                "gather_segments",
                "merge_segments",
                "gather_segments_op",
                "merge_segments_op",
            ),
            reference="gather_segments_ref",
            rows="rows in the segment table; the dtype is the destination's",
        ),
        KernelEntry(
            name="placeholder_merge",
            module="placeholder_merge",
            jit_function="placeholder_merge_kernel",
            launchers=("merge_by_placeholder_ids", "embed_with_placeholders"),
            reference="merge_by_placeholder_ids_ref",
            rows="tokens in input_ids; the dtype is the output's",
        ),
    )
}
KERNEL_NAMES = tuple(KERNELS)


def kernel_entry(name: str) -> KernelEntry:
    try:
        return KERNELS[name]
    except KeyError:
        raise KernelInputError(
            f"unknown kernel {name!r}; expected one of {KERNEL_NAMES}"
        ) from None
