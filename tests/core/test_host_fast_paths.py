"""The loop-free host paths of a long prompt (issue 14) give what the per-element loops gave."""

from __future__ import annotations

import hashlib
import random
import struct

import pytest

from surge.core.kv_cache_manager import BlockPool, KVCacheManager
from surge.request import Request, token_ids_in_range
from surge.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("ids", "ok"),
    [
        ([], True),
        ([0], True),
        ([99], True),
        ([5, 0, 99, 3], True),
        ([-1], False),
        ([100], False),
        ([3, 4, 100, 5], False),
        ([3, -7, 5], False),
        ([2**70], False),
        ([-(2**70), 3], False),
    ],
)
def test_token_ids_in_range(ids: list[int], ok: bool) -> None:
    assert token_ids_in_range(ids, 100) is ok
    assert ok == (not any(not 0 <= t < 100 for t in ids))


def _state(pool: BlockPool) -> tuple[list[int], list[int | None], dict[int, int], list[int]]:
    return list(pool.ref_counts), list(pool.block_hashes), dict(pool.hash_to_block), list(pool._free)


def test_pool_loops_match_the_single_block_calls() -> None:
    rng = random.Random(0)
    a, b = BlockPool(64), BlockPool(64)
    tables: list[list[int]] = []
    for _ in range(300):
        if tables and rng.random() < 0.4:
            blocks = tables.pop(rng.randrange(len(tables)))
            keep = rng.randrange(len(blocks) + 1)
            for i in range(len(blocks) - 1, -1, -1):
                a.release(blocks[i], keep_hash=i < keep)
            b.release_all(blocks, keep)
        elif rng.random() < 0.5 and a.hash_to_block:
            cached = rng.sample(sorted(a.hash_to_block.values()), min(3, len(a.hash_to_block)))
            for blk in cached:
                a.touch(blk)
            b.touch_all(cached)
            tables.append(cached)
        elif a.num_free >= 4:
            n = rng.randrange(1, 5)
            blocks = a.allocate(n)
            assert b.allocate(n) == blocks
            # Some hashes repeat an earlier block's content: the first holder keeps it.
            hashes = [bytes([rng.randrange(40), i]) for i in range(n)]
            for blk, h in zip(blocks, hashes, strict=True):
                a.register(blk, h)
            b.register_all(blocks, hashes)
            tables.append(blocks)
        assert _state(a) == _state(b)


def test_release_all_refuses_a_double_release() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    pool.release_all(blocks, 2)
    with pytest.raises(RuntimeError, match="released more often"):
        pool.release_all(blocks, 2)


@pytest.mark.parametrize("num_outputs", [0, 5, 16, 40])
def test_block_hashes_chain_over_prompt_and_outputs(num_outputs: int) -> None:
    bs = 16
    rng = random.Random(num_outputs)
    req = Request("r", [rng.randrange(1000) for _ in range(70)], SamplingParams(max_tokens=64))
    req.output_token_ids = [rng.randrange(1000) for _ in range(num_outputs)]
    tokens = req.prompt_token_ids + req.output_token_ids
    # SHA-256 chain (vLLM's default hash; Python's tuple hash let a client craft a colliding
    # block and poison a known prompt's cache): parent hash, then the block's ids as int32
    expected, parent = [], bytes(32)
    for i in range(len(tokens) // bs):
        block = tokens[i * bs : (i + 1) * bs]
        parent = hashlib.sha256(parent + struct.pack(f"<{bs}i", *block)).digest()
        expected.append(parent)
    kv = KVCacheManager(32, bs, enable_prefix_caching=True)
    # Built in two calls (as a running request is), then all at once in a fresh manager.
    assert kv._block_hashes(req, 2) == expected[:2]
    assert kv._block_hashes(req, len(expected)) == expected
    assert KVCacheManager(32, bs, True)._block_hashes(req, len(expected)) == expected
