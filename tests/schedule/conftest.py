"""Run a test once per assembly backend: the torch path, and Triton under the interpreter."""

import os

import pytest

from mm_schedule.kernels.segment_copy.trusted import forget_backend_choice

BACKENDS = ["torch", "triton"]


@pytest.fixture
def backend(request, monkeypatch):
    name = request.param
    if name == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
    monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", name)
    forget_backend_choice()
    yield name
    monkeypatch.undo()
    forget_backend_choice()
