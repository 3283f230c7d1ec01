"""KVCacheManager / BlockPool: allocation, reference counts, prefix caching, LRU eviction."""

from __future__ import annotations

import pytest

from surge.core.kv_cache_manager import BlockPool, KVCacheManager
from surge.request import Request
from surge.sampling_params import SamplingParams

BS = 8


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4))


def _compute(kv: KVCacheManager, req: Request, cached: bool = True) -> None:
    """Admit ``req`` (with its prefix-cache hits) and mark its whole prompt computed."""
    blocks, n_cached = kv.get_computed_blocks(req) if cached else ([], 0)
    assert kv.allocate_slots(req, req.num_tokens - n_cached, blocks)
    req.num_computed_tokens = req.num_tokens


def _assert_clean(kv: KVCacheManager) -> None:
    assert kv.num_free_blocks == kv.num_total_blocks
    assert all(c == 0 for c in kv.pool.ref_counts)
    assert kv.usage == 0.0


def test_allocate_ceil_blocks_and_free() -> None:
    kv = KVCacheManager(10, BS, enable_prefix_caching=False)
    r = _req("a", list(range(20)))
    assert kv.allocate_slots(r, 20)
    assert len(r.block_ids) == 3  # ceil(20 / 8)
    assert len(set(r.block_ids)) == 3
    assert kv.num_free_blocks == 7
    assert kv.usage == pytest.approx(0.3)
    r.num_computed_tokens = 20
    assert kv.allocate_slots(r, 4)  # 24 tokens still fit in 3 blocks
    assert len(r.block_ids) == 3
    r.num_computed_tokens = 24
    assert kv.allocate_slots(r, 1)  # the 25th token needs a 4th block
    assert len(r.block_ids) == 4
    kv.free(r)
    assert r.block_ids == []
    _assert_clean(kv)


def test_allocate_fails_without_change() -> None:
    kv = KVCacheManager(4, BS, enable_prefix_caching=True)
    a = _req("a", list(range(24)))
    assert kv.allocate_slots(a, 24)
    b = _req("b", list(range(100, 116)))
    assert not kv.allocate_slots(b, 16)
    assert b.block_ids == [] and kv.num_free_blocks == 1
    assert not kv.allocate_slots(b, 8, num_reserved_blocks=1)  # the watermark
    assert b.block_ids == [] and kv.num_free_blocks == 1
    assert kv.allocate_slots(b, 8)
    assert kv.num_free_blocks == 0
    kv.free(a)
    kv.free(b)
    _assert_clean(kv)


def test_block_pool_rejects_double_release_and_overallocation() -> None:
    pool = BlockPool(2)
    with pytest.raises(ValueError):
        pool.allocate(3)
    (b,) = pool.allocate(1)
    pool.release(b, keep_hash=False)
    with pytest.raises(RuntimeError):
        pool.release(b, keep_hash=False)
    pool.allocate(2)
    with pytest.raises(ValueError, match="cannot allocate 1 KV block, only 0 free"):
        pool.allocate(1)


def test_prefix_hit_on_shared_prefix() -> None:
    kv = KVCacheManager(20, BS, enable_prefix_caching=True)
    prefix = list(range(1, 33))  # 4 full blocks
    a = _req("a", prefix + [90, 91, 92])
    _compute(kv, a)
    assert kv.num_free_blocks == 15
    b = _req("b", prefix + [70, 71, 72, 73, 74])
    blocks, n_cached = kv.get_computed_blocks(b)
    assert n_cached == 32
    assert blocks == a.block_ids[:4]
    assert kv.allocate_slots(b, b.num_tokens - n_cached, blocks)
    b.num_computed_tokens = n_cached
    assert b.block_ids[:4] == a.block_ids[:4]
    assert kv.num_free_blocks == 14  # only one new block for b's tail
    assert all(kv.pool.ref_counts[x] == 2 for x in a.block_ids[:4])
    assert kv.prefix_cache_hit_tokens == 32
    assert kv.prefix_cache_query_tokens == a.num_tokens + b.num_tokens
    kv.free(a)
    kv.free(b)
    _assert_clean(kv)


def test_different_first_block_gives_no_hit() -> None:
    kv = KVCacheManager(20, BS, enable_prefix_caching=True)
    a = _req("a", list(range(1, 33)))
    _compute(kv, a)
    # Same blocks 1..3 but a different block 0: the chained hash differs everywhere.
    b = _req("b", [0] + list(range(2, 33)))
    assert kv.get_computed_blocks(b) == ([], 0)


