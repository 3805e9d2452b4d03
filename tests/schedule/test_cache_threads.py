"""Concurrent readers and writers keep the cache's accounting exact."""

import random
import threading

import torch

from mm_schedule import EmbeddingCache

ROW = 4 * 4


def test_concurrent_readers_and_writers():
    cache = EmbeddingCache(40 * ROW)
    tensors = {k: torch.full((1 + k % 5, 4), float(k)) for k in range(64)}
    lookups = [0] * 8
    errors = []
    barrier = threading.Barrier(8)

    def worker(idx):
        rng = random.Random(idx)
        barrier.wait()
        try:
            for _ in range(3000):
                k = rng.randrange(64)
                op = rng.random()
                if op < 0.45:
                    got = cache.lookup(k)
                    lookups[idx] += 1
                    if got is not None and not torch.equal(got, tensors[k]):
                        errors.append(f"key {k} returned another key's value")
                elif op < 0.6:
                    keys = rng.sample(range(64), 4)
                    got, _ = cache.lookup_many(keys, [tensors[j].shape[0] for j in keys])
                    lookups[idx] += len(keys)
                    for j, t in zip(keys, got):
                        if t is not None and not torch.equal(t, tensors[j]):
                            errors.append(f"key {j} returned another key's value")
                elif op < 0.8:
                    cache.insert(k, tensors[k])
                elif op < 0.9:
                    keys = rng.sample(range(64), 3)
                    cache.insert_many([(j, tensors[j]) for j in keys], protect=[k])
                elif op < 0.95:
                    cache.discard(k)
                else:
                    with cache.pin([k]):
                        pass
        except Exception as exc:  # surfaced below; a thread's exception is otherwise lost
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    assert errors == []
    s = cache.stats()
    held = sum(tensors[k].untyped_storage().nbytes() for k in range(64) if cache.contains(k))
    assert s.bytes == held <= cache.max_bytes
    assert s.hits + s.misses == sum(lookups)
    assert s.entries == len(cache)
