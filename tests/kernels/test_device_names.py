"""Device-name normalisation: the names config files are filed under."""

from types import SimpleNamespace

import pytest
import torch

from mm_schedule.kernels import device_names
from mm_schedule.kernels.device_names import (
    amd_candidates,
    device_candidates,
    gfx_arch,
    normalize_device_name,
    nvidia_candidates,
)


@pytest.mark.parametrize(
    ("raw", "capability", "expected"),
    [
        # The spellings of vLLM's shipped fused-MoE tables.
        ("NVIDIA H100 80GB HBM3", (9, 0), ("NVIDIA_H100_80GB_HBM3", "sm_90")),
        ("NVIDIA H200", (9, 0), ("NVIDIA_H200", "sm_90")),
        ("NVIDIA B200", (10, 0), ("NVIDIA_B200", "sm_100")),
        ("NVIDIA A100-SXM4-80GB", (8, 0), ("NVIDIA_A100-SXM4-80GB", "sm_80")),
        ("NVIDIA H100 PCIe", (9, 0), ("NVIDIA_H100_PCIe", "sm_90")),
        ("NVIDIA GeForce RTX 4090", (8, 9), ("NVIDIA_GeForce_RTX_4090", "sm_89")),
        ("  NVIDIA L40S ", None, ("NVIDIA_L40S",)),
    ],
)
def test_nvidia_names(raw, capability, expected):
    assert nvidia_candidates(raw, capability) == expected


@pytest.mark.parametrize(
    ("name", "arch", "expected"),
    [
        ("AMD Instinct MI300X", "gfx942:sramecc+:xnack-", ("AMD_Instinct_MI300X", "gfx942")),
        ("AMD Instinct MI325X", "gfx942:sramecc+:xnack-", ("AMD_Instinct_MI325X", "gfx942")),
        ("AMD Instinct MI355X", "gfx950", ("AMD_Instinct_MI355X", "gfx950")),
        (
            "AMD Instinct MI250X/MI250",
            "gfx90a:sramecc+:xnack-",
            ("AMD_Instinct_MI250X_MI250", "gfx90a"),
        ),
        # Generic or empty product names identify no card: only the architecture is used.
        ("AMD Radeon Graphics", "gfx1100", ("gfx1100",)),
        ("", "gfx90a:sramecc+:xnack-", ("gfx90a",)),
        # A name that is itself the architecture is not listed twice.
        ("gfx942", "gfx942:sramecc+:xnack-", ("gfx942",)),
        ("AMD Instinct MI300X", "", ("AMD_Instinct_MI300X",)),
        ("AMD Radeon Graphics", "not-an-arch", ()),
    ],
)
def test_amd_names(name, arch, expected):
    assert amd_candidates(name, arch) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("gfx942:sramecc+:xnack-", "gfx942"),
        ("gfx90a", "gfx90a"),
        ("GFX950:xnack+", "gfx950"),
        ("gfx1201", "gfx1201"),
        ("sm_90", None),
        ("", None),
        ("gfx", None),
    ],
)
def test_gfx_arch(raw, expected):
    assert gfx_arch(raw) == expected


def test_names_are_safe_file_names():
    assert normalize_device_name("Vendor X/Y\\Z") == "Vendor_X_Y_Z"


def test_cpu_and_default_device():
    assert device_candidates("cpu") == ("cpu",)
    assert device_candidates(torch.device("cpu")) == ("cpu",)
    if not torch.cuda.is_available():
        assert device_candidates(None) == ("cpu",)


@pytest.fixture
def fake_gpu(monkeypatch):
    """Make torch report one GPU with the given properties (no GPU needed)."""
    device_names._gpu_candidates.cache_clear()

    def install(props, hip):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: props)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.version, "hip", hip)

    yield install
    device_names._gpu_candidates.cache_clear()


def test_rocm_device_reads_product_and_arch(fake_gpu):
    fake_gpu(
        SimpleNamespace(
            name="AMD Instinct MI300X", gcnArchName="gfx942:sramecc+:xnack-", major=9, minor=4
        ),
        "6.2",
    )
    assert device_candidates(torch.device("cuda", 0)) == ("AMD_Instinct_MI300X", "gfx942")


def test_cuda_device_reads_name_and_capability(fake_gpu):
    fake_gpu(SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0), None)
    assert device_candidates("cuda") == ("NVIDIA_H100_80GB_HBM3", "sm_90")
    assert device_candidates(0) == ("NVIDIA_H100_80GB_HBM3", "sm_90")
