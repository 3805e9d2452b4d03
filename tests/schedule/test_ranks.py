"""Ranks of a process group (spawned processes, gloo on CPU) scheduling the same steps.

One spawn of four processes runs every scenario of ``rank_scenarios`` in two 2-rank
groups and the 4-rank group (process start-up dominates the cost); the tests below
check the records against the single-process reference computed here.
"""

from __future__ import annotations

import importlib
import os
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from mm_schedule import EmbeddingCache, MMItem, RequestChunk, embed_chunk
from mm_schedule.errors import RankCommunicationError, RankTimeoutError
from mm_schedule.ranks.group import RankGroup
from mm_schedule.ranks.shards import assign_shards, shares

from .evs_inputs import naive_step
from .helpers import HIDDEN, CountingEncoder, naive_reference

HERE = Path(__file__).parent


WORLD = 4


@pytest.fixture(scope="module")
def spawned():
    """Records of one spawn of four processes: per group size, per group, per rank."""
    # Spawned processes import the scenarios by module name, from the sys.path they inherit.
    sys.path.insert(0, str(HERE))
    try:
        scenarios = importlib.import_module("rank_scenarios")
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(
                scenarios.run_rank,
                args=(WORLD, os.path.join(tmp, "rendezvous"), tmp),
                nprocs=WORLD,
                start_method="spawn",
            )
            records = [torch.load(f"{tmp}/rank{r}.pt", weights_only=False) for r in range(WORLD)]
    finally:
        sys.path.remove(str(HERE))
    groups = {2: [[records[0][2], records[1][2]], [records[2][2], records[3][2]]], 4: [[r[4] for r in records]]}
    return scenarios, groups


@pytest.fixture(params=[(2, 0), (2, 1), (4, 0)], ids=["2-ranks-0-1", "2-ranks-2-3", "4-ranks"])
def run(request, spawned):
    scenarios, groups = spawned
    world, index = request.param
    return world, scenarios, groups[world][index]


def _fused_reference(reqs) -> torch.Tensor:
    """NaN rows everywhere but the placeholders, which hold the reference rows."""
    rows = iter(naive_reference(reqs))
    out = torch.full((sum(r.extend for r in reqs), HIDDEN), float("nan"))
    base = 0
    for r in reqs:
        for p in range(r.prefix, r.prefix + r.extend):
            if any(s <= p <= e for it in r.items for s, e in it.offsets):
                out[base + p - r.prefix] = next(rows)
        base += r.extend
    return out


def _same(a, b) -> bool:
    """Bit-equal, NaN poison included; a step with no rows (None) equals an empty tensor."""
    a, b = (torch.empty(0, HIDDEN) if t is None else t for t in (a, b))
    return a.shape == b.shape and torch.equal(a.nan_to_num(7.5), b.nan_to_num(7.5))


STEP_RUNS = [(parallel, fused) for parallel in (False, True) for fused in (False, True)]


def _step_runs(world, scenarios, records):
    for parallel, fused in STEP_RUNS:
        batches = scenarios.steps(world * 10 + fused)
        per_rank = [rec[("steps", parallel, fused)] for rec in records]
        assert all(len(r) == len(batches) for r in per_rank)
        yield parallel, fused, batches, per_rank


def test_every_rank_returns_the_single_process_result(run):
    world, scenarios, records = run
    for _parallel, fused, batches, per_rank in _step_runs(world, scenarios, records):
        single_cache = EmbeddingCache(1 << 20)
        for i, reqs in enumerate(batches):
            expected = _fused_reference(reqs) if fused else naive_reference(reqs)
            single = embed_chunk(reqs, CountingEncoder(), cache=single_cache)
            if not fused:
                assert _same(single.embedding, expected)
            for rank in range(world):
                assert _same(per_rank[rank][i]["output"], expected), (fused, i, rank)


