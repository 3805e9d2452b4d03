"""Every module-level name of SGLang's ``mm_schedule`` exists in the stand-in with a
compatible signature, for each release the version table calls matched; for the newer
release it does not match, the table lists exactly what differs.

Each release's module source is read from its official wheel and its definitions taken
from the syntax tree (names, parameters and their defaults, dataclass fields), so a
release whose other modules cannot run on this machine is checked too."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import zipfile

import pytest

from mm_schedule.integrations.sglang import RELEASES, standin

pytestmark = pytest.mark.realworld

MODULE_FILE = "sglang/srt/managers/mm_schedule.py"
# Imported by SGLang's module for its own annotations and decorators, not its surface.
HELPERS = {"dataclass", "field", "Callable", "Dict", "List", "Optional", "Tuple", "BORROW_CUDA_IPC_FEATURE_KEY"}


def _wheel_definitions(wheels, version: str) -> dict[str, object]:
    """name -> shape of every module-level name of the release's module (None: a plain name)."""
    try:
        wheel = wheels.fetch_wheel(version)
    except wheels.WheelUnavailable as exc:
        pytest.skip(f"SGLang {version} wheel unavailable: {exc}")
    with zipfile.ZipFile(wheel) as archive:
        tree = ast.parse(archive.read(MODULE_FILE))
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            args = node.args
            defaults = [None] * (len(args.args) - len(args.defaults)) + [ast.literal_eval(d) for d in args.defaults]
            found[node.name] = [(a.arg, d) for a, d in zip(args.args, defaults)]
        elif isinstance(node, ast.ClassDef):
            found[node.name] = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign)]
        elif isinstance(node, ast.Assign):
            found.update({t.id: None for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign):
            found[node.target.id] = None
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update({(a.asname or a.name): None for a in node.names if (a.asname or a.name) not in HELPERS})
    return found


def _our_shape(value) -> object:
    if dataclasses.is_dataclass(value) and isinstance(value, type):
        return [f.name for f in dataclasses.fields(value)]
    if inspect.isfunction(value):
        # Keyword-only parameters with defaults (the stand-in's additions) leave every
        # call SGLang's signature allows unchanged.
        return [(p.name, None if p.default is inspect.Parameter.empty else p.default)
                for p in inspect.signature(value).parameters.values()
                if not (p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not inspect.Parameter.empty)]
    return None


def incompatible(definitions: dict[str, object]) -> list[str]:
    return [name for name, shape in definitions.items()
            if not hasattr(standin, name) or (shape is not None and _our_shape(getattr(standin, name)) != shape)]


@pytest.mark.parametrize("release", [r for r in RELEASES if r.matched], ids=lambda r: r.version)
def test_every_name_of_a_matched_release_with_its_signature(sglang_wheels, release):
    definitions = _wheel_definitions(sglang_wheels, release.version)
    assert {"get_embedding_and_mask", "_batch_encode_per_image_misses", "logger", "_is_hip"} <= set(definitions)
    assert incompatible(definitions) == []


def test_the_newer_release_differs_exactly_where_the_table_says(sglang_wheels):
    newer = [r for r in RELEASES if not r.matched]
    assert newer, "the table names the newest release it checked"
    for release in newer:
        definitions = _wheel_definitions(sglang_wheels, release.version)
        differing = incompatible(definitions)
        removed = [n for n in ("_acknowledge_deferred_cuda_ipc_cache_hits",) if n not in definitions]
        assert differing, f"{release.version} matches: mark it matched"
        listed = " ".join(release.missing)
        assert [n for n in differing + removed if n not in listed] == []


def test_the_checker_sees_a_changed_signature(sglang_wheels):
    definitions = _wheel_definitions(sglang_wheels, "0.5.19")
    definitions["get_embedding_chunk"] = [("embedding", None), ("extend_prefix_len", None)]
    definitions["a_name_sglang_added"] = None
    assert incompatible(definitions) == ["get_embedding_chunk", "a_name_sglang_added"]


def test_stand_in_objects_mirror_sglang_types(sglang):
    assert standin.MultiModalStaticCache.combine_hashes([1, 2]) == sglang.scheduler.MultiModalStaticCache.combine_hashes([1, 2])
    assert standin.EmbeddingResult(embedding=1).embedding == sglang.scheduler.EmbeddingResult(embedding=1).embedding
