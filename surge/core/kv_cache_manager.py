"""Paged KV cache bookkeeping: a block pool with reference counts and a prefix cache. No torch.

The device tensors live in the model runner; this module only decides which block ids a
request owns (``request.block_ids``, its block table). Blocks hold ``block_size`` tokens each.

Prefix caching follows vLLM's automatic prefix caching (v1 ``KVCacheManager``): every full
block of a request's tokens gets a chained hash, SHA-256 of the parent's hash and the block's
token ids (:func:`block_hash`); a table maps hashes to the block holding that content, so a
later request with the same prefix reuses the blocks instead of recomputing them. Unreferenced
blocks that still hold cached content sit in the free list in LRU order and are evicted (their
hash dropped) only when the block is allocated again.

The hash is cryptographic, as vLLM's default (``--prefix-caching-hash-algo sha256``): with
Python's built-in tuple hash (64 bits, a fixed function of the ints) a client could compute a
block of other tokens with the hash of a known prompt's block (a system prompt, say), send it
first, and have later requests with that prompt read its K/V (cache poisoning, vLLM's
CVE-2025-25183). SHA-256 costs about 0.57 us per block on this project's 2-core CPU VM (147 us
for a 4,096-token prompt against 59 us with the tuple hash, 1.17 ms against 0.46 ms for 32,768;
``benchmarks/results/prefix-hash-cpu/``), once per block.

A request's ``cache_salt`` (vLLM's multi-tenant isolation) enters the hash of its first block:
that block's parent is the hash of the salt instead of the root, and the chain carries it on, so
requests with different salts (or one with and one without) never share a cached block.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from hashlib import sha256

from surge.request import Request

_ROOT_HASH = bytes(32)
"""Parent hash of a request's first block (without a ``cache_salt``)."""


def root_hash(cache_salt: str | None) -> bytes:
    """Parent hash of the first block of a request with ``cache_salt`` (None: no salt)."""
    if cache_salt is None:
        return _ROOT_HASH
    return sha256(b"cache_salt\0" + cache_salt.encode("utf-8", "surrogatepass")).digest()