def test_ranks_agree_on_hits_and_misses_whatever_their_caches_hold(run):
    world, scenarios, records = run
    disagreements = 0
    for _parallel, _fused, batches, per_rank in _step_runs(world, scenarios, records):
        for i in range(len(batches)):
            steps = [per_rank[r][i] for r in range(world)]
            assert all(s["status"] == steps[0]["status"] for s in steps)
            assert all(s["keys"] == steps[0]["keys"] for s in steps)
            for k, status in enumerate(steps[0]["status"]):
                held = [s["held"][k] for s in steps]
                assert status == ("hit" if all(held) else "miss")
                disagreements += len(set(held)) > 1
            if i == scenarios.JOIN_STEP:  # the rank that joined with an empty cache held nothing
                assert not any(steps[world - 1]["held"])
    assert disagreements > 10  # the budgets and histories really made the ranks differ


def test_encoder_work_per_rank(run):
    world, scenarios, records = run
    for parallel, _fused, batches, per_rank in _step_runs(world, scenarios, records):
        for i in range(len(batches)):
            steps = [per_rank[r][i] for r in range(world)]
            status, hashes, rows = steps[0]["status"], steps[0]["source_hashes"], steps[0]["rows"]
            misses = [k for k, st in enumerate(status) if st == "miss"]
            for s in steps:
                assert s["calls"] == s["reported_calls"]
            if not parallel:  # every rank encodes every agreed miss
                expected = Counter(h for k in misses for h in hashes[k])
                assert all(Counter(s["encoded"]) == expected for s in steps)
                continue
            # Each miss is encoded by exactly one rank: its owner under the token-balanced split.
            owned = shares(assign_shards([rows[k] for k in misses], world), world)
            for rank, s in enumerate(steps):
                assert Counter(s["encoded"]) == Counter(h for j in owned[rank] for h in hashes[misses[j]])
            total = Counter(h for s in steps for h in s["encoded"])
            assert total == Counter(h for k in misses for h in hashes[k])


def test_caches_hold_only_right_rows(run):
    world, scenarios, records = run
    for _parallel, _fused, _batches, per_rank in _step_runs(world, scenarios, records):
        assert all(step["cached_right"] for rank_steps in per_rank for step in rank_steps)


@pytest.mark.parametrize("parallel", [False, True], ids=["every-rank-encodes", "encoder-parallel"])
@pytest.mark.parametrize("mode", ["raise", "short", "hidden"])
def test_fault_on_one_rank_raises_the_same_error_everywhere(run, parallel, mode):
    world, scenarios, records = run
    seen = [rec[("faults", parallel, mode)] for rec in records]
    errors = [s["error"] for s in seen]
    assert all(e is not None and e["type"] == "RankFaultError" for e in errors)
    assert all(e == errors[0] for e in errors)  # same message, rank, request and item on every rank
    error = errors[0]
    assert error["rank"] == 1
    assert scenarios.FRESH <= error["item_hash"] < scenarios.FRESH + 10 * world
    assert 0 <= error["request"] < world
    assert f"item hash {error['item_hash']}" in error["message"]
    cause = {"raise": "simulated encoder crash", "short": "EmbeddingLengthMismatch", "hidden": "EncoderOutputError"}
    assert cause[mode] in error["message"]
    for s in seen:
        assert s["fresh_cached"] == []  # nothing of the failed step was inserted anywhere
        assert s["warm_cached"] == [True, True]  # a faulty output (a wider one too) evicts nothing correct
        assert _same(s["after"], naive_reference(scenarios.fault_step(world)))


def test_sglang_compatible_function_takes_the_group_from_the_step_context(run):
    world, scenarios, records = run
    batches = [scenarios.images_only(reqs) for reqs in scenarios.steps(world * 10 + 5)]
    for rec in records:
        assert len(rec["compat"]["outputs"]) == len(batches)
        for got, reqs in zip(rec["compat"]["outputs"], batches):
            assert _same(got, naive_reference(reqs))
    # The misses were shared out, not encoded on every rank: together the ranks encoded
    # what one process with the same (ample) cache encodes.
    single, cache = CountingEncoder(), EmbeddingCache(1 << 20)
    for reqs in batches:
        embed_chunk(reqs, single, cache=cache)
    assert sum(rec["compat"]["encoded"] for rec in records) == single.items_encoded > 0


