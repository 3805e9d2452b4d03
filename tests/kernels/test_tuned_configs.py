"""Config lookup: file format, folder precedence, nearest buckets, heuristic fallback."""

import json
import logging
import math
import random
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mm_schedule.errors import KernelConfigError, KernelInputError
from mm_schedule.kernels import tuned_configs
from mm_schedule.kernels.launch_config import heuristic_config
from mm_schedule.kernels.tuned_configs import CONFIG_DIR_ENV, get_config, iter_configs, nearest_key

POW2 = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def random_config(rng):
    return {
        "BLOCK_M": rng.choice(POW2[:7]),
        "BLOCK_H": rng.choice(POW2[5:]),
        "num_warps": rng.choice([1, 2, 4, 8, 16]),
        "num_stages": rng.randint(1, 4),
    }


def table_doc(kernel, configs, **header):
    doc = {
        "kernel": kernel,
        "device": "cpu",
        "source": "tuned",
        "triton_version": __import__("triton").__version__,
        "date": "2025-01-01T00:00:00+00:00",
        "command": "mm-schedule-tune --test",
        "configs": configs,
    }
    doc.update(header)
    return doc


def write_table(folder, kernel, device, configs, **header):
    path = folder / kernel / f"{device}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table_doc(kernel, configs, **{"device": device, **header})))
    return path


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """No user override, an empty 'shipped' folder, and fresh caches for every test."""
    monkeypatch.delenv(CONFIG_DIR_ENV, raising=False)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setattr(tuned_configs, "SHIPPED_CONFIG_DIR", shipped)
    tuned_configs.clear_cache()
    yield shipped
    tuned_configs.clear_cache()


@pytest.fixture
def override(monkeypatch, tmp_path):
    folder = tmp_path / "override"
    folder.mkdir()
    monkeypatch.setenv(CONFIG_DIR_ENV, str(folder))
    return folder


@pytest.fixture
def rng():
    return random.Random()


def lookup(kernel="segment_gather", dtype=torch.bfloat16, hidden=4096, n_rows=256, device="cpu"):
    return get_config(kernel, dtype=dtype, hidden=hidden, n_rows=n_rows, device=device)


def test_exact_and_nearest_bucket(override, rng):
    buckets = {16: random_config(rng), 256: random_config(rng), 4096: random_config(rng)}
    write_table(
        override,
        "segment_gather",
        "cpu",
        {"bfloat16": {"4096": {str(k): v for k, v in buckets.items()}}},
    )
    for rows, bucket in [
        (16, 16),
        (256, 256),
        (4096, 4096),
        (0, 16),  # an empty launch still gets a config
        (40, 16),
        (100, 256),
        (2000, 4096),  # log-nearest; linear distance would pick 256
        (10**6, 4096),
    ]:
        assert lookup(n_rows=rows) == buckets[bucket], rows


def test_tie_goes_to_larger_bucket():
    assert nearest_key([16, 64], 32) == 64
    assert nearest_key([1024, 4096], 2048) == 4096


@given(st.sets(st.integers(1, 1 << 20), min_size=1, max_size=8), st.integers(1, 1 << 22))
def test_nearest_key_is_closest_in_log(keys, value):
    chosen = nearest_key(keys, value)
    assert chosen in keys
    distance = abs(math.log(chosen / value))
    assert all(distance <= abs(math.log(k / value)) + 1e-12 for k in keys)


def test_hidden_nearest_within_factor_two(override, rng):
    configs = {"3584": {"1024": random_config(rng)}, "8192": {"1024": random_config(rng)}}
    write_table(override, "segment_gather", "cpu", {"bfloat16": configs})
    assert lookup(hidden=3584, n_rows=1024) == configs["3584"]["1024"]
    assert lookup(hidden=4096, n_rows=1024) == configs["3584"]["1024"]
    assert lookup(hidden=7168, n_rows=1024) == configs["8192"]["1024"]
    assert lookup(hidden=1792, n_rows=1024) == configs["3584"]["1024"]  # exactly half: allowed
    far = lookup(hidden=1152, n_rows=1024)
    assert far == heuristic_config("segment_gather", dtype=torch.bfloat16, hidden=1152, n_rows=1024)


def test_missing_dtype_uses_heuristic_and_logs_once(override, rng, caplog):
    write_table(
        override, "segment_gather", "cpu", {"bfloat16": {"4096": {"256": random_config(rng)}}}
    )
    caplog.set_level(logging.INFO, logger="mm_schedule.kernels.tuned_configs")
    got = lookup(dtype=torch.float32, n_rows=300)
    assert got == heuristic_config("segment_gather", dtype=torch.float32, hidden=4096, n_rows=300)
    assert (
        got["BLOCK_H"]
        != heuristic_config("segment_gather", dtype=torch.bfloat16, hidden=4096, n_rows=300)[
            "BLOCK_H"
        ]
    ), "the heuristic must see the real dtype, not a name"
    lookup(dtype=torch.float16, n_rows=5000)
    lookup(dtype=torch.float32, hidden=1024, n_rows=3)
    misses = [r for r in caplog.records if "heuristic" in r.getMessage()]
    assert len(misses) == 1
    assert "segment_gather on cpu" in misses[0].getMessage() and "float32" in misses[0].getMessage()
    lookup(kernel="placeholder_merge")  # another kernel: its own message
    assert len([r for r in caplog.records if "heuristic" in r.getMessage()]) == 2


