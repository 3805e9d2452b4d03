"""The cache has one owner and holds nothing wrong: layouts per modality, no import
circles, typed configuration errors, buffer reuse, faults from many threads at once."""

from __future__ import annotations

import ast
import logging
import math
import random
import threading
from pathlib import Path

import pytest
import torch

from mm_schedule import EmbeddingCache, Encoder, RequestChunk, embed_chunk, merge_chunk
from mm_schedule.errors import (
    CacheConfigError,
    CacheLayoutError,
    EmbeddingLengthMismatch,
    EncoderOutputError,
    MMScheduleError,
)

from .conftest import BACKENDS
from .helpers import HIDDEN, CountingEncoder, image, item_rows, naive_reference, truth

STEP = pytest.mark.parametrize("backend", BACKENDS, indirect=True)
PACKAGE = Path(__file__).resolve().parents[2] / "mm_schedule"
CACHE_MUTATORS = {"insert", "insert_many", "set", "discard", "discard_many", "free", "clear"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """Every mm_schedule module ``path`` imports, at module level or inside a function."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [target] + [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found.update(c for c in candidates if c.startswith("mm_schedule"))
    return found


# The one circle by design: the first call into the vLLM drop-ins on an unlisted vLLM
# release runs our own gather and merge against that vLLM's (``releases`` -> ``verify``,
# imported inside the function that decides). Named edge by edge, so any other circle fails.
FIRST_USE_EDGES = {("mm_schedule.integrations.vllm.releases", "mm_schedule.integrations.vllm.verify")}


def test_mm_schedule_has_no_import_circles():
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: {m for m in _imports(path, name) if m in modules and m != name} for name, path in modules.items()}
    assert all(b in graph[a] for a, b in FIRST_USE_EDGES)  # an exemption no longer needed must go
    graph = {name: {m for m in deps if (name, m) not in FIRST_USE_EDGES} for name, deps in graph.items()}
    # A module imports its package's __init__ implicitly; only edges between modules count.
    graph = {name: {m for m in deps if not name.startswith(m + ".")} for name, deps in graph.items()}
    assert "mm_schedule.plan.flat" in graph and graph["mm_schedule.scheduler"]  # the walk saw the package
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt):], nxt]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_only_the_step_changes_the_cache():
    """Calls of the cache's mutating methods appear in the step module and in the cache
    itself, nowhere else in the scheduler: planners get a read-only lookup, validation
    and assembly return what to evict as data."""
    callers = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in CACHE_MUTATORS:
                owner = node.func.value
                text = ast.unparse(owner)
                if "cache" in text.lower():
                    callers.setdefault(_module_name(path), set()).add(f"{text}.{node.func.attr}")
    # The peers' stand-ins reproduce SGLang's / vLLM's own cache calls by contract.
    peers = ("mm_schedule.integrations.sglang", "mm_schedule.integrations.vllm")
    others = {m for m in callers if not m.startswith(peers)}
    assert others <= {"mm_schedule.scheduler", "mm_schedule.cache"}, callers
    assert {"cache.insert_many", "cache.discard_many"} <= callers["mm_schedule.scheduler"]


@pytest.mark.parametrize("bad", [-1, "100", None, math.inf, math.nan, 1.5, True, [10]])
def test_cache_budget_must_be_a_byte_count(bad):
    with pytest.raises(CacheConfigError, match="max_bytes"):
        EmbeddingCache(bad)
    assert issubclass(CacheConfigError, ValueError) and issubclass(CacheConfigError, TypeError)


def test_cache_budget_accepts_integers_of_any_integer_type():
    import numpy as np

    assert EmbeddingCache(np.int64(1024)).max_bytes == 1024 and EmbeddingCache(0).max_bytes == 0
    with pytest.raises(CacheConfigError, match="hidden_sizes"):
        EmbeddingCache(1024, hidden_sizes={"IMAGE": 0})
    with pytest.raises(CacheConfigError, match="dtypes"):
        EmbeddingCache(1024, dtypes=torch.int64)


def _step(h: int, start: int = 0, length: int = 3) -> list[RequestChunk]:
    return [RequestChunk(items=[image(h, start, length)], prefix=0, extend=start + length)]


@STEP
def test_a_wrong_output_without_a_hit_is_never_cached_when_declared(backend):
    cache = EmbeddingCache(1 << 20, hidden_sizes={"IMAGE": HIDDEN}, dtypes=torch.float32)
    with pytest.raises(EncoderOutputError, match=r"request 0, item hash 3: .*hidden size 16, expected 8 \(declared"
                                                 r" for IMAGE\)"):
        embed_chunk(_step(3), CountingEncoder(hidden=16), cache=cache)
    assert len(cache) == 0
    with pytest.raises(CacheLayoutError, match=r"item hash 3: .*dtype torch.float16"):
        embed_chunk(_step(3), lambda items: truth(3, 3).half(), cache=cache)
    got = embed_chunk(_step(3), CountingEncoder(), cache=cache).embedding
    assert torch.equal(got, truth(3, 3)) and torch.equal(cache.lookup(3), truth(3, 3))


@STEP
def test_a_wrong_output_after_a_correct_one_is_named_and_nothing_evicted(backend):
    """No hit in the failing step: the cache's learned layout is what the output is
    checked against, whichever item comes first, and the correct entry stays."""
    cache = EmbeddingCache(1 << 20)
    embed_chunk(_step(1), CountingEncoder(), cache=cache)
    for order in ([image(5, 0, 2), image(6, 2, 2)], [image(6, 0, 2), image(5, 2, 2)]):
        def faulty(items):
            return [truth(it.hash, 2, hidden=16 if it.hash == 6 else HIDDEN) for it in items]

        with pytest.raises(EncoderOutputError, match=r"item hash 6: .*hidden size 16"):
            embed_chunk([RequestChunk(items=order, prefix=0, extend=4)], faulty, cache=cache)
        assert set(_keys(cache)) == {1}
    assert torch.equal(cache.lookup(1), truth(1, 3))


def _keys(cache: EmbeddingCache) -> list[int]:
    return [k for k in range(200) if cache.contains(k)]


def test_insert_many_refuses_a_batch_that_disagrees_with_the_held_layout(caplog):
    cache = EmbeddingCache(1 << 20)
    for key in (1, 11, 12):  # three inserts confirm the learned layout
        cache.insert_many([(key, truth(key, 2))], modalities=["IMAGE"])
    with pytest.raises(CacheLayoutError, match="key 3: a IMAGE embedding of hidden size 5") as info:
        cache.insert_many([(2, truth(2, 2)), (3, torch.zeros(2, 5))], modalities=["IMAGE", "IMAGE"])
    assert (info.value.key, info.value.got, info.value.expected) == (3, (5, torch.float32), (HIDDEN, torch.float32))
    assert _keys(cache) == [1, 11, 12]
    for key in (11, 12):
        cache.discard(key)
    # Another modality may have its own size; a batch must agree with itself too.
    cache.insert_many([(4, torch.zeros(2, 5))], modalities=["AUDIO"])
    with pytest.raises(CacheLayoutError):
        cache.insert_many([(5, torch.zeros(2, 6)), (6, torch.zeros(2, 7))], modalities=["VIDEO", "VIDEO"])
    assert _keys(cache) == [1, 4] and cache.layout_of("AUDIO") == (5, torch.float32)
    # One insert taught AUDIO its layout, which nothing confirmed: a batch at odds with
    # itself is refused against it, a uniform one replaces it (the log says so).
    with pytest.raises(CacheLayoutError, match=r"key 8: .*dtype torch\.float64, .*\(an earlier tensor of this batch\)"):
        cache.insert_many([(7, torch.zeros(2, 5)), (8, torch.zeros(2, 5, dtype=torch.float64))],
                          modalities=["AUDIO", "AUDIO"])
    with caplog.at_level(logging.WARNING, logger="mm_schedule.cache"):
        assert cache.insert_many([(7, torch.zeros(2, 5, dtype=torch.float64))], modalities=["AUDIO"]) == 0
        assert _keys(cache) == [1, 4]  # disputed once: not cached, nothing evicted
        assert cache.insert_many([(7, torch.zeros(2, 5, dtype=torch.float64))], modalities=["AUDIO"]) == 1
    assert "AUDIO embeddings of hidden size 5 and dtype torch.float64 disagree with the layout learned" in caplog.text
    assert _keys(cache) == [1, 7] and cache.layout_of("AUDIO") == (5, torch.float64)
    caplog.clear()
    cache.discard(7)
    cache.insert_many([(4, torch.zeros(2, 5))], modalities=["AUDIO"])  # the earlier layout undoes that change
    cache.discard(4)
    # A learned layout lasts as long as the entries it came from: with none held, the
    # next AUDIO output sets it again (and the log says the layout changed).
    assert cache.layout_of("AUDIO") == (None, None)
    with caplog.at_level(logging.WARNING, logger="mm_schedule.cache"):
        cache.insert_many([(7, torch.zeros(2, 6))], modalities=["AUDIO"])
    assert cache.layout_of("AUDIO") == (6, torch.float32)
    assert "AUDIO embeddings now have hidden size 6" in caplog.text and "hidden size 5" in caplog.text
    cache.clear()
    assert cache.layout_of("AUDIO") == (None, None) and cache.layout_of("IMAGE") == (None, None)


FAULTS = ("none", "hidden", "rows", "raise", "dtype")


class _FaultyEncoder:
    """``truth`` rows, except where a fault is injected for one call (chosen per step)."""

    def __init__(self, fault: str, victim: int):
        self.fault, self.victim = fault, victim

    def __call__(self, items):
        outs = []
        for it in items:
            rows = item_rows(it)
            if it.hash != self.victim or self.fault == "none":
                outs.append(truth(it.hash, rows))
            elif self.fault == "hidden":
                outs.append(truth(it.hash, rows, hidden=HIDDEN + 1))
            elif self.fault == "rows":
                outs.append(truth(it.hash, rows + 1))
            elif self.fault == "dtype":
                outs.append(truth(it.hash, rows).double())
            else:
                raise RuntimeError("injected encoder crash")
        return outs


@STEP
@pytest.mark.parametrize("declared", [False, True], ids=["learned", "declared"])
def test_threads_with_injected_faults_match_the_naive_reference(backend, declared, monkeypatch):
    """Eight threads share one cache; every step either equals the naive reference or
    raises a typed error for the fault injected in it, and the cache never holds a
    wrong row, whichever thread's step came first."""
    if backend == "triton":
        # Triton's interpreter is not thread-safe (GPU launches are): only the kernel
        # launches are serialised (both ways in: a table of segments, and whole sources
        # from their addresses), planning, validation and the cache run concurrently.
        import mm_schedule.assemble as assemble
        import mm_schedule.kernels.segment_copy.launch as launch_module

        lock = threading.Lock()

        def serialised(launch):
            def call(*args):
                with lock:
                    return launch(*args)
            return call

        monkeypatch.setattr(assemble, "copy_segments", serialised(assemble.copy_segments))
        monkeypatch.setattr(launch_module, "launch_whole_sources", serialised(launch_module.launch_whole_sources))
    cache = EmbeddingCache(48 * 4 * HIDDEN * 4, hidden_sizes=HIDDEN if declared else None)
    # The first step of all, before any thread starts: with learned layouts this is the
    # step every later output is held to, so it must be right (see the declared variant).
    embed_chunk(_step(1), CountingEncoder(), cache=cache)
    problems: list[str] = []
    outcomes = {"right": 0, "refused": 0}
    barrier = threading.Barrier(8)

    def worker(seed: int) -> None:
        try:
            steps(seed)
        except BaseException as exc:  # a thread's failure must fail the test, not only warn
            problems.append(f"thread {seed}: {exc!r}")

    def steps(seed: int) -> None:
        rng = random.Random(seed)
        barrier.wait()
        for _ in range(12):
            reqs, pos = [], 0
            for _r in range(rng.randint(1, 3)):
                items, start = [], rng.randint(0, 2)
                for _i in range(rng.randint(1, 3)):
                    length = rng.randint(1, 4)
                    items.append(image(rng.randint(1, 40), start, length))
                    start += length + rng.randint(0, 1)
                prefix = rng.randint(0, 2)
                reqs.append(RequestChunk(items=items, prefix=prefix, extend=start + 1 - prefix))
                pos += start + 1 - prefix
            hashes = sorted({it.hash for r in reqs for it in r.items})
            fault, victim = rng.choice(FAULTS), rng.choice(hashes)
            encoder = _FaultyEncoder(fault, victim)
            fused = rng.random() < 0.5
            try:
                if fused:
                    embeds = torch.full((pos, HIDDEN), float("nan"))
                    merge_chunk(embeds, reqs, encoder, cache=cache)
                    rows = _placeholder_rows(reqs)
                    got = embeds[rows] if rows else torch.empty(0, HIDDEN)
                else:
                    result = embed_chunk(reqs, encoder, cache=cache).embedding
                    got = torch.empty(0, HIDDEN) if result is None else result
            except MMScheduleError as exc:
                if fault == "none":
                    problems.append(f"step without a fault raised {exc!r}")
                elif f"item hash {victim}" not in str(exc):
                    problems.append(f"{fault} fault on {victim}, error names another item: {exc}")
                outcomes["refused"] += 1
                continue
            except RuntimeError as exc:
                if fault != "raise":
                    problems.append(f"unexpected {exc!r}")
                outcomes["refused"] += 1
                continue
            want = naive_reference(reqs)
            if fault == "dtype" and got.dtype == torch.float64 and torch.equal(got.float(), want):
                # The faulty output met no entry of its modality to be held to (others' steps had
                # just evicted them): the step takes its dtype, and the cache the change only
                # until another step's outputs undo it (test_learned_layouts).
                outcomes["right"] += 1
                continue
            if not torch.equal(got, want):
                problems.append(f"{fault} fault on {victim} ({'fused' if fused else 'packed'}): rows differ")
            outcomes["right"] += 1

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert problems == []
    assert outcomes["right"] > 20 and outcomes["refused"] > 10, outcomes  # both kinds of step really ran
    held = _keys(cache)
    assert held, "the cache should hold the last steps' items"
    for key in held:
        entry = cache.lookup(key)
        assert torch.equal(entry, truth(key, entry.shape[0])), key


def _placeholder_rows(reqs: list[RequestChunk]) -> list[int]:
    rows, base = [], 0
    for req in reqs:
        positions = sorted({p for it in req.items for s, e in it.offsets for p in range(s, e + 1)})
        rows += [base + p - req.prefix for p in positions if req.prefix <= p < req.prefix + req.extend]
        base += req.extend
    return rows


@STEP
def test_a_faulty_step_leaves_the_cache_as_it_was(backend):
    cache = EmbeddingCache(1 << 20)
    embed_chunk(_step(1), CountingEncoder(), cache=cache)
    before = cache.stats()
    reqs = [RequestChunk(items=[image(1, 0, 3), image(2, 3, 3)], prefix=0, extend=6)]
    for fault in FAULTS[1:]:
        with pytest.raises((EncoderOutputError, EmbeddingLengthMismatch, RuntimeError)):
            embed_chunk(reqs, Encoder(_FaultyEncoder(fault, 2)), cache=cache)
        assert _keys(cache) == [1]
    after = cache.stats()
    assert (after.discarded, after.evictions, after.insertions) == (before.discarded, before.evictions,
                                                                      before.insertions)
