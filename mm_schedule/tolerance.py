"""How far two computations of one model output may differ when only the order of their
sums differs: the tolerance for comparing encoder outputs across batch compositions."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def reorder_tolerance(modules: Iterable[torch.nn.Module], want: torch.Tensor) -> float:
    """The largest difference between two computations of ``want`` by ``modules`` that
    differ only in the order their sums are rounded: another batch composition (BLAS and
    cuBLAS pick kernels by the number of rows), thread count or SIMD path.

    A sum of n products is within (n - 1)·u·Σ|terms| of its exact value in any order
    (u = eps/2), so two orders differ by at most n·eps·Σ|terms|. With Σ|terms| taken at
    the output's scale (normalisation keeps activations there) and each of the L weight
    layers adding such a difference, the bound is L·n·eps·max|want|, n the largest fan-in.
    A real mistake (another image's rows, a shifted row) moves values by the order of
    max|want| itself, far above it.
    """
    layers = [m.weight for module in modules for m in module.modules()
              if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() >= 2]
    fan_in = max(weight[0].numel() for weight in layers)
    return len(layers) * fan_in * torch.finfo(want.dtype).eps * want.detach().abs().max().item()