def test_cache_salt_isolates_prefixes() -> None:
    """vLLM's cache_salt: the salt enters the first block's hash, so the same tokens hit only
    under the same salt (and an unsalted request never hits a salted one's blocks, or back)."""
    kv = KVCacheManager(40, BS, enable_prefix_caching=True)
    tokens = list(range(1, 34))  # 4 full blocks + 1 token
    a = Request("a", tokens, SamplingParams(max_tokens=4), cache_salt="tenant-a")
    _compute(kv, a)
    others = {}
    for salt in ("tenant-b", None):
        other = Request(f"b-{salt}", tokens, SamplingParams(max_tokens=4), cache_salt=salt)
        assert kv.get_computed_blocks(other) == ([], 0), salt
        _compute(kv, other)  # its own blocks, under its own hashes
        assert not set(other.block_ids) & set(a.block_ids)
        others[salt] = other
    same = Request("c", tokens[:17] + [99] * 10, SamplingParams(max_tokens=4), cache_salt="tenant-a")
    assert kv.get_computed_blocks(same) == (a.block_ids[:2], 16)  # the chain carries the salt on
    b_again = Request("d", tokens, SamplingParams(max_tokens=4), cache_salt="tenant-b")
    assert kv.get_computed_blocks(b_again) == (others["tenant-b"].block_ids[:4], 32)
    assert kv.get_computed_blocks(_req("e", tokens)) == (others[None].block_ids[:4], 32)


def test_whole_prompt_is_never_cached() -> None:
    kv = KVCacheManager(20, BS, enable_prefix_caching=True)
    a = _req("a", list(range(1, 17)))  # exactly 2 blocks
    _compute(kv, a)
    b = _req("b", list(range(1, 17)))
    blocks, n_cached = kv.get_computed_blocks(b)
    assert n_cached == 8 and blocks == a.block_ids[:1]  # the last token is computed again
    c = _req("c", list(range(1, 9)))  # one block, identical to a's first
    assert kv.get_computed_blocks(c) == ([], 0)


def test_prefix_caching_disabled() -> None:
    kv = KVCacheManager(20, BS, enable_prefix_caching=False)
    a = _req("a", list(range(1, 33)))
    _compute(kv, a)
    assert kv.get_computed_blocks(_req("b", list(range(1, 40)))) == ([], 0)
    assert kv.pool.hash_to_block == {}


def test_sibling_hits_blocks_registered_in_same_step() -> None:
    kv = KVCacheManager(20, BS, enable_prefix_caching=True)
    prompt = list(range(1, 25))
    a = _req("a", prompt)
    assert kv.allocate_slots(a, 24)  # scheduled, not computed yet
    b = _req("b", prompt + [5])
    blocks, n_cached = kv.get_computed_blocks(b)
    assert n_cached == 24 and blocks == a.block_ids


def test_chunk_registers_only_blocks_full_after_the_step() -> None:
    kv = KVCacheManager(20, BS, enable_prefix_caching=True)
    a = _req("a", list(range(1, 41)))
    assert kv.allocate_slots(a, 12)  # 1 full block + half of the second
    assert len(kv.pool.hash_to_block) == 1
    a.num_computed_tokens = 12
    assert kv.allocate_slots(a, 12)  # now 24 tokens: blocks 0..2 full
    assert len(kv.pool.hash_to_block) == 3
    assert [kv.pool.block_hashes[b] is not None for b in a.block_ids] == [True, True, True]


def test_free_drops_hash_of_uncomputed_blocks() -> None:
    kv = KVCacheManager(20, BS, enable_prefix_caching=True)
    prompt = list(range(1, 33))
    a = _req("a", prompt)
    assert kv.allocate_slots(a, 32)
    assert len(kv.pool.hash_to_block) == 4
    a.num_computed_tokens = 16  # only the first 2 blocks were computed
    kv.free(a)
    assert len(kv.pool.hash_to_block) == 2
    b = _req("b", prompt + [1])
    _, n_cached = kv.get_computed_blocks(b)
    assert n_cached == 16
    c = _req("c", prompt)
    assert kv.allocate_slots(c, 32)
    kv.free(c)  # nothing computed: every hash c registered is dropped
    assert len(kv.pool.hash_to_block) == 2
    _assert_clean(kv)


