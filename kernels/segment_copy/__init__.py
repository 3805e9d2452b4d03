"""The segment copy: rows of many source tensors into one destination, in one launch.

- ``contract.py``: what a segment is, and every host check of tables and tensors;
- ``table.py``: the device-side table and its packing;
- ``staging.py``: the ring of reused buffers per-call tables are staged in;
- ``kernel.py``: the Triton kernel;
- ``fast_launch.py``: launching it without Triton's per-call argument binder;
- ``launch.py``: the public launchers (checked gather / merge, plan and run);
- ``trusted.py``: the scheduler's unchecked path (Triton or torch, chosen once);
- ``host_copy.py`` and ``_stream_copy.c``: CPU row copies as byte copies in one C call;
- ``custom_ops.py``: the copies as ``torch.library`` ops for ``torch.compile``.
"""
