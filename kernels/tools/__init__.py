"""Tooling around the kernels, never imported on the serving path.

- ``tune``: ``mm-schedule-tune``, times launch configs on a GPU and writes the tables
  that ``tuned_configs`` reads (``space``: shapes and search space; ``cases``: what is
  timed per kernel);
- ``timing``: the one GPU timer (CUDA events over cold caches, CUDA-graph replay) used
  by the tuner and the benchmarks;
- ``aot``: compiles every kernel variant for NVIDIA and AMD targets without a GPU;
  ``asm`` reads the PTX/AMDGCN it produces (vector width, waits, conversions);
- ``gpu_check``: the unattended check for a machine with a GPU (GPU tests, tuner,
  benchmark) in one process.
"""