def block_hash(parent: bytes, token_bytes: bytes) -> bytes:
    """The 32-byte hash of a full block: SHA-256 of its parent's hash and its token ids as
    int32 (``array("i", ids).tobytes()``, which :meth:`KVCacheManager._block_hashes` builds
    once per run of blocks)."""
    return sha256(parent + token_bytes).digest()


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ``a`` by positive ``b``."""
    return -(-a // b)


class BlockPool:
    """``num_blocks`` KV blocks: reference counts, content hashes and a free list.

    The free list is an ordered set (``OrderedDict``, O(1) removal from the middle when a
    free cached block is hit by the prefix cache). Allocation takes from the head; freed
    blocks that hold cached content go to the tail, so the least recently freed cached
    block is evicted first (LRU). Freed blocks with no cached content go to the head: they
    are reused before any cached block is evicted.

    Attributes:
        num_blocks: blocks in the pool.
        ref_counts: per block, how many requests hold it.
        block_hashes: per block, the hash of its (computed) content, or None.
        hash_to_block: hash -> block id of every cached block.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.block_hashes: list[bytes | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free(self) -> int:
        """Blocks with no reference (including cached ones that may be evicted)."""
        return len(self._free)

    def is_free(self, block_id: int) -> bool:
        """Whether ``block_id`` is in the free list."""
        return block_id in self._free

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free list, evicting their cached content.

        Raises:
            ValueError: fewer than ``n`` blocks are free (callers check first).
        """
        if n > len(self._free):
            raise ValueError(
                f"cannot allocate {n} KV block{'' if n == 1 else 's'}, only {len(self._free)} free"
            )
        out = []
        pop = self._free.popitem
        refs = self.ref_counts
        hashes = self.block_hashes
        for _ in range(n):
            block_id, _ = pop(last=False)
            if hashes[block_id] is not None:
                self._drop_hash(block_id)
            refs[block_id] = 1
            out.append(block_id)
        return out

    def touch(self, block_id: int) -> None:
        """Add a reference to a cached block, taking it off the free list if it was free."""
        if self.ref_counts[block_id] == 0:
            del self._free[block_id]
        self.ref_counts[block_id] += 1

    def touch_all(self, block_ids: list[int]) -> None:
        """:meth:`touch` every block of ``block_ids`` (one loop, no call per block)."""
        refs = self.ref_counts
        free = self._free
        for b in block_ids:
            if refs[b] == 0:
                del free[b]
            refs[b] += 1

    def release_all(self, block_ids: list[int], num_computed: int) -> None:
        """:meth:`release` the blocks of one request's table last-first; the first
        ``num_computed`` keep their hash, the others lose it (one loop, no call per block).

        Raises:
            RuntimeError: a block released more often than allocated.
        """
        refs = self.ref_counts
        hashes = self.block_hashes
        free = self._free
        for i in range(len(block_ids) - 1, -1, -1):
            b = block_ids[i]
            if i >= num_computed:
                self._drop_hash(b)
            count = refs[b] - 1
            if count < 0:
                raise RuntimeError(f"KV block {b} released more often than allocated")
            refs[b] = count
            if count == 0:
                free[b] = None
                if hashes[b] is None:
                    free.move_to_end(b, last=False)

    def release(self, block_id: int, keep_hash: bool) -> None:
        """Drop one reference; at zero the block goes back to the free list.

        ``keep_hash=False`` forgets the block's content (it was never computed).
        """
        if not keep_hash:
            self._drop_hash(block_id)
        count = self.ref_counts[block_id] - 1
        if count < 0:
            raise RuntimeError(f"KV block {block_id} released more often than allocated")
        self.ref_counts[block_id] = count
        if count == 0:
            self._free[block_id] = None
            if self.block_hashes[block_id] is None:
                self._free.move_to_end(block_id, last=False)

    def register(self, block_id: int, block_hash: bytes) -> None:
        """Record that ``block_id`` holds the content ``block_hash`` (first holder wins)."""
        if block_hash not in self.hash_to_block and self.block_hashes[block_id] is None:
            self.hash_to_block[block_hash] = block_id
            self.block_hashes[block_id] = block_hash

    def register_all(self, block_ids: list[int], block_hashes: list[bytes]) -> None:
        """:meth:`register` each block of ``block_ids`` with the hash at the same index."""
        table = self.hash_to_block
        hashes = self.block_hashes
        for block_id, block_hash in zip(block_ids, block_hashes, strict=True):
            if block_hash not in table and hashes[block_id] is None:
                table[block_hash] = block_id
                hashes[block_id] = block_hash

    def evict_unreferenced(self) -> int:
        """Forget the cached content of every free block (referenced blocks keep theirs).

        Returns:
            How many blocks lost their cached content.
        """
        evicted = 0
        for block_id in self._free:
            if self.block_hashes[block_id] is not None:
                self._drop_hash(block_id)
                evicted += 1
        return evicted

    def _drop_hash(self, block_id: int) -> None:
        h = self.block_hashes[block_id]
        if h is not None:
            self.block_hashes[block_id] = None
            if self.hash_to_block.get(h) == block_id:
                del self.hash_to_block[h]


class KVCacheManager:
    """Assigns KV blocks to requests; optional prefix caching of full blocks.

    A request needs ``ceil(tokens / block_size)`` blocks for ``tokens`` tokens of K/V.
    Per-request state kept here (block hashes, how many blocks were offered to the cache)
    is dropped by :meth:`free`.

    Args:
        num_blocks: blocks in the pool.
        block_size: tokens per block.
        enable_prefix_caching: reuse cached full blocks of equal prefixes.

    Raises:
        ValueError: ``num_blocks`` or ``block_size`` is not positive.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self._req_hashes: dict[str, list[bytes]] = {}
        self._req_num_registered: dict[str, int] = {}
        self.prefix_cache_hit_tokens = 0
        """Tokens served from the prefix cache at first admissions, since start (re-admissions
        after a preemption are left out, as in vLLM's counters)."""
        self.prefix_cache_query_tokens = 0
        """Tokens looked up in the prefix cache at first admissions, since start (the prompt;
        re-admissions after a preemption are left out)."""
        self.prefix_cache_requests = 0
        """First admissions whose lookup the two counters above count, since start (the stats
        line's hit rate spans the latest 1000 of them, as vLLM's)."""

    @property
    def num_total_blocks(self) -> int:
        """Blocks in the pool, free or not."""
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks not referenced by any request (cached-but-unreferenced ones count as free)."""
        return self.pool.num_free

    @property
    def usage(self) -> float:
        """Fraction (0..1) of blocks referenced by requests."""
        return 1.0 - self.pool.num_free / self.pool.num_blocks

    def _block_hashes(self, request: Request, num_blocks: int) -> list[bytes]:
        """The chained hashes (:func:`block_hash`) of the request's first ``num_blocks`` full
        blocks (cached per request; the first block's parent is :func:`root_hash` of its
        ``cache_salt``)."""
        hashes = self._req_hashes.setdefault(request.request_id, [])
        bs = self.block_size
        parent = hashes[-1] if hashes else root_hash(request.cache_salt)
        first = len(hashes)
        # Blocks wholly inside the prompt: their ids as int32 bytes in one C-level conversion,
        # then one slice per block.
        prompt = request.prompt_token_ids
        in_prompt = min(num_blocks, len(prompt) // bs)
        append = hashes.append
        if in_prompt > first:
            data = array("i", prompt[first * bs : in_prompt * bs]).tobytes()
            step = 4 * bs
            for start in range(0, len(data), step):
                parent = sha256(parent + data[start : start + step]).digest()
                append(parent)
        for i in range(max(first, in_prompt), num_blocks):
            parent = block_hash(parent, array("i", request.token_ids_slice(i * bs, (i + 1) * bs)).tobytes())
            append(parent)
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Look up the longest chain of cached full blocks of a request that has no blocks.

        At most ``request.num_tokens - 1`` tokens (whole blocks) are reported, so the last
        known token is always computed and can be sampled from. Nothing is referenced yet:
        pass the result to :meth:`allocate_slots`.

        Returns:
            (cached block ids in order, number of cached tokens = len(ids) * block_size).
        """
        if not self.enable_prefix_caching or request.block_ids:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        if max_blocks <= 0:
            return [], 0
        table = self.pool.hash_to_block
        blocks = []
        for h in self._block_hashes(request, max_blocks):
            block_id = table.get(h)
            if block_id is None:
                break
            blocks.append(block_id)
        return blocks, len(blocks) * self.block_size

    def num_blocks_to_allocate(
        self, request: Request, num_new_tokens: int, cached_blocks: list[int] | None = None
    ) -> int:
        """Free blocks that :meth:`allocate_slots` with these arguments would consume."""
        if cached_blocks:
            num_tokens = len(cached_blocks) * self.block_size + num_new_tokens
            refs = self.pool.ref_counts
            taken = [refs[b] for b in cached_blocks].count(0)
            return cdiv(num_tokens, self.block_size) - len(cached_blocks) + taken
        num_tokens = request.num_computed_tokens + num_new_tokens
        return max(0, cdiv(num_tokens, self.block_size) - len(request.block_ids))

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        cached_blocks: list[int] | None = None,
        num_reserved_blocks: int = 0,
        looked_up: bool = True,
    ) -> bool:
        """Make room for ``num_new_tokens`` more tokens of K/V, appending to ``request.block_ids``.

        Without ``cached_blocks`` the request holds ``request.num_computed_tokens`` computed
        tokens. With ``cached_blocks`` (from :meth:`get_computed_blocks`; the request must
        hold no blocks) those blocks are referenced first and count as computed tokens; the
        caller then sets ``request.num_computed_tokens`` to their token count.

        Blocks that will be full once this step's tokens are computed are registered in the
        prefix cache now, so a request admitted later in the same step can already hit them
        (except blocks holding a pending token, whose id is not known yet).

        Args:
            request: the request.
            num_new_tokens: tokens computed this step (>= 0).
            cached_blocks: prefix-cache hits, or None.
            num_reserved_blocks: free blocks that must remain after the allocation
                (the admission watermark).
            looked_up: whether the caller looked the request up in the prefix cache; a request
                it did not (prompt logprobs need every position computed) is left out of the
                hit-rate counters, as vLLM leaves out a request that skips reading the cache.

        Returns:
            True on success; False (and nothing changed) when too few blocks are free.

        Raises:
            ValueError: ``cached_blocks`` given for a request that already holds blocks.
        """
        if not cached_blocks:
            num_total = request.num_computed_tokens + num_new_tokens
            if num_total <= len(request.block_ids) * self.block_size:  # fast path: most decodes
                if self.enable_prefix_caching:
                    self._register_full_blocks(request, num_total // self.block_size)
                return True
        elif request.block_ids:
            raise ValueError(f"request {request.request_id!r} already holds blocks")
        needed = self.num_blocks_to_allocate(request, num_new_tokens, cached_blocks)
        if needed + num_reserved_blocks > self.pool.num_free:
            return False
        # A first admission counts its lookup for the hit-rate metrics; a re-admission after a
        # preemption does not (as vLLM's counters): it finds its own blocks again, prompt and
        # output, and would make a pool that thrashes look like one that shares prefixes.
        counted = (
            self.enable_prefix_caching
            and looked_up
            and not request.block_ids
            and request.num_computed_tokens == 0
            and request.num_preemptions == 0
        )
        if counted:
            self.prefix_cache_query_tokens += request.num_tokens
            self.prefix_cache_requests += 1
        if cached_blocks:
            self.pool.touch_all(cached_blocks)
            request.block_ids.extend(cached_blocks)
            num_computed = len(cached_blocks) * self.block_size
            self._req_num_registered[request.request_id] = len(cached_blocks)
            if counted:
                self.prefix_cache_hit_tokens += num_computed
        else:
            num_computed = request.num_computed_tokens
        num_total = num_computed + num_new_tokens
        num_missing = cdiv(num_total, self.block_size) - len(request.block_ids)
        if num_missing > 0:
            request.block_ids.extend(self.pool.allocate(num_missing))
        if self.enable_prefix_caching:
            self._register_full_blocks(request, num_total // self.block_size)
        return True

    def _register_full_blocks(self, request: Request, num_full: int) -> None:
        # Only blocks whose token ids are all known: a pending token (asynchronous
        # scheduling) is hashed in a later step, once its id is back.
        num_full = min(num_full, request.num_tokens // self.block_size)
        rid = request.request_id
        start = self._req_num_registered.get(rid, 0)
        if num_full <= start:
            return
        hashes = self._block_hashes(request, num_full)
        self.pool.register_all(request.block_ids[start:num_full], hashes[start:num_full])
        self._req_num_registered[rid] = num_full

    def reset_prefix_cache(self) -> int:
        """Empty the prefix cache of unreferenced blocks (``POST /reset_prefix_cache``).

        Safe while requests run: blocks held by a request keep their content and hash (like
        vLLM, nothing in use is touched); every free block that still holds cached content is
        evicted, so a later request finds no prefix that was cached before the reset (other
        than prefixes of requests running now).

        Returns:
            How many cached blocks were evicted.
        """
        return self.pool.evict_unreferenced()

    def free(self, request: Request) -> None:
        """Release all blocks of a request (finished, aborted or preempted) and forget its state.

        Blocks whose content is computed (index < ``num_computed_tokens // block_size``)
        keep their hash and stay in the prefix cache until evicted; the others lose it.
        Blocks are released last-first so a request's tail is evicted before its prefix.
        """
        self.pool.release_all(request.block_ids, request.num_computed_tokens // self.block_size)
        request.block_ids = []
        self._req_hashes.pop(request.request_id, None)
        self._req_num_registered.pop(request.request_id, None)
