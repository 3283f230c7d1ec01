"""Per-step sampling state of the runner: incremental penalty inputs and the sampling
tensors of an unchanged batch composition.

Decode batches rarely change from one step to the next, so the per-row tensors of
:class:`~surge.layers.sampler.SamplingMetadata` are built once per batch composition (the
tuple of sampled request ids) and reused; an all-greedy batch needs none and is one
argmax. Rows whose inputs change every step (penalties, per-request seeds, ``min_tokens``,
bad words of several tokens) make the batch rebuild its metadata every step; the dense rows
of large ``logit_bias`` dicts and ``allowed_token_ids`` lists are kept between those builds
(:class:`~surge.layers.sampler.DenseRuleRows`) while their requests stay in the batch. Which rows ask
for logprobs is decided with the composition too (:class:`~surge.worker.logprobs.LogprobRows`),
so a batch where none asks pays nothing for the feature.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from surge.core.thinking_budget import ForcedTokens
from surge.layers.sampler import DenseRuleRows, Sampler, SamplingMetadata
from surge.request import Request
from surge.sampling_params import GREEDY_EPS, SamplingParams
from surge.worker.logprobs import LogprobRows, to_device


def needs_fresh_sampling_tensors(p: SamplingParams) -> bool:
    """Whether a request's sampling tensors change from step to step (see
    :attr:`SamplingParams.needs_token_history`)."""
    return p.needs_token_history


class _PenaltyState:
    """Penalty inputs of one request, updated incrementally: output token counts ``[V]``
    float32 over the first ``num_counted`` outputs, and the prompt's token mask ``[V]``."""

    __slots__ = ("counts", "prompt_mask", "num_counted")

    def __init__(self, request: Request, vocab_size: int, device: torch.device) -> None:
        self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)
        self.prompt_mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        ids = [t for t in request.prompt_token_ids if 0 <= t < vocab_size]
        if ids:
            self.prompt_mask[torch.tensor(ids, device=device)] = True
        self.num_counted = 0

    def update(self, output_token_ids: list[int], vocab_size: int) -> None:
        if len(output_token_ids) < self.num_counted:  # outputs were reset: count again
            self.counts.zero_()
            self.num_counted = 0
        new = [t for t in output_token_ids[self.num_counted :] if 0 <= t < vocab_size]
        if new:
            idx = torch.tensor(new, device=self.counts.device)
            self.counts.index_add_(0, idx, torch.ones(len(new), device=self.counts.device))
        self.num_counted = len(output_token_ids)