def test_an_unfit_cached_entry_on_one_rank_fails_the_step_everywhere_then_heals(run):
    world, scenarios, records = run
    errors = [rec["bad_entry"]["error"] for rec in records]
    assert all(e is not None and e["type"] == "RankFaultError" for e in errors)
    assert all(e == errors[0] for e in errors)
    assert errors[0]["rank"] == 1 and "CachedEmbeddingError" in errors[0]["message"]
    assert errors[0]["item_hash"] == 7 and errors[0]["request"] == 0
    expected = naive_reference(scenarios.fault_step(world))
    for rec in records:
        # Rank 1 evicted the entry, so the next step agrees it is a miss: re-encoded
        # (by every rank, the default mode) and right on every rank.
        assert _same(rec["bad_entry"]["after"], expected)
        assert rec["bad_entry"]["encoded_after"] == [[7]]
        assert rec["bad_entry"]["entry_right"]


def test_steps_with_more_keys_than_the_first_agreement_round(run):
    world, scenarios, records = run
    expected_status = [
        "hit" if all(i % (rank + 2) == 0 for rank in range(world)) else "miss" for i in range(scenarios.MANY)
    ]
    assert "hit" in expected_status[252:]  # the second round decides some hits
    expected = naive_reference(scenarios.many_keys_step())
    for rec in records:
        assert rec["many_keys"]["status"] == expected_status
        assert _same(rec["many_keys"]["output"], expected)


def test_precomputed_embeddings_across_ranks(run):
    _world, scenarios, records = run
    expected = naive_reference(scenarios.precomputed_step())
    assert all(_same(rec["precomputed"], expected) for rec in records)


def test_encoder_parallel_step_with_a_dtype_per_modality(run):
    world, scenarios, records = run
    expected = _fused_reference(scenarios.mixed_step(world))
    assert all(_same(rec["mixed_dtypes"], expected) for rec in records)


def test_ranks_scheduling_different_batches_all_raise(run):
    _world, _scenarios, records = run
    errors = [rec["mismatch"]["error"] for rec in records]
    assert all(e is not None and e["type"] == "RankMismatchError" for e in errors)
    assert all(e["message"] == errors[0]["message"] for e in errors)
    assert all(rec["mismatch"]["cached"] == 0 for rec in records)
    items = [MMItem(hash=h, offsets=[(3 * h, 3 * h + 1)]) for h in range(2)]
    expected = naive_reference([RequestChunk(items=items, prefix=0, extend=12)])
    assert all(_same(rec["mismatch"]["after"], expected) for rec in records)


def test_a_rank_that_never_arrives_is_a_timeout_error(run):
    world, _scenarios, records = run
    errors = [rec["absent"]["error"] for rec in records]
    assert errors[world - 1] is None  # the absent rank never called the scheduler
    for e in errors[: world - 1]:
        assert e is not None and e["type"] == "RankTimeoutError", e


# -- the pieces every rank computes alike, without processes ---------------------------------


def test_shards_are_balanced_by_tokens_and_deterministic():
    rng = random.Random(0)
    for _ in range(300):
        world = rng.randint(1, 8)
        tokens = [rng.choice([1, 4, 64, 729, 729 * 8]) for _ in range(rng.randint(0, 30))]
        owners = assign_shards(tokens, world)
        assert owners == assign_shards(list(tokens), world)
        assert all(0 <= o < world for o in owners)
        loads = [sum(tokens[i] for i in share) for share in shares(owners, world)]
        if tokens:
            # Greedy onto the least-loaded rank: no rank ends more than one unit above the mean.
            assert max(loads) <= sum(tokens) / world + max(tokens)
    # Token count, not item count: one long video balances against many images.
    assert assign_shards([40, 1, 1, 1, 1], 2) == [0, 1, 1, 1, 1]
    assert assign_shards([3, 3], 4) == [0, 1]
    with pytest.raises(ValueError):
        assign_shards([1], 0)


@pytest.mark.parametrize(
    ("backend_text", "expected"),
    [
        ("[unbound_buffer.cc:78] Timed out waiting 1000ms for recv operation to complete", RankTimeoutError),
        ("Application timeout caused pair closure", RankTimeoutError),
        ("[pair.cc:553] Connection closed by peer [127.0.0.1]:4242", RankCommunicationError),
    ],
)
def test_backend_failures_become_typed_errors(backend_text, expected):
    group = object.__new__(RankGroup)  # only the error translation, no process group
    group.rank, group.size = 1, 4

    def collective():
        raise RuntimeError(backend_text)

    with pytest.raises(expected) as info:
        group._run("agreeing on the step's cache misses", collective)
    assert isinstance(info.value, RankCommunicationError)
    assert (expected is RankTimeoutError) == isinstance(info.value, TimeoutError)
    assert "rank 1 of 4: agreeing on the step's cache misses" in str(info.value)
    assert backend_text in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)



