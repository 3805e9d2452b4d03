"""Launching a Triton kernel without paying for its argument binder on every call.

``kernel[grid](*args, **constexprs)`` re-derives the specialisation of every argument
(types, alignment, constexpr values) and hashes it on each call: several microseconds,
more than the copy of one image on a current GPU. The launchers already know the
specialisation (they chose it), so ``LaunchCache`` keeps the ``CompiledKernel`` the first
JIT launch returned under the launcher's own key and launches it directly afterwards.

The key must name everything Triton specialises on; the launchers build it from the
destination dtype and alignment, the constexprs, the launch options and the device.
If the installed Triton launches compiled kernels differently (``TypeError`` from the
direct call), the cache turns itself off and every launch goes through the JIT.
Under ``TRITON_INTERPRET=1`` the JIT returns no compiled kernel and nothing is cached.
"""

from __future__ import annotations


class LaunchCache:
    def __init__(self, jit_fn):
        self.jit_fn = jit_fn
        self.compiled: dict = {}
        self.enabled = True

    def clear(self) -> None:
        self.compiled.clear()

    def launch(self, key, grid: int, args: tuple, constexprs: dict, options: dict, stream) -> None:
        handle = self.compiled.get(key) if self.enabled else None
        if handle is not None:
            try:
                handle[(grid, 1, 1)](*args, *constexprs.values(), stream=stream)
                return
            except TypeError:
                self.enabled = False
                self.compiled.clear()
        compiled = self.jit_fn[(grid,)](*args, **constexprs, **options)
        if self.enabled and hasattr(compiled, "packed_metadata"):
            self.compiled[key] = compiled
