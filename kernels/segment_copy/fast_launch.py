"""Launching a Triton kernel without paying for its argument binder on every call.

``kernel[grid](*args, **constexprs)`` re-derives the specialisation of every argument
(types, alignment, constexpr values) and hashes it on each call: several microseconds,
more than the copy of one image on a current GPU. The launchers already know the
specialisation (they chose it), so a ``LaunchSpec`` — the constexprs and options of one
launch shape, built once — keeps the ``CompiledKernel`` that its first JIT launch
returned, per pointer-alignment class, and afterwards calls that kernel's launcher the
way ``CompiledKernel.__getitem__`` does (Triton 3.3 to 3.9), hooks included.

A spec names everything Triton specialises on except what it reads from argument values
(16-byte alignment of pointers, 32- or 64-bit integers), which the caller passes with
each launch as ``variant``. If the
installed Triton's compiled kernels take their arguments differently (a ``TypeError`` or
``AttributeError`` from the direct call, raised before anything is launched), direct
launches are turned off for the process and every launch goes through the JIT. Under
``TRITON_INTERPRET=1`` the JIT returns no compiled kernel and nothing is kept.
"""

from __future__ import annotations

import functools


class LaunchSpec:
    __slots__ = ("constexprs", "handles", "jit_fn", "options", "proven")

    def __init__(self, jit_fn, constexprs: dict, options: dict):
        self.jit_fn = jit_fn
        self.constexprs = constexprs
        self.options = options
        self.handles: dict = {}
        self.proven: set = set()

    def launch(self, grid: int, args: tuple, variant: tuple, stream) -> None:
        """Launch ``grid`` programs on ``stream`` (a raw stream handle; ``None``: Triton's
        current stream). ``args`` are the non-constexpr arguments in declaration order,
        with the constexprs declared after them; ``variant`` names what Triton derives
        from argument values (pointer alignment, integer width)."""
        handle = self.handles.get(variant)
        if handle is not None and _direct_launches[0]:
            if variant in self.proven:
                _direct(handle, grid, (*args, *self.constexprs.values()), stream)
                return
            try:
                # The first direct launch of a handle proves the calling convention: Triton
                # checks the arguments before it launches anything.
                _direct(handle, grid, (*args, *self.constexprs.values()), stream)
                self.proven.add(variant)
                return
            except (TypeError, AttributeError):
                _direct_launches[0] = False
        compiled = self.jit_fn[(grid,)](*args, **self.constexprs, **self.options)
        if hasattr(compiled, "packed_metadata"):
            self.handles[variant] = compiled


_direct_launches = [True]


def _direct(handle, grid: int, args: tuple, stream) -> None:
    knobs, driver = _triton_runtime()
    if stream is None:
        stream = driver.active.get_current_stream(driver.active.get_current_device())
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    if _has_hooks(enter) or _has_hooks(leave):
        metadata = handle.launch_metadata((grid, 1, 1), stream, *args)
    else:
        # Nothing listens: skip building the metadata Triton would hand to no one.
        metadata = enter = leave = None
    handle.run(grid, 1, 1, stream, handle.function, handle.packed_metadata, metadata, enter, leave, *args)


def _has_hooks(hook) -> bool:
    # Triton 3.9 keeps hooks in a HookChain (never None); older versions use None.
    return hook is not None and bool(getattr(hook, "calls", True))


@functools.cache
def _triton_runtime():
    from triton import knobs
    from triton.runtime import driver

    return knobs, driver