# -- EVS videos ------------------------------------------------------------------------------


def _evs_reference(scenarios, step):
    prompts = scenarios.evs_prompts()
    return naive_step(prompts, scenarios.evs_windows(prompts, step))


def _same_step(got, want) -> bool:
    rows, mask, ids = want
    if not torch.equal(got["ids"], ids):
        return False
    if rows is None:
        return got["rows"] is None
    return got["rows"] is not None and torch.equal(got["rows"], rows) and torch.equal(got["mask"], mask)


@pytest.mark.parametrize("parallel", [False, True], ids=["every-rank-encodes", "encoder-parallel"])
def test_evs_videos_are_agreed_on_like_every_item(run, parallel):
    """Every rank returns the single-process rows, mask and rewritten input_ids at every
    step, although at one step one rank's cache lost a video and another's holds an unfit
    entry: the ranks agree those videos are misses and encode them again, the same videos
    in the same order on every rank (a tensor-parallel tower needs that), or each once by
    its owner with encoder parallelism; afterwards every cache holds the right rows."""
    world, scenarios, records = run
    prompts = scenarios.evs_prompts()
    lose = scenarios.evs_lose_step(prompts)
    per_rank = [rec[("evs", parallel)] for rec in records]
    evs_hashes = {p.video.hash for p in prompts if p.evs}
    for step in range(scenarios.evs_step_count(prompts)):
        want = _evs_reference(scenarios, step)
        for rank in range(world):
            assert _same_step(per_rank[rank]["steps"][step], want), (step, rank)
        calls = [[c for c in per_rank[rank]["steps"][step]["calls"] if c[0] in evs_hashes] for rank in range(world)]
        if not parallel:
            assert all(c == calls[0] for c in calls), (step, calls)
            encoded = calls[0]
        else:
            encoded = [c for rank_calls in calls for c in rank_calls]
            assert len(encoded) == len({c[0] for c in encoded})  # each video by one rank only
        if step == lose:  # lost on one rank, unfit on another: encoded again
            assert sorted(c[0] for c in encoded) == [60_001, 60_002]
        if step > lose:
            assert encoded == []
    for rec in per_rank:
        for p in prompts[:2]:
            rows, counts = rec["held"][p.video.hash]
            assert torch.equal(rows, p.rows) and counts == p.kept


@pytest.mark.parametrize("parallel", [False, True], ids=["every-rank-encodes", "encoder-parallel"])
@pytest.mark.parametrize("mode", ["raise", "ids"])
def test_an_evs_fault_on_one_rank_raises_the_same_error_everywhere(run, parallel, mode):
    """An EVS encoder crash, or input_ids that differ from the processor's prompt, on rank
    1 only: every rank raises the same RankFaultError naming rank 1, the request and the
    video, no rank caches a video of the step, and the step then runs on every rank."""
    _world, scenarios, records = run
    seen = [rec[("evs_faults", parallel, mode)] for rec in records]
    errors = [s["error"] for s in seen]
    assert all(e is not None and e["type"] == "RankFaultError" for e in errors), errors
    assert all(e == errors[0] for e in errors)
    error = errors[0]
    assert error["rank"] == 1 and error["request"] == 0 and error["item_hash"] == 60_001
    assert ("simulated EVS encoder crash" if mode == "raise" else "input_ids differ") in error["message"]
    want = _evs_reference(scenarios, 0)
    for s in seen:
        assert s["held_after_fault"] == {60_001: None, 60_002: None}
        assert _same_step(s["after"], want)


