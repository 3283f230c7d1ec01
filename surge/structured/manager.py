"""The engine's structured-output state: requests waiting for their grammar, one matcher per
constrained request, and the token bitmask of each step."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from surge.core.outputs import RequestFailure
from surge.request import Request
from surge.structured.bitmask import StepMaskBuffer
from surge.structured.compiler import CompiledGrammarCache
from surge.structured.cpus import available_cpus

BATCH_FILL_MIN_ROWS = 8
"""From this many constrained rows on, the bitmask rows are filled by xgrammar's threaded
batch matcher instead of one call per row; it uses one thread per this many rows."""

MAX_FILL_THREADS = 4
"""Threads of the batch matcher at most (half the available CPUs, 1 to this many).

xgrammar 0.2.9's ``BatchGrammarMatcher`` starts fresh OS threads on every call (one step's
fill), and on the H200 host 8 threads filled 64 rows in 1.51 ms against 1.64 ms with 4
(``benchmarks/results/h200-qwen3-8b/features/structured-d97855f/host_step.json``): the other
4 threads buy 8 % of the fill and compete for the CPUs with the engine loop, the API process
and the clients while streams are served."""


class RequestGrammar:
    """The grammar state of one request: an xgrammar ``GrammarMatcher`` fed with the
    request's output tokens.

    The matcher follows ``Request.output_token_ids``, which only grow (a preempted request
    keeps its outputs and is recomputed; a token dropped by asynchronous scheduling never
    enters them), and, with asynchronous scheduling, may run one token ahead of them: the
    previous step's token, fed as soon as it is on the host, before the scheduler appends
    it (:meth:`catch_up` with ``pending``). That token is checked once it lands; were the
    outputs ever to disagree with what the matcher has seen, it is reset and fed again.

    Args:
        compiled: the ``xgrammar.CompiledGrammar``.
        reasoning_end_token_id: when set, tokens up to and including the first occurrence of
            this id are free (the model's reasoning) and the grammar starts after it.
        stop_token_ids: the grammar's stop tokens (the matcher terminates only on one).

    Attributes:
        active: the grammar constrains the next token (the reasoning, if any, is over).
        failed: the matcher rejected a token (only possible when the mask was not applied);
            from then on only the stop tokens are allowed, so the request ends.
        terminated: the matcher accepted a stop token; only stop tokens follow.
        num_seen: tokens the matcher has been fed (outputs, plus the one ahead if any).
    """

    __slots__ = (
        "_compiled",
        "matcher",
        "_gate",
        "_stop",
        "num_seen",
        "_ahead",
        "active",
        "failed",
        "terminated",
    )

    def __init__(
        self, compiled: Any, reasoning_end_token_id: int | None = None, stop_token_ids: Iterable[int] = ()
    ) -> None:
        import xgrammar as xgr

        self._compiled = compiled
        self.matcher = xgr.GrammarMatcher(compiled)
        self._gate = reasoning_end_token_id
        self._stop = frozenset(stop_token_ids)
        self.num_seen = 0
        self._ahead = -1
        self.active = reasoning_end_token_id is None
        self.failed = False
        self.terminated = False

    def reset(self) -> None:
        """Back to the start of the output (nothing fed)."""
        self.matcher.reset()
        self.num_seen = 0
        self._ahead = -1
        self.active = self._gate is None
        self.failed = False
        self.terminated = False

    def feed(self, token: int) -> None:
        """Advance over one token."""
        self.num_seen += 1
        if not self.active:
            self.active = token == self._gate
        elif self.failed or self.terminated:
            return  # after the stop token only stop tokens follow (ignore_eos)
        elif not self.matcher.accept_token(token):
            self.failed = True
        elif token in self._stop:
            self.terminated = self.matcher.is_terminated()

    def catch_up(self, output_token_ids: Sequence[int], pending: int | None = None) -> None:
        """Feed the matcher the output tokens it has not seen, then ``pending`` (a token
        sampled by the step in flight, not in the outputs yet) if given."""
        n = len(output_token_ids)
        seen = self.num_seen
        if self._ahead >= 0:
            if n >= seen and output_token_ids[seen - 1] == self._ahead:
                self._ahead = -1
            else:
                self.reset()
                seen = 0
        if n < seen:
            self.reset()
            seen = 0
        for token in output_token_ids[seen:]:
            self.feed(token)
        if pending is not None:
            self.feed(pending)
            self._ahead = pending

    @property
    def constrains(self) -> bool:
        """The next token is chosen by the grammar (active, neither failed nor terminated)."""
        return self.active and not self.failed and not self.terminated


PreviousTokens = Callable[[], Mapping[str, int]]
"""Waits for the step in flight and returns its sampled ids by request id."""


class GrammarBitmask:
    """The token mask of one step's constrained rows; handed to the sampler.

    Built by :meth:`StructuredOutputManager.bitmask_for` at scheduling time; the mask is
    filled on the host only when :meth:`apply` is called, which the runner does after it
    has launched the forward pass, so on a GPU the host's work overlaps the device's. With
    asynchronous scheduling the previous step may still be in flight then: ``previous``
    waits for its sampled ids (the last moment they are needed) and the matchers take the
    pending tokens from them.

    Args:
        manager: the engine's manager.
        grammars: request_id -> matcher state.
        previous: the step in flight's sampled ids (None: no step is in flight).
    """

    __slots__ = ("_manager", "_grammars", "_previous")

    def __init__(
        self,
        manager: StructuredOutputManager,
        grammars: dict[str, RequestGrammar],
        previous: PreviousTokens | None = None,
    ) -> None:
        self._manager = manager
        self._grammars = grammars
        self._previous = previous

    def apply(self, logits: Any, requests: Sequence[Request]) -> None:
        """Set to -inf, in place, the logits of tokens the grammar forbids.

        Each constrained request's matcher first advances over its new output tokens; rows
        of other requests (and of requests still reasoning) are left as they are.

        Args:
            logits: ``[S, V]`` logits of the sampled rows (any float dtype, on the device).
            requests: the ``S`` requests, in row order.

        Raises:
            RuntimeError: a request has a pending token but no step is in flight.
        """
        manager = self._manager
        n = manager.fill(requests, self._grammars, self._previous)
        if n:
            manager.buffer.apply(logits, n)

    def host_mask(self, requests: Sequence[Request]) -> np.ndarray | None:
        """The filled mask of ``requests`` as a ``[S, ceil(V / 32)]`` int32 array (all ones
        for free rows), or None when no row is constrained: for executors that apply it
        elsewhere (the tensor-parallel workers)."""
        manager = self._manager
        n = manager.fill(requests, self._grammars, self._previous)
        if not n:
            return None
        mask, rows = manager.buffer.filled_views(n)
        full = np.full((len(requests), mask.shape[1]), -1, dtype=np.int32)
        full[rows.numpy()] = mask.numpy()
        return full


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

        from surge.structured.bitmask import apply_token_bitmask_rows

        row = {rid: i for i, rid in enumerate(self._request_ids)}
        at = [(i, row[r.request_id]) for i, r in enumerate(requests) if r.request_id in row]
        if not at:
            return
        rows = torch.tensor([i for i, _ in at], dtype=torch.int32)
        mask = torch.from_numpy(np.ascontiguousarray(self._mask[[j for _, j in at]]))
        dev = logits.device
        apply_token_bitmask_rows(logits, mask.to(dev), rows.to(dev))


class StructuredOutputManager:
    """Everything grammar-related in the engine process.

    Requests with ``SamplingParams.structured_outputs`` wait here, outside the scheduler,
    while their grammar compiles in a worker process (:class:`CompiledGrammarCache`);
    :meth:`take_ready` hands the compiled ones to the scheduler (in arrival order), so other
    requests keep stepping meanwhile.

    Args:
        tokenizer_dir: the model folder (its tokenizer).
        vocab_size: the model's vocabulary size ``V`` (logits width).
        eos_token_ids: the model's EOS ids.
        device: where logits live.
        compile_timeout: seconds one grammar compilation may run
            (:attr:`~surge.config.EngineConfig.grammar_compile_timeout`).

    Attributes:
        waiting: request_id -> (request, future of its compiled grammar), in arrival order.
        grammars: request_id -> matcher state of admitted constrained requests.
    """

    def __init__(
        self,
        tokenizer_dir: str,
        vocab_size: int,
        eos_token_ids: tuple[int, ...],
        device: Any,
        compile_timeout: float = 60.0,
    ) -> None:
        self.cache = CompiledGrammarCache(tokenizer_dir, vocab_size, eos_token_ids, compile_timeout)
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(t for t in eos_token_ids if 0 <= t < vocab_size)
        self.device = device
        self.waiting: dict[str, tuple[Request, Future[Any]]] = {}
        self.grammars: dict[str, RequestGrammar] = {}
        self.buffer = StepMaskBuffer(vocab_size, device)
        self._stop_row = _stop_row(self.eos_token_ids, self.buffer.width)
        self._fill_threads = max(1, min(MAX_FILL_THREADS, available_cpus() // 2))
        self._batch_matchers: dict[int, Any] = {}  # by thread count

    def close(self) -> None:
        """Kill the compile workers; requests still waiting for a grammar fail. Idempotent."""
        self.cache.shutdown()

    def add(self, request: Request) -> None:
        """Start compiling the request's grammar (or find it in the cache) and hold it."""
        params = request.sampling_params.structured_outputs
        assert params is not None
        self.waiting[request.request_id] = (request, self.cache.submit(params))

    def take_ready(self) -> tuple[list[Request], list[RequestFailure]]:
        """The waiting requests whose grammar is compiled (in arrival order, their matchers
        created), and the failures of those whose compilation failed: status 400 for a grammar
        refused (``ValueError``: not compilable, accepting no text, over the time limit), 500
        for a server fault (``RuntimeError``: a compile worker that died or could not start,
        the engine shutting down)."""
        ready: list[Request] = []
        failed: list[RequestFailure] = []
        for rid, (request, future) in list(self.waiting.items()):
            if not future.done():
                continue
            del self.waiting[rid]
            error = future.exception()
            if error is not None:
                refused = isinstance(error, ValueError)  # the grammar's fault; else the server's
                failed.append(RequestFailure(rid, str(error), 400 if refused else 500, grammar=refused))
                continue
            if rid in self.grammars:  # never replace an admitted request's matcher
                failed.append(RequestFailure(rid, f"request id {rid!r} is already in use"))
                continue
            params = request.sampling_params.structured_outputs
            assert params is not None
            self.grammars[rid] = RequestGrammar(
                future.result(), params.reasoning_end_token_id, self.eos_token_ids
            )
            ready.append(request)
        return ready, failed

    def wait(self, timeout: float) -> None:
        """Block until some waiting grammar is compiled, at most ``timeout`` seconds."""
        futures = [f for _, f in self.waiting.values()]
        if futures:
            concurrent.futures.wait(futures, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)

    def abort(self, request_ids: Iterable[str]) -> None:
        """Forget requests (aborted or finished). A compilation that no waiting request needs
        any more and that has not started is cancelled, so it does not hold a compile thread."""
        for rid in request_ids:
            entry = self.waiting.pop(rid, None)
            self.grammars.pop(rid, None)
            if entry is not None and not any(f is entry[1] for _, f in self.waiting.values()):
                entry[1].cancel()  # no-op once it runs or is done

    def bitmask_for(
        self, sampled_request_ids: Iterable[str], previous: PreviousTokens | None = None
    ) -> GrammarBitmask | None:
        """The step's :class:`GrammarBitmask` when one of its sampled requests has a grammar,
        else None (an unconstrained step costs nothing more). ``previous`` gives the sampled
        ids of the step in flight, for requests whose last token is still pending."""
        grammars = self.grammars
        if not grammars:
            return None
        if not any(rid in grammars for rid in sampled_request_ids):
            return None
        return GrammarBitmask(self, grammars, previous)

    def fill(
        self,
        requests: Sequence[Request],
        grammars: dict[str, RequestGrammar],
        previous: PreviousTokens | None = None,
    ) -> int:
        """Advance the matchers of ``requests`` and pack the masks of their constrained rows
        into :attr:`buffer`: the grammar's allowed tokens, or only the stop tokens for a
        finished or failed grammar, or one at a dead end (no token allowed, not even a stop
        token). Free rows get no mask row.

        A request with a pending output (``Request.num_pending_outputs``: sampled by the
        step in flight, asynchronous scheduling) takes it from ``previous()``, which is
        called (and waits) only then.

        Matchers that constrain their row fill their mask rows in one call, xgrammar's
        ``BatchGrammarMatcher`` (a thread pool in C++), from :data:`BATCH_FILL_MIN_ROWS`
        rows on, with one thread per :data:`BATCH_FILL_MIN_ROWS` rows (at most half the
        available CPUs, :func:`~surge.structured.cpus.available_cpus`, and
        :data:`MAX_FILL_THREADS`).

        Returns:
            ``n``, the rows packed (0: no row is constrained, nothing to apply).

        Raises:
            RuntimeError: a pending output but no ``previous``.
        """
        rows: list[int] = []
        matchers: list[Any] = []
        stop_rows: list[int] = []
        tokens: Mapping[str, int] | None = None
        for i, request in enumerate(requests):
            rid = request.request_id
            g = grammars.get(rid)
            if g is None:
                continue
            pending = None
            if request.num_pending_outputs:
                if tokens is None:
                    if previous is None:
                        raise RuntimeError(f"request {rid!r} has a pending token but no step is in flight")
                    tokens = previous()
                pending = tokens[rid]
            g.catch_up(request.output_token_ids, pending)
            if not g.active:
                continue
            if g.failed or g.terminated:
                stop_rows.append(i)
            else:
                rows.append(i)
                matchers.append(g.matcher)
        m = len(rows)
        n = m + len(stop_rows)
        if n == 0:
            return 0
        mask, row_ids = self.buffer.host_views(n)
        if m >= BATCH_FILL_MIN_ROWS:
            threads = min(self._fill_threads, m // BATCH_FILL_MIN_ROWS)
            batch = self._batch_matchers.get(threads)
            if batch is None:
                import xgrammar as xgr

                batch = self._batch_matchers[threads] = xgr.BatchGrammarMatcher(threads)
            batch.batch_fill_next_token_bitmask(matchers, mask)
        else:
            for j, matcher in enumerate(matchers):
                matcher.fill_next_token_bitmask(mask, j)
        if m:
            # a grammar at a dead end allows no token, not even a stop token: its row would be left
            # unmasked by the sampler (which gives way to an empty row) and stream one token the
            # grammar forbids; it gets the stop row instead, and the stop token, which the matcher
            # rejects, fails the request (LLMEngine._unfinished_grammars) with nothing streamed
            dead = torch.nonzero(~mask[:m].any(dim=1)).flatten()
            if len(dead):
                mask[dead] = self._stop_row
        if stop_rows:
            mask[m:] = self._stop_row
            rows += stop_rows
        row_ids.copy_(torch.tensor(rows, dtype=torch.int32))
        return n


def _stop_row(stop_token_ids: Sequence[int], width: int) -> torch.Tensor:
    """``[W]`` int32: a mask that allows only ``stop_token_ids``."""
    bits = np.zeros(width, dtype=np.uint32)
    for t in stop_token_ids:
        bits[t >> 5] |= np.uint32(1 << (t & 31))
    return torch.from_numpy(bits.view(np.int32))