def test_lru_eviction_of_cached_blocks() -> None:
    kv = KVCacheManager(4, BS, enable_prefix_caching=True)
    pa, pb = list(range(1, 17)), list(range(101, 117))
    a, b = _req("a", pa), _req("b", pb)
    _compute(kv, a)
    a_blocks = list(a.block_ids)
    kv.free(a)  # a's blocks cached, freed first (least recently)
    _compute(kv, b)
    kv.free(b)
    assert kv.num_free_blocks == 4 and len(kv.pool.hash_to_block) == 4
    c = _req("c", list(range(201, 217)))
    _compute(kv, c, cached=False)  # needs 2 blocks: evicts a's, not b's
    assert sorted(c.block_ids) == sorted(a_blocks)
    assert kv.get_computed_blocks(_req("a2", pa + [0])) == ([], 0)
    blocks, n_cached = kv.get_computed_blocks(_req("b2", pb + [0]))
    assert n_cached == 16 and len(blocks) == 2


def test_uncached_free_blocks_are_used_before_evicting() -> None:
    kv = KVCacheManager(4, BS, enable_prefix_caching=True)
    a = _req("a", list(range(1, 17)))
    _compute(kv, a)
    kv.free(a)
    cached_ids = {b for b in range(4) if kv.pool.block_hashes[b] is not None}
    assert len(cached_ids) == 2
    c = _req("c", list(range(201, 217)))
    _compute(kv, c, cached=False)
    assert not cached_ids & set(c.block_ids)
    assert len(kv.pool.hash_to_block) == 4
    _, n_cached = kv.get_computed_blocks(_req("a2", list(range(1, 17)) + [0]))
    assert n_cached == 16


def test_hit_on_free_cached_block_takes_it_off_free_list() -> None:
    kv = KVCacheManager(6, BS, enable_prefix_caching=True)
    prompt = list(range(1, 25))
    a = _req("a", prompt)
    _compute(kv, a)
    kv.free(a)
    assert kv.num_free_blocks == 6
    b = _req("b", prompt + [7, 8])
    blocks, n_cached = kv.get_computed_blocks(b)
    assert n_cached == 24
    # 3 cached free blocks are taken plus 1 new block for tokens 24..25.
    assert kv.num_blocks_to_allocate(b, 2, blocks) == 4
    assert kv.allocate_slots(b, 2, blocks)
    assert kv.num_free_blocks == 2
    assert all(not kv.pool.is_free(x) for x in b.block_ids)
    # Allocating the rest never hands out b's cached blocks.
    c = _req("c", list(range(300, 316)))
    assert kv.allocate_slots(c, 16)
    assert not set(c.block_ids) & set(b.block_ids)
    assert not kv.allocate_slots(_req("d", [1]), 1)
    kv.free(b)
    kv.free(c)
    _assert_clean(kv)


def test_reused_cached_block_loses_old_hash() -> None:
    kv = KVCacheManager(2, BS, enable_prefix_caching=True)
    a = _req("a", list(range(1, 17)))
    _compute(kv, a)
    kv.free(a)
    old_hashes = set(kv.pool.hash_to_block)
    c = _req("c", list(range(50, 66)))
    _compute(kv, c, cached=False)
    assert not old_hashes & set(kv.pool.hash_to_block)
    for h, b in kv.pool.hash_to_block.items():
        assert kv.pool.block_hashes[b] == h


def test_reset_prefix_cache_evicts_only_unreferenced_blocks() -> None:
    kv = KVCacheManager(20, BS, enable_prefix_caching=True)
    prefix = list(range(1, 33))  # 4 full blocks
    done = _req("done", prefix + [90])
    _compute(kv, done)
    kv.free(done)  # its 4 full blocks stay cached while free
    running = _req("running", list(range(100, 124)) + [5])
    _compute(kv, running)  # 3 full blocks, held
    assert kv.reset_prefix_cache() == 4
    assert kv.get_computed_blocks(_req("again", prefix + [91])) == ([], 0)  # the free ones are gone
    blocks, n = kv.get_computed_blocks(_req("sibling", list(range(100, 124)) + [6]))
    assert n == 24 and blocks == running.block_ids[:3]  # the held ones still serve hits
    assert kv.reset_prefix_cache() == 0
    kv.free(running)
    _assert_clean(kv)