def test_no_file_warns_on_a_gpu_name(monkeypatch, caplog):
    monkeypatch.setattr(tuned_configs, "device_candidates", lambda device: ("NVIDIA_H200", "sm_90"))
    caplog.set_level(logging.INFO, logger="mm_schedule.kernels.tuned_configs")
    got = lookup(device=None, n_rows=8192)
    assert got == heuristic_config("segment_gather", dtype=torch.bfloat16, hidden=4096, n_rows=8192)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "NVIDIA_H200.json" in record.getMessage() and "sm_90.json" in record.getMessage()


def test_override_folder_wins_over_shipped(isolated, override, rng):
    shipped_cfg, override_cfg = random_config(rng), random_config(rng)
    while override_cfg == shipped_cfg:
        override_cfg = random_config(rng)
    write_table(isolated, "segment_gather", "cpu", {"bfloat16": {"4096": {"256": shipped_cfg}}})
    write_table(isolated, "placeholder_merge", "cpu", {"bfloat16": {"4096": {"256": shipped_cfg}}})
    write_table(override, "segment_gather", "cpu", {"bfloat16": {"4096": {"256": override_cfg}}})
    assert lookup() == override_cfg
    # No override file for this kernel: the shipped one still serves.
    assert lookup(kernel="placeholder_merge") == shipped_cfg


def test_shipped_folder_without_override(isolated, rng):
    cfg = random_config(rng)
    write_table(isolated, "segment_gather", "cpu", {"float16": {"2048": {"64": cfg}}})
    assert lookup(dtype=torch.float16, hidden=2048, n_rows=64) == cfg
    assert lookup(dtype="float16", hidden=2048, n_rows=64) == cfg


def test_product_file_before_arch_file(isolated, monkeypatch, rng):
    product, arch = random_config(rng), random_config(rng)
    monkeypatch.setattr(
        tuned_configs, "device_candidates", lambda device: ("AMD_Instinct_MI300X", "gfx942")
    )
    write_table(isolated, "segment_gather", "gfx942", {"bfloat16": {"4096": {"256": arch}}})
    assert lookup(device=None) == arch  # the family fallback
    write_table(
        isolated, "segment_gather", "AMD_Instinct_MI300X", {"bfloat16": {"4096": {"256": product}}}
    )
    tuned_configs.clear_cache()
    assert lookup(device=None) == product


def test_files_are_read_once_and_answers_are_fresh_dicts(override, rng):
    first, second = random_config(rng), random_config(rng)
    path = write_table(override, "segment_gather", "cpu", {"bfloat16": {"4096": {"256": first}}})
    got = lookup()
    got["BLOCK_M"] = -1  # a caller scribbling on its copy changes nothing
    assert lookup() == first
    path.write_text(
        json.dumps(table_doc("segment_gather", {"bfloat16": {"4096": {"256": second}}}))
    )
    assert lookup(n_rows=300) == first  # not re-read
    tuned_configs.clear_cache()
    assert lookup(n_rows=300) == second


MALFORMED = [
    ("{not json", "cannot read"),
    (json.dumps([1, 2]), "JSON object"),
    (
        json.dumps({k: v for k, v in table_doc("segment_gather", {}).items() if k != "date"}),
        "'date'",
    ),
    (json.dumps(table_doc("segment_gather", {})), "non-empty"),
    (
        json.dumps(table_doc("segment_gather", {"bfloat16": {"4096": {"16": {"BLOCK_M": 4}}}})),
        "BLOCK_H",
    ),
    (
        json.dumps(
            table_doc(
                "segment_gather",
                {
                    "bfloat16": {
                        "4096": {
                            "16": {
                                "BLOCK_M": 4,
                                "BLOCK_N": 4,
                                "BLOCK_H": 64,
                                "num_warps": 4,
                                "num_stages": 1,
                            }
                        }
                    }
                },
            )
        ),
        "BLOCK_N",
    ),
    (
        json.dumps(
            table_doc(
                "segment_gather",
                {
                    "bfloat16": {
                        "4096": {
                            "16": {"BLOCK_M": 4, "BLOCK_H": 96, "num_warps": 4, "num_stages": 1}
                        }
                    }
                },
            )
        ),
        "power of two",
    ),
    (
        json.dumps(
            table_doc(
                "segment_gather",
                {
                    "bfloat16": {
                        "4096": {
                            "16": {"BLOCK_M": 4.0, "BLOCK_H": 64, "num_warps": 4, "num_stages": 1}
                        }
                    }
                },
            )
        ),
        "integers",
    ),
    (
        json.dumps(
            table_doc(
                "segment_gather",
                {
                    "bfloat16": {
                        "wide": {
                            "16": {"BLOCK_M": 4, "BLOCK_H": 64, "num_warps": 4, "num_stages": 1}
                        }
                    }
                },
            )
        ),
        "'wide'",
    ),
    (
        json.dumps(
            table_doc(
                "placeholder_merge",
                {
                    "bfloat16": {
                        "64": {"16": {"BLOCK_M": 4, "BLOCK_H": 64, "num_warps": 4, "num_stages": 1}}
                    }
                },
            )
        ),
        "filed under 'segment_gather'",
    ),
]


