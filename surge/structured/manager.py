"""The engine's structured-output state: requests waiting for their grammar, one matcher per
constrained request, and the token bitmask of each step."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from surge.request import Request
from surge.structured.compiler import CompiledGrammarCache

BATCH_FILL_MIN_ROWS = 8
"""From this many constrained rows on, the bitmask rows are filled by xgrammar's threaded
batch matcher instead of one call per row."""


class RequestGrammar:
    """The grammar state of one request: an xgrammar ``GrammarMatcher`` fed with the
    request's output tokens.

    The matcher follows ``Request.output_token_ids``, which only grow (a preempted request
    keeps its outputs and is recomputed; a token dropped by asynchronous scheduling never
    enters them), so :meth:`advance` feeds it the tokens it has not seen. Were the outputs
    ever shorter than what it has seen, the matcher is reset and fed again.

    Args:
        compiled: the ``xgrammar.CompiledGrammar``.
        reasoning_end_token_id: when set, tokens up to and including the first occurrence of
            this id are free (the model's reasoning) and the grammar starts after it.

    Attributes:
        active: the grammar constrains the next token (the reasoning, if any, is over).
        failed: the matcher rejected a token (only possible when the mask was not applied);
            from then on only the stop tokens are allowed, so the request ends.
    """

    __slots__ = ("_compiled", "matcher", "_gate", "num_seen", "active", "failed")

    def __init__(self, compiled: Any, reasoning_end_token_id: int | None = None) -> None:
        import xgrammar as xgr

        self._compiled = compiled
        self.matcher = xgr.GrammarMatcher(compiled)
        self._gate = reasoning_end_token_id
        self.num_seen = 0
        self.active = reasoning_end_token_id is None
        self.failed = False

    def advance(self, output_token_ids: Sequence[int]) -> None:
        """Feed the matcher the output tokens it has not seen yet."""
        n = len(output_token_ids)
        if n < self.num_seen:
            self.matcher.reset()
            self.num_seen = 0
            self.active = self._gate is None
            self.failed = False
        matcher = self.matcher
        for token in output_token_ids[self.num_seen :]:
            if not self.active:
                self.active = token == self._gate
            elif self.failed or matcher.is_terminated():
                continue  # after the stop token only stop tokens follow (ignore_eos)
            elif not matcher.accept_token(token):
                self.failed = True
        self.num_seen = n


class GrammarBitmask:
    """The token mask of one step's constrained rows; handed to the sampler.

    Built by :meth:`StructuredOutputManager.bitmask_for` at scheduling time; the mask is
    filled on the host only when :meth:`apply` is called, which the runner does after it
    has launched the forward pass, so on a GPU the host's work overlaps the device's.
    """

    __slots__ = ("_manager", "_grammars")

    def __init__(self, manager: StructuredOutputManager, grammars: dict[str, RequestGrammar]) -> None:
        self._manager = manager
        self._grammars = grammars

    def apply(self, logits: Any, requests: Sequence[Request]) -> None:
        """Set to -inf, in place, the logits of tokens the grammar forbids.

        Each constrained request's matcher first advances over its new output tokens; rows
        of other requests (and of requests still reasoning) are left as they are.

        Args:
            logits: ``[S, V]`` logits of the sampled rows (any float dtype, on the device).
            requests: the ``S`` requests, in row order.
        """
        mask = self._manager.fill(requests, self._grammars)
        if mask is not None:
            apply_bitmask(logits, mask)

    def host_mask(self, requests: Sequence[Request]) -> np.ndarray | None:
        """The filled mask of ``requests`` as a ``[S, ceil(V / 32)]`` int32 array (a copy),
        or None when no row is constrained: for executors that apply it elsewhere (the
        tensor-parallel workers)."""
        mask = self._manager.fill(requests, self._grammars)
        return None if mask is None else mask.numpy().copy()


class StaticGrammarBitmask:
    """A mask filled elsewhere (by the engine's :class:`GrammarBitmask`), applied by a
    tensor-parallel worker's sampler: every rank applies the same mask and so samples the
    same ids.

    Args:
        mask: ``[n, ceil(V / 32)]`` int32, one row per id of ``request_ids``.
        request_ids: the requests of the rows.
    """

    __slots__ = ("_mask", "_request_ids")

    def __init__(self, mask: np.ndarray, request_ids: list[str]) -> None:
        self._mask = mask
        self._request_ids = request_ids

    def apply(self, logits: Any, requests: Sequence[Request]) -> None:
        """As :meth:`GrammarBitmask.apply`; rows of requests the mask does not name are free."""
        import torch

        ids = [r.request_id for r in requests]
        if ids == self._request_ids:
            mask = self._mask
        else:
            row = {rid: i for i, rid in enumerate(self._request_ids)}
            mask = np.full((len(ids), self._mask.shape[1]), -1, dtype=np.int32)
            for i, rid in enumerate(ids):
                if rid in row:
                    mask[i] = self._mask[row[rid]]
        apply_bitmask(logits, torch.from_numpy(mask))


def apply_bitmask(logits: Any, mask: Any) -> None:
    """``xgrammar.apply_token_bitmask_inplace`` of a host ``[S, W]`` int32 mask on ``logits``
    ``[S, V]`` (copied to the logits' device first; its CPU kernel on CPU, its Triton kernel
    on CUDA). Bits past ``V`` are ignored."""
    import xgrammar as xgr

    device_mask = mask if logits.device.type == "cpu" else mask.to(logits.device, non_blocking=True)
    xgr.apply_token_bitmask_inplace(logits, device_mask, vocab_size=logits.shape[-1])


class StructuredOutputManager:
    """Everything grammar-related in the engine process.

    Requests with ``SamplingParams.structured_outputs`` wait here, outside the scheduler,
    while their grammar compiles in the pool; :meth:`take_ready` hands the compiled ones to
    the scheduler (in arrival order), so other requests keep stepping meanwhile.

    Args:
        tokenizer_dir: the model folder (its tokenizer).
        vocab_size: the model's vocabulary size ``V`` (logits width).
        eos_token_ids: the model's EOS ids.
        device: where logits live.

    Attributes:
        waiting: request_id -> (request, future of its compiled grammar), in arrival order.
        grammars: request_id -> matcher state of admitted constrained requests.
    """

    def __init__(
        self, tokenizer_dir: str, vocab_size: int, eos_token_ids: tuple[int, ...], device: Any
    ) -> None:
        self.cache = CompiledGrammarCache(tokenizer_dir, vocab_size, eos_token_ids)
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(t for t in eos_token_ids if 0 <= t < vocab_size)
        self.device = device
        self.waiting: dict[str, tuple[Request, Future[Any]]] = {}
        self.grammars: dict[str, RequestGrammar] = {}
        self._host_mask: Any = None
        self._batch_matcher: Any = None

    def add(self, request: Request) -> None:
        """Start compiling the request's grammar (or find it in the cache) and hold it."""
        params = request.sampling_params.structured_outputs
        assert params is not None
        self.waiting[request.request_id] = (request, self.cache.submit(params))

    def take_ready(self) -> tuple[list[Request], list[tuple[str, str]]]:
        """The waiting requests whose grammar is compiled (in arrival order, their matchers
        created), and ``(request_id, message)`` of those whose compilation failed."""
        ready: list[Request] = []
        failed: list[tuple[str, str]] = []
        for rid, (request, future) in list(self.waiting.items()):
            if not future.done():
                continue
            del self.waiting[rid]
            error = future.exception()
            if error is not None:
                failed.append((rid, str(error)))
                continue
            params = request.sampling_params.structured_outputs
            assert params is not None
            self.grammars[rid] = RequestGrammar(future.result(), params.reasoning_end_token_id)
            ready.append(request)
        return ready, failed

    def wait(self, timeout: float) -> None:
        """Block until some waiting grammar is compiled, at most ``timeout`` seconds."""
        futures = [f for _, f in self.waiting.values()]
        if futures:
            concurrent.futures.wait(futures, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)

    def abort(self, request_ids: Iterable[str]) -> None:
        """Forget requests (aborted or finished)."""
        for rid in request_ids:
            self.waiting.pop(rid, None)
            self.grammars.pop(rid, None)

    def bitmask_for(self, sampled_request_ids: Iterable[str]) -> GrammarBitmask | None:
        """The step's :class:`GrammarBitmask` when one of its sampled requests has a grammar,
        else None (an unconstrained step costs nothing more)."""
        grammars = self.grammars
        if not grammars:
            return None
        if not any(rid in grammars for rid in sampled_request_ids):
            return None
        return GrammarBitmask(self, grammars)

    def fill(self, requests: Sequence[Request], grammars: dict[str, RequestGrammar]) -> Any:
        """Advance the matchers of ``requests`` and fill the step's mask: a ``[S, W]`` int32
        host tensor (all ones for free rows; only the stop tokens for a finished or failed
        grammar), or None when no row is constrained."""
        import xgrammar as xgr

        rows: list[int] = []
        matchers: list[Any] = []
        stop_rows: list[int] = []
        for i, request in enumerate(requests):
            g = grammars.get(request.request_id)
            if g is None:
                continue
            g.advance(request.output_token_ids)
            if not g.active:
                continue
            if g.failed or g.matcher.is_terminated():
                stop_rows.append(i)
            else:
                rows.append(i)
                matchers.append(g.matcher)
        if not rows and not stop_rows:
            return None
        mask = self._mask_buffer(len(requests))
        mask.fill_(-1)  # every token allowed
        if len(rows) >= BATCH_FILL_MIN_ROWS:
            if self._batch_matcher is None:
                self._batch_matcher = xgr.BatchGrammarMatcher()
            self._batch_matcher.batch_fill_next_token_bitmask(matchers, mask, rows)
        else:
            for i, matcher in zip(rows, matchers, strict=True):
                matcher.fill_next_token_bitmask(mask, i)
        if stop_rows:
            bits = mask.numpy().view(np.uint32)
            for i in stop_rows:
                bits[i] = 0
                for t in self.eos_token_ids:
                    bits[i, t >> 5] |= np.uint32(1 << (t & 31))
        return mask

    def _mask_buffer(self, rows: int) -> Any:
        """A ``[rows, ceil(V / 32)]`` int32 host buffer (pinned with CUDA), reused across
        steps: a constrained step is applied before the next is scheduled, so its copy to
        the device is done before the buffer is written again."""
        import torch

        buf = self._host_mask
        if buf is None or buf.shape[0] < rows:
            width = (self.vocab_size + 31) // 32
            capacity = max(rows, 64 if buf is None else 2 * buf.shape[0])
            pin = torch.device(self.device).type == "cuda"
            buf = torch.empty(capacity, width, dtype=torch.int32, pin_memory=pin)
            self._host_mask = buf
        return buf[:rows]