class StepSampler:
    """Samples the rows of a step with the runner's :class:`Sampler`.

    Args:
        sampler: the device sampler (its generator draws the unseeded rows).
        vocab_size: ``V``.
        device: where logits live.

    Attributes:
        penalty_states: request_id -> incremental penalty inputs (requests with penalties).
        dense_rules: the dense device rows of the large token rules (``logit_bias``,
            ``allowed_token_ids`` of at least ``V / DENSE_RULE_DIVISOR`` tokens) of the last
            built batch, one ``[V]`` row per distinct rule set; each build releases the rows of
            requests no longer in the batch.
        greedy: the current composition is all greedy with nothing per step (argmax).
        fresh: the current composition needs new tensors every step.
        cached: the reused metadata of the current composition, if any.
        logprob_rows: the rows of the current composition that ask for logprobs (None: none).
    """

    def __init__(self, sampler: Sampler, vocab_size: int, device: torch.device) -> None:
        self.sampler = sampler
        self.vocab_size = vocab_size
        self.device = device
        self.penalty_states: dict[str, _PenaltyState] = {}
        self.dense_rules = DenseRuleRows()
        self._zero_counts: torch.Tensor | None = None
        self._zero_mask: torch.Tensor | None = None
        self._key: tuple[str, ...] | None = None
        self.greedy = False
        self.fresh = True
        self.cached: SamplingMetadata | None = None
        self.logprob_rows: LogprobRows | None = None

    def drop(self, request_ids: Iterable[str]) -> None:
        """Forget the penalty state of finished requests; when none of the last batch is left,
        the dense rule rows too (an idle engine holds none, and an offline caller that changes a
        ``logit_bias`` dict between ``generate`` calls gets it converted again).

        A finished request of the last batch also ends its composition: a new request may take
        its id (``LLMEngine.add_request`` accepts an id again once its request finished), and
        the tensors built for the old one (its temperature, its logprobs width) must not serve
        the new one."""
        request_ids = set(request_ids)
        for request_id in request_ids:
            self.penalty_states.pop(request_id, None)
        if self._key is not None and not request_ids.isdisjoint(self._key):
            if request_ids.issuperset(self._key):
                self.dense_rules.retain(())
            self._key = None

    def sample(
        self,
        logits: torch.Tensor,
        requests: list[Request],
        grammar: Any = None,
        forced: ForcedTokens | None = None,
    ) -> torch.Tensor:
        """``logits [S, V] -> [S]`` int64 token ids.

        ``grammar`` (a :class:`surge.structured.manager.GrammarBitmask`, or None) first sets
        the logits of the tokens a grammar forbids to -inf, in place.

        The batch composition is the tuple of sampled request ids. When it is unchanged
        since the last step and no row needs per-step tensors (penalties, seeds,
        ``min_tokens``, bad words of several tokens), the last step's :class:`SamplingMetadata`
        is reused; an all-greedy batch of that kind without ``logit_bias``,
        ``allowed_token_ids`` or bad words needs no tensors at all and is one argmax.

        ``forced`` (``SchedulerOutput.forced_tokens``) is asked once the rows are sampled which
        of them a spent ``thinking_token_budget`` forces to the reasoning end (it may wait for
        the previous step's ids then), and those rows' sampled ids are overwritten, whatever the
        logits, masks and sampling settings said.
        """
        return self.sample_with_logprobs(logits, requests, grammar, forced)[0]

    def sample_with_logprobs(
        self,
        logits: torch.Tensor,
        requests: list[Request],
        grammar: Any = None,
        forced: ForcedTokens | None = None,
    ) -> tuple[torch.Tensor, tuple[LogprobRows, torch.Tensor, torch.Tensor] | None]:
        """:meth:`sample`, plus the logprobs of the rows that ask for them (computed from
        the raw ``logits`` before sampling touches them; see :mod:`surge.worker.logprobs`).
        A ``grammar`` mask is applied first, so a constrained row's logprobs are those of
        the masked logits (as in vLLM); a ``forced`` row's sampled token is the forced one,
        its logprob that token's.

        Returns:
            ``(token ids [S] int64, None or (rows, ids [R, k + 2], lps [R, k + 1]))``.
        """
        if grammar is not None:
            grammar.apply(logits, requests)
        key = tuple([r.request_id for r in requests])
        if key != self._key:
            params = [r.sampling_params for r in requests]
            self._key = key
            if self.dense_rules.num_rows:  # rows of requests no longer in the batch go
                self.dense_rules.retain(
                    [p.logit_bias for p in params] + [p.allowed_token_ids for p in params]
                )
            self.fresh = any(needs_fresh_sampling_tensors(p) for p in params)
            self.greedy = (
                not self.fresh
                and all(p.temperature < GREEDY_EPS for p in params)
                and not any(p.has_logit_rules for p in params)
            )
            self.cached = None
            self.logprob_rows = LogprobRows.build(requests, self.device)
        rows = self.logprob_rows
        constrained = grammar is not None
        if rows is None:
            sampled = self._sample(logits, requests, constrained)
            if forced is not None:
                self._force(sampled, requests, forced)
            return sampled, None
        lp = rows.compute(logits)
        sampled = self._sample(logits, requests, constrained)
        if forced is not None:
            self._force(sampled, requests, forced)
        ids, lps = rows.finish(lp, sampled)
        return sampled, (rows, ids, lps)

    def _force(self, sampled: torch.Tensor, requests: list[Request], forced_tokens: ForcedTokens) -> None:
        """Overwrite the sampled ids of the rows a spent budget forces, in place (two small copies
        to the device through pinned memory, so the host does not wait for the step; only on a
        step that forces a row)."""
        forced = forced_tokens.resolve()
        if not forced:
            return
        rows = [i for i, r in enumerate(requests) if r.request_id in forced]
        if not rows:
            return
        tokens = [forced[requests[i].request_id] for i in rows]
        index = to_device(rows, sampled.device)
        values = to_device(tokens, sampled.device).to(sampled.dtype)
        sampled.index_copy_(0, index, values)

    def _sample(
        self, logits: torch.Tensor, requests: list[Request], constrained: bool = False
    ) -> torch.Tensor:
        if self.greedy:
            return logits.argmax(dim=-1)
        if self.fresh:
            return self.sampler(logits, self.metadata(requests), constrained)
        if self.cached is None:
            self.cached = self.metadata(requests)
        return self.sampler(logits, self.cached, constrained)

    def metadata(self, requests: list[Request]) -> SamplingMetadata:
        """The full :class:`SamplingMetadata` of ``requests`` (penalty inputs from the
        incremental per-request state)."""
        params = [r.sampling_params for r in requests]
        penalty = None
        if any(p.has_penalties for p in params):
            penalty = self._penalty_tensors(requests)
        return SamplingMetadata.build(
            params,
            [r.prompt_token_ids for r in requests],
            [r.output_token_ids for r in requests],
            [r.eos_token_ids for r in requests],
            self.vocab_size,
            self.device,
            penalty_tensors=penalty,
            dense_rules=self.dense_rules,
        )

    def _penalty_tensors(self, requests: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        """Stack ``(output_token_counts [B, V], prompt_mask [B, V])`` from the per-request
        incremental state (zero rows for requests without penalties)."""
        if self._zero_counts is None:
            self._zero_counts = torch.zeros(self.vocab_size, dtype=torch.float32, device=self.device)
            self._zero_mask = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
        counts, masks = [], []
        for r in requests:
            if not r.sampling_params.has_penalties:
                counts.append(self._zero_counts)
                masks.append(self._zero_mask)
                continue
            state = self.penalty_states.get(r.request_id)
            if state is None:
                state = self.penalty_states[r.request_id] = _PenaltyState(r, self.vocab_size, self.device)
            state.update(r.output_token_ids, self.vocab_size)
            counts.append(state.counts)
            masks.append(state.prompt_mask)
        return torch.stack(counts), torch.stack(masks)
