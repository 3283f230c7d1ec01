"""One HTTP request's generation: its child requests in the engine, turned into text deltas.

Shared by chat and completions. Each choice (one engine request; ``n`` choices per prompt via
:func:`~surge.engine.llm_engine.choice_ids`) has an :class:`IncrementalDetokenizer`. Outputs of all choices arrive on one
``asyncio.Queue``; :meth:`Generation.deltas` drains it and yields the deltas to send:

- a choice's first delta goes out as soon as its first token exists; for chat
  (``first_needs_text``) as soon as it has text: chat sends it right after the choice's role
  chunk (``{"role": "assistant", "content": ""}``, which vLLM's benchmark client does not count
  as a token), and an empty ``content`` there would count as the first token, so a first token
  whose text is held back (e.g. a possible stop-string prefix) waits for the next;
- then one delta every ``stream_interval`` tokens, and always the final one, which carries the
  finish reason; no token is dropped: a delta carries all text since the last one. A later
  delta goes out on time even when its text is held back (an unfinished UTF-8 character or a
  possible stop-string prefix): its text is then empty, and the held text rides on a later
  delta. So at ``stream_interval`` 1 every SSE event after the first stands for exactly one
  token, and a client's inter-token gaps are one engine step each (an empty ``content`` chunk
  without a role counts as a token in vLLM's benchmark client). A chat stream parsed for tool
  calls or reasoning drops the chunks whose parsed delta is empty
  (:func:`surge.server.chat_tools.is_empty_delta`), so it has fewer events than tokens.

With logprobs, a delta also carries the rows of the tokens whose text it completes
(:class:`~surge.server.logprobs.LogprobTracker`), and a choice's first delta the prompt's
rows when they were asked for. With ``return_token_ids`` (vLLM) a delta carries the ids of the
tokens received since the choice's previous delta, whatever text they have released, so the
joined ids are exactly the generated tokens (the EOS or stop token, and the tokens of a matched
stop string, included: those the usage counts).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from surge.core.logprobs import LogprobsLists
from surge.core.outputs import EngineOutput
from surge.engine.client import EngineClient, EngineDeadError, QueueItem
from surge.engine.llm_engine import choice_ids
from surge.sampling_params import SamplingParams, reported_stop_ids, stop_reason_of
from surge.server.errors import ApiError
from surge.server.logprobs import LogprobTracker
from surge.server.metrics import EngineMetrics, FinishedRequestStats, ServerMetrics
from surge.tokenizer import IncrementalDetokenizer

_MAX_BATCH_SECONDS = 0.005
"""Post-processing of one request yields to the event loop after this long (seconds)."""


def _add_text(pending: list[str], text: str) -> None:
    """Add ``text`` to a choice's unsent text (pieces joined once, when a delta is sent: with a
    large ``stream_interval``, or a non-streamed request, ``+=`` on the choice's string copied
    all of its text at every token)."""
    if text:
        pending.append(text)


@dataclass(slots=True)
class ChoiceState:
    """Progress of one choice (one engine request).

    ``max_tokens`` is the ``max_tokens`` the engine was given; ``queued_time``,
    ``scheduled_time``, ``engine_first_token_time`` and ``engine_finished_time`` the engine's
    times of the request (``time.monotonic()``, None until reported: the request histograms).
    ``token_ids`` holds every generated token id when the request asked for them
    (``return_token_ids``; else None), ``num_ids_sent`` how many of them deltas have carried;
    ``num_cached_tokens`` the prompt tokens the engine served from its prefix cache;
    ``stop_ids`` the tokens whose stop reports their id as ``stop_reason``
    (:func:`surge.sampling_params.reported_stop_ids`).
    """

    index: int
    request_id: str
    prompt_index: int
    detokenizer: IncrementalDetokenizer
    stop_ids: frozenset[int] = frozenset()
    num_tokens: int = 0
    unsent_tokens: int = 0
    pending: list[str] = field(default_factory=list)
    sent_first: bool = False
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    last_token_time: float = 0.0
    logprobs: LogprobTracker | None = None
    prompt_logprobs: LogprobsLists | None = None
    score_only: bool = False
    first_token_time: float = 0.0
    engine_times: tuple[float, float] | None = None
    token_ids: list[int] | None = None
    num_ids_sent: int = 0
    num_cached_tokens: int = 0
    max_tokens: int = 0
    queued_time: float | None = None
    scheduled_time: float | None = None
    engine_first_token_time: float | None = None
    engine_finished_time: float | None = None


@dataclass(slots=True)
class ChoiceDelta:
    """Text to send for one choice. ``first`` marks its first delta; ``finish_reason`` its last.

    ``logprobs`` holds the rows of the tokens whose text this delta completes (None when the
    request did not ask); ``prompt_logprobs`` the prompt's rows, on the first delta;
    ``token_ids`` the ids of the tokens received since the choice's previous delta (None
    without ``return_token_ids``).
    """

    index: int
    prompt_index: int
    text: str
    first: bool
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: LogprobsLists | None = None
    prompt_logprobs: LogprobsLists | None = None
    token_ids: list[int] | None = None


@dataclass(slots=True)
class PromptInfo:
    """One prompt of the request: its token ids (and text for echo), its choices, how many of
    them finished (not aborted) and the request metrics of the engine (replica) serving it."""

    token_ids: list[int]
    metrics: EngineMetrics
    text: str | None = None
    choices: list[int] = field(default_factory=list)
    num_finished: int = 0


class Generation:
    """The engine requests behind one HTTP request and the deltas they produce.

    Args:
        client: the engine client.
        tokenizer: for the detokenizers.
        metrics: server metrics to update.
        stream_interval: tokens per delta after the first (>= 1); non-streaming callers pass
            a huge value so that only the first and final deltas are produced.
        arrival_time: ``time.monotonic()`` when the HTTP request arrived.
        first_needs_text: hold a choice's first delta until it has text (chat: the first
            content chunk, after the role chunk, carries text).
        on_close: called once, by the first :meth:`abort` (which every handler calls when
            it is done with the generation, finished or not).
        serial: a number no other generation of this process has
            (:meth:`surge.server.drain.InFlight.next_serial`): engine request ids are
            ``<base id>@<serial>[-<choice>]``, so no client id can collide with another
            request's (a client's ``X-Request-Id: abc-0`` with the children ``abc-0``, ``abc-1``
            of an ``n = 2`` request ``abc`` took over or crashed them).
        return_token_ids: keep each choice's generated token ids (``ChoiceState.token_ids``)
            and hand them out with its deltas (vLLM's ``return_token_ids``).
        cache_salt: the request's ``cache_salt`` (vLLM's), sent with each of its prompts: only
            requests with the same salt share prefix-cache blocks (None: no salt).
        priority: the request's ``priority`` (lower first under ``--scheduling-policy
            priority``; checked by :meth:`ServerState.check_priority`).
        eos_token_ids: the model's EOS ids (``config.json`` and ``generation_config.json``):
            those other than the tokenizer's EOS report their id as ``stop_reason``, as in vLLM.
        grammar_param: the request field that carried its grammar (``structured_outputs.grammar``,
            ``tools``, ...): the ``param`` of the error when the engine refuses the grammar later
            (it does not compile, or reaches a dead end), streamed or not.
        prompt_tokens_details: the usage carries ``prompt_tokens_details.cached_tokens``
            (``--enable-prompt-tokens-details``; see :attr:`cached_prompt_tokens`).
    """

    def __init__(
        self,
        client: EngineClient,
        tokenizer: PreTrainedTokenizerBase,
        metrics: ServerMetrics,
        stream_interval: int,
        arrival_time: float,
        first_needs_text: bool = False,
        on_close: Callable[[], None] | None = None,
        serial: int = 0,
        return_token_ids: bool = False,
        cache_salt: str | None = None,
        priority: int = 0,
        eos_token_ids: tuple[int, ...] = (),
        grammar_param: str | None = None,
        prompt_tokens_details: bool = False,
    ) -> None:
        self.prompt_tokens_details = prompt_tokens_details
        self._grammar_param = grammar_param
        self._eos_token_ids = eos_token_ids
        self._serial = serial
        self._return_token_ids = return_token_ids
        self._cache_salt = cache_salt
        self._priority = priority
        self._client = client
        self._first_needs_text = first_needs_text
        self._tokenizer = tokenizer
        self._metrics = metrics
        self._interval = max(1, stream_interval)
        self._arrival = arrival_time
        self._queue: asyncio.Queue[QueueItem | tuple[int, ApiError]] = asyncio.Queue()
        self.choices: list[ChoiceState] = []
        self.prompts: list[PromptInfo] = []
        self._num_unfinished = 0
        self._on_close = on_close

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of the request (each prompt counted once, whatever ``n``)."""
        return sum(len(p.token_ids) for p in self.prompts)

    @property
    def cached_prompt_tokens(self) -> int:
        """Prompt tokens the engine served from its prefix cache, counted as ``prompt_tokens``
        counts the prompts: once per prompt, as its first choice found them (whatever ``n``)."""
        first: dict[int, int] = {}
        for choice in self.choices:
            first.setdefault(choice.prompt_index, choice.num_cached_tokens)
        return sum(first.values())

    @property
    def completion_tokens(self) -> int:
        """Generated tokens over all choices (the stop token included)."""
        return sum(c.num_tokens for c in self.choices)

    def add_prompt(
        self,
        base_id: str,
        token_ids: list[int],
        params: SamplingParams,
        text: str | None = None,
        score_only: bool = False,
        share_prompt_logprobs: bool = False,
    ) -> None:
        """Send one prompt's ``params.n`` child requests to the engine.

        With ``share_prompt_logprobs`` (an answer built once every choice is done: not streamed)
        only the first choice computes ``prompt_logprobs`` and every choice of the prompt gets
        them when they arrive; streamed, each choice's first delta needs its own.

        With ``score_only`` (completions' ``echo`` with ``max_tokens: 0``, sent with
        ``max_tokens=0``) the engine computes the prompt and samples nothing: the choice has
        no text and no completion tokens.

        Raises:
            ApiError: 503 when the engine is not running.
        """
        prompt_index = len(self.prompts)
        info = PromptInfo(token_ids, self._metrics.engine(0), text)  # its replica's, once sent
        self.prompts.append(info)
        if params.structured_outputs is not None:
            self._metrics.structured_request(params.structured_outputs.kind, params.n)
        # the text after the id's last '@' is this process-unique serial (and the choice suffix)
        request_id = f"{base_id}@{self._serial}"
        first = len(self.choices)
        # once for all n choices: a set per choice of 150,000 stop_token_ids took 1.5 s of the
        # event loop for n=128, every other stream waiting
        stop_ids = reported_stop_ids(params, self._eos_token_ids, self._tokenizer.eos_token_id)
        for child_id in choice_ids(request_id, params.n):  # the choices differ only by id and seed
            index = len(self.choices)
            detok = IncrementalDetokenizer.for_params(self._tokenizer, token_ids, params)
            choice = ChoiceState(
                index,
                child_id,
                prompt_index,
                detok,
                score_only=score_only,
                stop_ids=stop_ids,
                token_ids=[] if self._return_token_ids else None,
                max_tokens=params.max_tokens,
            )
            if params.num_logprobs is not None and not score_only:
                choice.logprobs = LogprobTracker()
            self.choices.append(choice)
            info.choices.append(index)
            self._num_unfinished += 1
        try:  # one message for all n choices: the engine fans them out
            engine = self._client.add_request(
                request_id,
                token_ids,
                params,
                self._queue,
                first,
                arrival_time=self._arrival,
                prompt_logprobs_once=share_prompt_logprobs,
                cache_salt=self._cache_salt,
                priority=self._priority,
            )
        except EngineDeadError as e:
            raise ApiError(503, f"The engine is not available: {e}") from e
        info.metrics = self._metrics.engine(engine)

    def abort(self) -> None:
        """Abort every unfinished choice in the engine (a client that went away, a server
        shutdown, an engine rejection or death). The aborted choices are not counted in
        ``request_success_total`` nor the e2e latency histogram: vLLM 0.26's
        ``OutputProcessor.abort_requests`` records no stats for them either (its
        ``finished_reason="abort"`` series stays 0 on a client's hang-up)."""
        ids = [c.request_id for c in self.choices if c.finish_reason is None]
        if ids:
            self._client.abort_requests(ids)
            for c in self.choices:
                if c.finish_reason is None:
                    c.finish_reason = "abort"
            self._num_unfinished = 0
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close()

    def fail(self, error: ApiError) -> None:
        """End the generation with ``error``: :meth:`deltas` raises it (e.g. at shutdown)."""
        for c in self.choices:
            if c.finish_reason is None:
                self._queue.put_nowait((c.index, error))
                return

    async def deltas(self) -> AsyncIterator[list[ChoiceDelta]]:
        """Yield lists of deltas until every choice has finished.

        Raises:
            ApiError: 400 when the engine rejected a request (500 when its grammar compile worker
                failed: the status the engine sent; naming ``grammar_param`` when the grammar
                was at fault); 503 when the engine died.
        """
        queue = self._queue
        while self._num_unfinished > 0:
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            out: list[ChoiceDelta] = []
            now = time.monotonic()
            for index, item in items:
                if time.monotonic() - now > _MAX_BATCH_SECONDS:
                    # a long batch (many choices, long token runs): let other requests' streams run
                    await asyncio.sleep(0)
                    now = time.monotonic()
                choice = self.choices[index]
                if choice.finish_reason is not None:
                    continue
                if isinstance(item, EngineOutput):
                    delta = self._on_output(choice, item, now)
                    if delta is not None:
                        out.append(delta)
                elif isinstance(item, ApiError):  # fail(): the server ends the request
                    self.abort()
                    raise item
                elif isinstance(item, EngineDeadError):
                    self.abort()
                    raise ApiError(503, f"The engine is not available: {item}")
                else:  # RequestError: the engine rejected the request (or its grammar worker failed)
                    self.abort()
                    param = self._grammar_param if item.grammar else None
                    raise ApiError(item.status, item.message, param=param)
            if out:
                yield out

    def _on_output(self, choice: ChoiceState, out: EngineOutput, now: float) -> ChoiceDelta | None:
        if out.prompt_logprobs is not None:  # the prompt's: every choice of it may take them
            for index in self.prompts[choice.prompt_index].choices:
                if self.choices[index].prompt_logprobs is None:
                    self.choices[index].prompt_logprobs = out.prompt_logprobs
        if choice.score_only:
            return self._on_score_output(choice, out, now)
        n_new = len(out.new_token_ids)
        metrics = self.prompts[choice.prompt_index].metrics
        if choice.num_tokens == 0:
            metrics.ttft.observe(now - self._arrival)
            choice.first_token_time = now
            # the first output token means the choice's prefill is done; each choice (engine
            # request) counts its prompt, as vLLM's n child requests each do
            metrics.add_prompt_tokens(len(self.prompts[choice.prompt_index].token_ids), out.num_cached_tokens)
        elif n_new:
            metrics.itl.observe((now - choice.last_token_time) / n_new)
        choice.last_token_time = now
        if out.num_cached_tokens > choice.num_cached_tokens:
            choice.num_cached_tokens = out.num_cached_tokens
        choice.num_tokens += n_new
        choice.unsent_tokens += n_new
        if choice.token_ids is not None:
            choice.token_ids.extend(out.new_token_ids)
        metrics.add_generation_tokens(n_new)
        detok = choice.detokenizer
        tracker = choice.logprobs
        if tracker is None or out.logprobs is None:
            _add_text(choice.pending, detok.update(out.new_token_ids, out.stop_token_id))
        else:  # token by token, to know which text each row's token completes
            last = n_new - 1
            for j, token in enumerate(out.new_token_ids):
                piece = detok.update([token], out.stop_token_id if j == last else None)
                _add_text(choice.pending, piece)
                tracker.add(out.logprobs.slice(j, j + 1), len(piece), detok.num_held_chars)
        if detok.stop_matched is not None:
            self._client.abort_requests([choice.request_id])
            choice.finish_reason, choice.stop_reason = "stop", detok.stop_matched
        elif out.finish_reason is not None:
            choice.finish_reason = out.finish_reason
            choice.stop_reason = stop_reason_of(out.stop_token_id, choice.stop_ids, out.finish_reason)
        if out.first_scheduled_time is not None and out.first_token_time is not None:
            choice.engine_times = (out.first_scheduled_time, out.first_token_time)
        _take_engine_times(choice, out)
        if choice.finish_reason is not None:
            rest = detok.flush()
            _add_text(choice.pending, rest)
            if tracker is not None:
                tracker.add_text(len(rest))
            if detok.stop_matched is not None and choice.finish_reason != "stop":
                choice.finish_reason, choice.stop_reason = "stop", detok.stop_matched
            self._num_unfinished -= 1
            self._finished(choice, now)
        elif choice.sent_first and choice.unsent_tokens < self._interval:
            return None
        elif not choice.sent_first and not choice.pending and self._first_needs_text:
            return None  # the first chat delta (after the role chunk) waits for text
        delta = ChoiceDelta(
            choice.index,
            choice.prompt_index,
            "".join(choice.pending),
            not choice.sent_first,
            choice.finish_reason,
            choice.stop_reason,
        )
        if tracker is not None:
            delta.logprobs = tracker.take(final=choice.finish_reason is not None)
        if delta.first:
            delta.prompt_logprobs = choice.prompt_logprobs
        ids = choice.token_ids
        if ids is not None:
            delta.token_ids = ids[choice.num_ids_sent :]
            choice.num_ids_sent = len(ids)
        choice.sent_first = True
        choice.pending = []
        choice.unsent_tokens = 0
        return delta

    def _finished(self, choice: ChoiceState, now: float) -> None:
        """Count a choice that finished (not aborted) in the request metrics, with vLLM 0.26's
        intervals (``IterationStats.update_from_finished_request``): queued = first schedule -
        engine queueing, prefill = first token - first schedule, decode = last token - first
        token, inference = last token - first schedule, all engine times. The last token's
        engine time is the engine's finish; for a choice the API ended (a stop string) the
        engine's first-token time plus the API's time since its first token. A score-only choice
        (no token) has its prefill end at its finish. Once every choice of its prompt finished,
        the prompt's ``n`` and most generated tokens are observed too."""
        scheduled = choice.scheduled_time if choice.scheduled_time is not None else self._arrival
        queued = choice.queued_time if choice.queued_time is not None else scheduled
        if choice.engine_finished_time is not None:
            last = choice.engine_finished_time
        elif choice.engine_first_token_time is not None:
            last = choice.engine_first_token_time + (now - choice.first_token_time)
        else:
            last = scheduled
        first = choice.engine_first_token_time if choice.engine_first_token_time is not None else last
        prompt = self.prompts[choice.prompt_index]
        prompt.metrics.request_finished(
            FinishedRequestStats(
                finish_reason=choice.finish_reason or "stop",
                e2e_latency=now - self._arrival,
                num_prompt_tokens=len(prompt.token_ids),
                num_generation_tokens=choice.num_tokens,
                num_cached_tokens=choice.num_cached_tokens,
                max_tokens_param=choice.max_tokens,
                queued_time=scheduled - queued,
                prefill_time=first - scheduled,
                decode_time=last - first,
                inference_time=last - scheduled,
            )
        )
        prompt.num_finished += 1
        if prompt.num_finished == len(prompt.choices):
            most = max(self.choices[i].num_tokens for i in prompt.choices)
            prompt.metrics.prompt_finished(len(prompt.choices), most)

    def first_token_split(self) -> str:
        """Where the first choice's time to first token went, for the request's log line:
        ``"; first token at X ms = A to the engine's first schedule + B in the engine + C back"``
        (API arrival -> the engine scheduled it -> the engine had its first token -> the API
        had it; all ``time.monotonic()``, one clock for every process of the host; the engine
        sends its times with a request's first output, so a choice the API ended on a stop string
        has them too), or "" when the first choice got no token (a scored prompt, an abort
        before its first token)."""
        choice = self.choices[0] if self.choices else None
        if choice is None or choice.engine_times is None or not choice.first_token_time:
            return ""
        scheduled, first = choice.engine_times
        arrival = self._arrival
        return (
            f"; first token at {(choice.first_token_time - arrival) * 1e3:.1f} ms = "
            f"{(scheduled - arrival) * 1e3:.1f} to the engine's first schedule + "
            f"{(first - scheduled) * 1e3:.1f} in the engine + {(choice.first_token_time - first) * 1e3:.1f} back"
        )

    def _on_score_output(self, choice: ChoiceState, out: EngineOutput, now: float) -> ChoiceDelta | None:
        """A score-only choice: the engine's one output (no token) ends it with "length"; its
        prefill is done, so its prompt counts in the prompt token metrics and the stats line, as
        a generating choice's does at its first token."""
        if out.finish_reason is None:
            self._client.abort_requests([choice.request_id])
        prompt = self.prompts[choice.prompt_index]
        prompt.metrics.add_prompt_tokens(len(prompt.token_ids), out.num_cached_tokens)
        choice.num_cached_tokens = max(choice.num_cached_tokens, out.num_cached_tokens)
        choice.finish_reason = "length"
        self._num_unfinished -= 1
        _take_engine_times(choice, out)
        self._finished(choice, now)
        return ChoiceDelta(
            choice.index,
            choice.prompt_index,
            "",
            True,
            "length",
            None,
            prompt_logprobs=choice.prompt_logprobs,
            token_ids=None if choice.token_ids is None else [],
        )


def _take_engine_times(choice: ChoiceState, out: EngineOutput) -> None:
    """Keep the engine's times ``out`` carries (its first output and its final one do)."""
    if out.queued_time is not None:
        choice.queued_time = out.queued_time
    if out.first_scheduled_time is not None:
        choice.scheduled_time = out.first_scheduled_time
    if out.first_token_time is not None:
        choice.engine_first_token_time = out.first_token_time
    if out.finished_time is not None:
        choice.engine_finished_time = out.finished_time
