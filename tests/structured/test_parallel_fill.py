"""The step mask filled on several threads (the engine's thread plus a persistent pool) is the
mask filled row by row on one thread, and the pool's threads are started once, not per step."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np

from surge.request import Request
from surge.sampling_params import SamplingParams, StructuredOutputsParams
from surge.structured.manager import BATCH_FILL_MIN_ROWS, StructuredOutputManager

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "tags"],
}


def _allowed(row: np.ndarray, vocab: int) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab])


def _manager(model: Path, threads: int, rows: int) -> tuple[StructuredOutputManager, list[Request]]:
    manager = StructuredOutputManager(str(model), 151936, (151645,), "cpu")
    manager._fill_threads = threads
    params = SamplingParams(
        max_tokens=64, ignore_eos=True, structured_outputs=StructuredOutputsParams(json=json.dumps(SCHEMA))
    )
    requests = [Request(f"r{i}", [1, 2, 3], params, frozenset({151645})) for i in range(rows)]
    for r in requests:
        manager.add(r)
    for _ in range(600):
        ready, failed = manager.take_ready()
        assert not failed
        if ready:
            break
        manager.wait(0.1)
    assert len(manager.grammars) == rows
    return manager, requests


def _packed(manager: StructuredOutputManager, n: int, rows: int) -> np.ndarray:
    mask, row_ids = manager.buffer.filled_views(n)
    packed = np.full((rows, mask.shape[1]), -1, dtype=np.int32)
    packed[row_ids.numpy()] = mask.numpy()
    return packed


def test_parallel_fill_matches_one_thread(qwen3_vocab_dir: Path) -> None:
    rows = 4 * BATCH_FILL_MIN_ROWS  # four threads: the engine's and three pool workers
    one, req_one = _manager(qwen3_vocab_dir, 1, rows)
    four, req_four = _manager(qwen3_vocab_dir, 4, rows)
    rng = np.random.default_rng(0)
    pool_threads: set[threading.Thread] = set()
    try:
        for _step in range(24):
            n1 = one.fill(req_one, one.grammars)
            n4 = four.fill(req_four, four.grammars)
            assert n1 == n4 == rows
            a, b = _packed(one, n1, rows), _packed(four, n4, rows)
            np.testing.assert_array_equal(a, b)
            assert four._fill_pool is not None
            pool_threads |= set(four._fill_pool._threads)
            # every row draws a random allowed token, the same for both managers
            for i in range(rows):
                token = int(rng.choice(_allowed(a[i], 151936)))
                req_one[i].output_token_ids.append(token)
                req_four[i].output_token_ids.append(token)
        # three pool workers, started once for all 24 steps
        assert len(pool_threads) == 3
        assert all(t.name.startswith("surge-grammar-fill") for t in pool_threads)
        # rows reached strings and arrays: masks that differ between rows
        assert len({bytes(r) for r in _packed(one, one.fill(req_one, one.grammars), rows)}) > 1
    finally:
        one.close()
        four.close()
    assert not any(t.is_alive() for t in pool_threads)
