"""Every module-level name of each known SGLang release's ``mm_schedule`` exists in the
stand-in bound as that release, with the same parameters (and defaults) or dataclass
fields, and every name ``versions.FORMS`` says the release lacks is absent from it.

Each release's module source is read from its official wheel and its definitions taken
from the syntax tree (names, parameters and their defaults, dataclass fields), so a
release whose other modules cannot run on this machine is checked too."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import zipfile

import pytest

from mm_schedule.integrations.sglang import KNOWN, standin
from mm_schedule.integrations.sglang.versions import FORMS, NEWEST, profile

pytestmark = pytest.mark.realworld

MODULE_FILE = "sglang/srt/managers/mm_schedule.py"
CACHE_FILE = "sglang/srt/mem_cache/multimodal_cache.py"  # where MultiModalStaticCache changes
# Imported by SGLang's module for its own annotations and decorators, not its surface.
HELPERS = {"dataclass", "field", "Callable", "Dict", "List", "Optional", "Tuple"}


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


@pytest.fixture
def as_release():
    yield standin.use_release
    standin.use_release(NEWEST)


@pytest.mark.parametrize("version", KNOWN)
def test_every_name_of_each_release_with_its_signature(sglang_wheels, as_release, version):
    definitions = _wheel_definitions(sglang_wheels, version)
    assert {"get_embedding_and_mask", "_batch_encode_per_image_misses", "logger", "_is_hip"} <= set(definitions)
    as_release(version)
    assert incompatible(definitions) == []
    # What the release lacks, the stand-in as that release lacks too; the rest it has.
    for name, form in profile(version).forms.items():
        assert (name in definitions) == (form is not None) == hasattr(standin, name), name


def test_each_form_change_is_a_real_difference_between_releases(sglang_wheels):
    """Every release FORMS names as changing a name's form changes that name's source."""
    sources = {v: {**_wheel_sources(sglang_wheels, v, MODULE_FILE),
                   **_wheel_sources(sglang_wheels, v, CACHE_FILE, only=("MultiModalStaticCache",))}
               for v in KNOWN}
    for name, history in FORMS.items():
        for since, _ in history[1:]:
            before = KNOWN[KNOWN.index(since) - 1]
            assert sources[before].get(name) != sources[since].get(name), (name, since)


def _wheel_sources(wheels, version: str, member: str, only: tuple[str, ...] = ()) -> dict[str, str]:
    """name -> source text of each top-level definition of one of the release's modules."""
    with zipfile.ZipFile(wheels.fetch_wheel(version)) as archive:
        text = archive.read(member).decode()
    tree = ast.parse(text)
    found = {}
    for node in tree.body:
        names = []
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign):
            names = [node.target.id]
        elif isinstance(node, ast.ImportFrom):
            names = [a.asname or a.name for a in node.names]
        for name in names:
            if not only or name in only:
                found[name] = ast.get_source_segment(text, node)
    return found


def test_the_checker_sees_a_changed_signature(sglang_wheels, as_release):
    as_release("0.5.19")
    definitions = _wheel_definitions(sglang_wheels, "0.5.19")
    definitions["get_embedding_chunk"] = [("embedding", None), ("extend_prefix_len", None)]
    definitions["a_name_sglang_added"] = None
    assert incompatible(definitions) == ["get_embedding_chunk", "a_name_sglang_added"]


def test_stand_in_objects_mirror_sglang_types(sglang):
    assert standin.MultiModalStaticCache.combine_hashes([1, 2]) == sglang.scheduler.MultiModalStaticCache.combine_hashes([1, 2])
    assert standin.EmbeddingResult(embedding=1).embedding == sglang.scheduler.EmbeddingResult(embedding=1).embedding
