"""Ranks of a ``torch.distributed`` process group scheduling the same step.

Serving engines run one scheduler per tensor-parallel rank, each with its own cache.
This package makes their decisions identical (``agreement``), optionally splits the
encoder work between them (``shards``, ``exchange``), and turns a fault on one rank
into the same error on every rank (``faults``); ``step`` ties these to a plan. The
group arrives in the step context (``StepContext.group``); nothing about the topology
is read from module state or the environment.
"""