@pytest.mark.parametrize(("text", "fragment"), MALFORMED)
def test_malformed_file_names_file_and_problem(override, text, fragment):
    path = override / "segment_gather" / "cpu.json"
    path.parent.mkdir()
    path.write_text(text)
    with pytest.raises(KernelConfigError) as err:
        lookup()
    assert str(path) in str(err.value)
    assert fragment in str(err.value)


def test_override_folder_must_exist(monkeypatch, tmp_path):
    monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(KernelConfigError, match=CONFIG_DIR_ENV):
        lookup()


def test_bad_arguments():
    with pytest.raises(KernelInputError, match="unknown kernel"):
        lookup(kernel="softmax")
    with pytest.raises(KernelInputError, match="hidden"):
        lookup(hidden=0)
    with pytest.raises(KernelInputError, match="n_rows"):
        lookup(n_rows=-1)


def test_other_triton_version_warns(override, rng, caplog):
    cfg = random_config(rng)
    path = write_table(
        override,
        "segment_gather",
        "cpu",
        {"bfloat16": {"4096": {"256": cfg}}},
        triton_version="2.1.0",
    )
    caplog.set_level(logging.WARNING, logger="mm_schedule.kernels.tuned_configs")
    assert lookup() == cfg
    assert any(str(path) in r.getMessage() and "2.1.0" in r.getMessage() for r in caplog.records)


def test_iter_configs_lists_every_entry(override, rng):
    a, b, c = (random_config(rng) for _ in range(3))
    write_table(override, "segment_gather", "cpu", {"bfloat16": {"4096": {"16": a, "256": b}}})
    write_table(override, "placeholder_merge", "gfx942", {"float32": {"1024": {"8": c}}})
    got = sorted(iter_configs(override), key=lambda e: (e[0], e[4]))
    assert got == [
        ("placeholder_merge", "gfx942", "float32", 1024, 8, c),
        ("segment_gather", "cpu", "bfloat16", 4096, 16, a),
        ("segment_gather", "cpu", "bfloat16", 4096, 256, b),
    ]


def test_shipped_configs_parse():
    """Whatever is shipped (possibly nothing) must load."""
    for kernel, _device, _dtype, _hidden, _rows, config in iter_configs(
        tuned_configs.Path(tuned_configs.__file__).parent / "configs"
    ):
        assert kernel in ("segment_gather", "placeholder_merge")
        assert set(config) == {"BLOCK_M", "BLOCK_H", "num_warps", "num_stages"}


def test_importing_lookup_and_tuner_loads_neither_torch_nor_triton():
    code = (
        "import sys, mm_schedule.kernels.tuned_configs, mm_schedule.kernels.tools.tune, mm_schedule.kernels.tools.aot, mm_schedule.kernels.device_names;"
        "bad = [m for m in ('torch', 'triton') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_clear_cache_makes_the_next_launch_use_a_rewritten_file(isolated, triton_backend, monkeypatch, helpers):
    """A launcher resolves a config once per shape; after new files and ``clear_cache`` the
    next launch must run the new file's tiles, not the ones it resolved before."""
    from mm_schedule.kernels.segment_copy import launch as gather_mod

    used = []
    real_launch = gather_mod._launch

    def spy(launch, *rest):
        used.append(launch.spec.constexprs["BLOCK_H"])
        return real_launch(launch, *rest)

    monkeypatch.setattr(gather_mod, "_launch", spy)
    sources = [helpers.random_rows(8, 128, torch.float16) for _ in range(2)]
    segments = [(1, 0, 8, 0), (0, 2, 6, 8)]
    for block_h in (32, 128, 64):
        config = {"BLOCK_M": 4, "BLOCK_H": block_h, "num_warps": 1, "num_stages": 1}
        write_table(isolated, "segment_gather", "cpu", {"float16": {"128": {"16": config}}})
        tuned_configs.clear_cache()
        out = helpers.poisoned((14, 128), torch.float16)
        gather_mod.gather_segments(sources, segments, out=out)
        expected = torch.cat([sources[1], sources[0][2:8]])
        helpers.assert_bitwise_equal(out, expected)
        assert used[-1] == block_h
