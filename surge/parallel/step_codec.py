"""SchedulerOutput <-> StepMessage: the scheduler's step as deltas, and its mirror on a worker.

The engine keeps one :class:`StepEncoder`; it remembers what the workers already know of each
request (its prompt and sampling parameters, how many block ids and output ids were sent), so
a decode step carries a few integers per request. Each worker keeps one :class:`StepDecoder`,
which mirrors every live request as a :class:`~surge.request.Request` and rebuilds the
``SchedulerOutput`` the model runner takes, so the runner stays rank-agnostic. No torch here.
"""

from __future__ import annotations

from surge.core.outputs import ScheduledRequest, SchedulerOutput
from surge.core.thinking_budget import ForcedTokens
from surge.parallel.messages import NewRequestData, ScheduledData, StepMessage
from surge.request import Request


class _Sent:
    """What the workers know of one request."""

    __slots__ = ("request", "blocks", "num_blocks", "num_outputs")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.blocks: list[int] | None = None
        self.num_blocks = 0
        self.num_outputs = 0


class StepEncoder:
    """Turns each :class:`SchedulerOutput` into a :class:`StepMessage` of deltas.

    Must see every step, in order (the workers' state is the sum of the messages).
    """

    def __init__(self) -> None:
        self._sent: dict[str, _Sent] = {}
        self._step = 0

    def __len__(self) -> int:
        """Requests the workers hold."""
        return len(self._sent)

    def encode(self, so: SchedulerOutput) -> StepMessage:
        """The message of ``so``; call it when the step is launched (before ``advance``)."""
        sent = self._sent
        for rid in so.finished_request_ids:
            known = sent.get(rid)
            if known is not None and known.request.is_finished:
                del sent[rid]
        new: list[NewRequestData] = []
        scheduled: list[ScheduledData] = []
        for s in so.scheduled:
            req = s.request
            known = sent.get(req.request_id)
            if known is None or known.request is not req:
                known = sent[req.request_id] = _Sent(req)
                new.append(NewRequestData(req.request_id, req.prompt_token_ids, req.sampling_params))
            blocks = req.block_ids
            blocks_reset = known.blocks is not blocks or len(blocks) < known.num_blocks
            start = 0 if blocks_reset else known.num_blocks
            known.blocks, known.num_blocks = blocks, len(blocks)
            outputs = req.output_token_ids
            outputs_reset = len(outputs) < known.num_outputs
            first = 0 if outputs_reset else known.num_outputs
            known.num_outputs = len(outputs)
            scheduled.append(
                ScheduledData(
                    req.request_id,
                    s.num_new_tokens,
                    s.sample,
                    req.num_computed_tokens,
                    blocks[start:],
                    blocks_reset,
                    outputs[first:],
                    outputs_reset,
                )
            )
        msg = StepMessage(
            self._step,
            new,
            scheduled,
            so.num_scheduled_tokens,
            list(so.preempted_request_ids),
            list(so.finished_request_ids),
            so.any_prompt_logprobs,
            # decided now: a step with a budget is applied before the next is scheduled here
            forced_tokens=None if so.forced_tokens is None else so.forced_tokens.resolve() or None,
        )
        if so.grammar is not None:  # filled here, applied by every rank
            sampled = [s.request for s in so.scheduled if s.sample]
            mask = so.grammar.host_mask(sampled)
            if mask is not None:
                msg.grammar_mask = mask.tobytes()
                msg.grammar_request_ids = [r.request_id for r in sampled]
        self._step += 1
        return msg


class StepDecoder:
    """A worker's mirror of the engine's requests.

    Args:
        eos_token_ids: the model's EOS ids (every request's ``eos_token_ids``).
    """

    def __init__(self, eos_token_ids: frozenset[int]) -> None:
        self._eos = eos_token_ids
        self._requests: dict[str, Request] = {}
        self._next_step = 0

    def __len__(self) -> int:
        return len(self._requests)

    def decode(self, msg: StepMessage) -> SchedulerOutput:
        """Apply ``msg`` to the mirrored requests and return the step's ``SchedulerOutput``.

        Raises:
            ValueError: a step message is missing (out of order) or names an unknown request.
        """
        if msg.step != self._next_step:
            raise ValueError(f"step message {msg.step} arrived, expected {self._next_step}")
        self._next_step += 1
        reqs = self._requests
        for rid in msg.finished_request_ids:
            reqs.pop(rid, None)
        for n in msg.new_requests:
            reqs[n.request_id] = Request(n.request_id, n.prompt_token_ids, n.sampling_params, self._eos)
        scheduled: list[ScheduledRequest] = []
        for d in msg.scheduled:
            req = reqs.get(d.request_id)
            if req is None:
                raise ValueError(f"step {msg.step} schedules unknown request {d.request_id!r}")
            if d.blocks_reset:
                req.block_ids = list(d.new_block_ids)
            elif d.new_block_ids:
                req.block_ids.extend(d.new_block_ids)
            if d.outputs_reset:
                req.output_token_ids = list(d.new_output_ids)
            elif d.new_output_ids:
                req.output_token_ids.extend(d.new_output_ids)
            req.num_computed_tokens = d.num_computed_tokens
            scheduled.append(ScheduledRequest(req, d.num_new_tokens, d.sample))
        grammar = None
        if msg.grammar_request_ids:
            import numpy as np

            from surge.structured.manager import StaticGrammarBitmask

            rows = len(msg.grammar_request_ids)
            mask = np.frombuffer(msg.grammar_mask, dtype=np.int32).reshape(rows, -1).copy()
            grammar = StaticGrammarBitmask(mask, msg.grammar_request_ids)
        return SchedulerOutput(
            scheduled=scheduled,
            num_scheduled_tokens=msg.num_scheduled_tokens,
            preempted_request_ids=msg.preempted_request_ids,
            finished_request_ids=msg.finished_request_ids,
            any_prompt_logprobs=msg.any_prompt_logprobs,
            grammar=grammar,
            forced_tokens=None if msg.forced_tokens is None else ForcedTokens.fixed(msg.forced_tokens),
        )