def test_ranks_that_prune_one_video_differently_raise_everywhere_and_cache_nothing(run):
    """Every rank encodes every video (no encoder parallelism); rank 1 keeps other frame
    counts for the first video than the others: every rank raises the same RankFaultError
    naming the video and each rank's counts, no rank caches a video of the step, and the
    step then runs on every rank once they prune alike."""
    _world, scenarios, records = run
    seen = [rec["evs_divergent"] for rec in records]
    errors = [s["error"] for s in seen]
    assert all(e is not None and e["type"] == "RankFaultError" for e in errors), errors
    assert all(e == errors[0] for e in errors)
    assert errors[0]["item_hash"] == 60_001 and errors[0]["rank"] == 1 and errors[0]["request"] == 0
    assert "pruned it to different frame token counts" in errors[0]["message"]
    assert "rank 0: [" in errors[0]["message"] and "rank 1: [" in errors[0]["message"]
    want = _evs_reference(scenarios, 0)
    for s in seen:
        assert s["held_after_fault"] == {60_001: None, 60_002: None}
        assert _same_step(s["after"], want)


def _whole_reference(scenarios):
    prompts = scenarios.evs_prompts()
    return prompts, naive_step(prompts, scenarios.evs_whole_windows(prompts))


def _same_snapshot(a, b) -> bool:
    if (a["entries"], a["bytes"], a["held"].keys()) != (b["entries"], b["bytes"], b["held"].keys()):
        return False
    for h, x in a["held"].items():
        y = b["held"][h]
        if (x is None) != (y is None) or (x is not None and (not torch.equal(x[0], y[0]) or x[1] != y[1])):
            return False
    return True


def _holds_the_right_rows(snapshot, prompts) -> bool:
    for p in prompts:
        got = snapshot["held"][p.video.hash]
        if got is None or not torch.equal(got[0], p.rows) or got[1] != (p.kept if p.evs else None):
            return False
    return True


def _same_divergence_everywhere(seen) -> dict:
    errors = [s["error"] for s in seen]
    assert all(e is not None and e["type"] == "RankFaultError" for e in errors), errors
    assert all(e == errors[0] for e in errors)
    error = errors[0]
    assert error["item_hash"] == 60_001 and error["rank"] == 1 and error["request"] == 0
    assert "request 0, EVS video item hash 60001" in error["message"]
    assert "pruned it to different frame token counts" in error["message"]
    return error


def test_a_divergent_video_leaves_every_cache_as_it_was_plain_video_included(run):
    """The plain multi-span video of the call is planned, encoded and checked before the
    EVS videos meet, but the call fails when rank 1 prunes the first EVS video
    differently: every rank raises the same RankFaultError and its cache is exactly what
    it was before the call (the plain video not cached, the second video's entry kept).
    The same call with every rank pruning alike then returns the single-process rows,
    mask and input_ids on every rank and caches every video's right rows."""
    _world, scenarios, records = run
    seen = [rec["evs_divergent_plain"] for rec in records]
    _same_divergence_everywhere(seen)
    prompts, want = _whole_reference(scenarios)
    for s in seen:
        assert s["before"]["held"][60_002] is not None and s["before"]["held"][60_003] is None
        assert _same_snapshot(s["after_fault"], s["before"])
        assert s["after"]["error"] is None, s["after"]["error"]
        assert _same_step(s["after"], want)
        assert _holds_the_right_rows(s["held"], prompts)


def test_divergent_cached_videos_are_evicted_everywhere_then_encoded_again(run):
    """Every rank holds both EVS videos, rank 1 the first with other frame counts: the
    ranks agree it is a hit, then find the counts differ. Every rank raises the same
    RankFaultError and evicts that entry (not the agreed second one), so the next call
    encodes it again on every rank, agrees, and returns the single-process result."""
    _world, scenarios, records = run
    seen = [rec["evs_divergent_cached"] for rec in records]
    error = _same_divergence_everywhere(seen)
    assert "every rank evicted the video" in error["message"]
    prompts, want = _whole_reference(scenarios)
    second = prompts[1]
    for s in seen:
        held = s["after_fault"]["held"]
        assert held[60_001] is None and held[60_003] is None
        assert torch.equal(held[60_002][0], second.rows) and held[60_002][1] == second.kept
        assert s["after"]["error"] is None, s["after"]["error"]
        assert _same_step(s["after"], want)
        assert [c for c in s["after"]["calls"] if c[0] != 60_003] == [[60_001]]
        assert _holds_the_right_rows(s["held"], prompts)
