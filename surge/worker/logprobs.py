"""Log-probabilities on the device: the sampled tokens' (with top-k) and the prompt tokens'.

Values are the log-softmax of the model's raw logits (before penalties, ``min_tokens``
suppression, temperature, top-k/p and min-p), as vLLM's default ``raw_logprobs`` mode. For
each row the result is the actual token's log-probability and rank (1 + the number of
tokens strictly more likely) and the ``k`` most likely tokens in rank order, packed as

- ``ids [R, k + 2]`` int64: the actual token, the top-k ids, then the actual token's rank;
- ``lps [R, k + 1]`` float32: the actual token's log-probability, then the top-k's.

A request with vLLM's ``logprob_token_ids`` gets its listed ids (in its order) where the top-k
would be.

Only the rows that ask are computed, and nothing at all in a step where no request asks:
the runner decides that from host state (:class:`LogprobRows` is rebuilt only when the
batch composition changes, and prompt positions only when the scheduler says a request
with ``prompt_logprobs`` is alive). The two result tensors of a step go to pinned host
buffers with ``non_blocking`` copies queued before the event the step's sampled ids wait
on, so asking adds no host sync.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from surge.core.logprobs import LogprobsLists
from surge.core.outputs import SchedulerOutput
from surge.request import Request


def topk_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-softmax of ``logits [R, V]`` (any float dtype; computed in float32), the
    log-probability and rank of ``token_ids [R]`` and the ``k`` most likely tokens.

    Returns:
        ``(ids [R, k + 2] int64, lps [R, k + 1] float32)`` as in the module docstring.
    """
    return pack_logprobs(torch.log_softmax(logits.float(), dim=-1), token_ids, k)


def pack_logprobs(lp: torch.Tensor, token_ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """From log-probabilities ``lp [R, V]`` float32: the log-probability and rank of
    ``token_ids [R]`` and the top ``k``, packed as ``(ids [R, k + 2], lps [R, k + 1])``."""
    token_lp = lp.gather(1, token_ids[:, None])
    ranks = (lp > token_lp).sum(dim=-1, keepdim=True) + 1
    if k > 0:
        top_lp, top_ids = lp.topk(k, dim=-1)
        return torch.cat([token_ids[:, None], top_ids, ranks], dim=1), torch.cat([token_lp, top_lp], dim=1)
    return torch.cat([token_ids[:, None], ranks], dim=1), token_lp


@dataclass
class LogprobRows:
    """Which sampled rows of a batch composition ask for logprobs.

    Attributes:
        rows: ``[R]`` int64 device indices into the sampled rows, or None when every row asks.
        row_ids: the ``R`` sampled-row indices on the host.
        ks: each asking row's number of entries (``SamplingParams.num_logprobs``).
        k_max: ``max(ks)``, the width computed for all of them.
        listed: ``[R, k_max]`` int64 device ids of the rows that list their ids
            (``logprob_token_ids``, padded with 0), or None when no row lists any.
        use_listed: ``[R, 1]`` bool device mask of those rows (None with ``listed``).
        k_top: the top-k computed for the other rows (``max`` of their ``ks``; 0 if none).
    """

    rows: torch.Tensor | None
    row_ids: list[int]
    ks: list[int]
    k_max: int
    listed: torch.Tensor | None = None
    use_listed: torch.Tensor | None = None
    k_top: int = 0

    @classmethod
    def build(cls, requests: list[Request], device: torch.device) -> LogprobRows | None:
        """The asking rows of ``requests`` (the sampled requests in row order), or None
        when none asks."""
        row_ids = [i for i, r in enumerate(requests) if r.sampling_params.num_logprobs is not None]
        if not row_ids:
            return None
        params = [requests[i].sampling_params for i in row_ids]
        ks = [p.num_logprobs or 0 for p in params]
        rows = None if len(row_ids) == len(requests) else to_device(row_ids, device)
        k_max = max(ks)
        if all(p.logprob_token_ids is None for p in params):
            return cls(rows, row_ids, ks, k_max, k_top=k_max)
        flat: list[int] = []
        mask: list[int] = []
        for p in params:
            ids = p.logprob_token_ids or ()
            flat.extend(ids)
            flat.extend([0] * (k_max - len(ids)))
            mask.append(int(p.logprob_token_ids is not None))
        k_top = max((k for k, p in zip(ks, params, strict=True) if p.logprob_token_ids is None), default=0)
        listed = to_device(flat, device).view(len(params), k_max)
        use_listed = to_device(mask, device).view(len(params), 1).bool()
        return cls(rows, row_ids, ks, k_max, listed, use_listed, k_top)

    def compute(self, logits: torch.Tensor) -> torch.Tensor:
        """Log-softmax of the asking rows of ``logits [S, V]`` (call before anything may
        modify the logits): ``[R, V]`` float32."""
        rows = logits if self.rows is None else logits.index_select(0, self.rows)
        return torch.log_softmax(rows.float(), dim=-1)

    def finish(self, lp: torch.Tensor, sampled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pack the sampled tokens' log-probabilities, ranks and top-k (or listed ids) from
        ``lp`` (from :meth:`compute`) and ``sampled [S]``: ``(ids [R, k_max + 2], lps [R,
        k_max + 1])``; a listing row's entries are its ids in its order."""
        tokens = sampled if self.rows is None else sampled.index_select(0, self.rows)
        if self.listed is None:
            return pack_logprobs(lp, tokens, self.k_max)
        assert self.use_listed is not None
        ids, lps = pack_logprobs(lp, tokens, 0)  # [R, 2] (token, rank), [R, 1]
        alt_ids = self.listed
        alt_lps = lp.gather(1, self.listed)
        if self.k_top:
            top_lp, top_ids = lp.topk(self.k_top, dim=-1)
            pad = self.k_max - self.k_top
            if pad:
                top_lp = torch.nn.functional.pad(top_lp, (0, pad))
                top_ids = torch.nn.functional.pad(top_ids, (0, pad))
            alt_ids = torch.where(self.use_listed, alt_ids, top_ids)
            alt_lps = torch.where(self.use_listed, alt_lps, top_lp)
        return torch.cat([ids[:, :1], alt_ids, ids[:, 1:]], dim=1), torch.cat([lps, alt_lps], dim=1)


@dataclass
class PromptLogprobPlan:
    """The prompt positions of one step whose logprobs are asked for.

    Position ``p`` of a prompt predicts prompt token ``p + 1``; a request's rows cover the
    prompt tokens ``first .. first + count - 1`` (index in the prompt, >= 1) that this
    chunk's positions predict and that are not stored yet.

    Attributes:
        rows: token rows of the step's flattened batch, one per position.
        targets: the prompt token each row predicts.
        spans: per request ``(request_id, first, count, k)``, in row order.
        k_max: the largest ``prompt_logprobs`` of the step.
    """

    rows: list[int]
    targets: list[int]
    spans: list[tuple[str, int, int, int]]
    k_max: int

    @classmethod
    def build(cls, scheduler_output: SchedulerOutput, query_start_loc: list[int]) -> PromptLogprobPlan | None:
        """The plan of a step (None when no position needs it). Call before
        ``Scheduler.advance`` (each request's ``num_computed_tokens`` is its chunk's start).

        Args:
            scheduler_output: the step.
            query_start_loc: ``[num_seqs + 1]`` host offsets of each request's tokens.
        """
        rows: list[int] = []
        targets: list[int] = []
        spans: list[tuple[str, int, int, int]] = []
        k_max = 0
        for i, s in enumerate(scheduler_output.scheduled):
            req = s.request
            stored = req.prompt_logprobs
            if stored is None:
                continue
            prompt = req.prompt_token_ids
            start = req.num_computed_tokens
            lo = max(start, len(stored))
            hi = min(start + s.num_new_tokens, len(prompt) - 1)
            if hi <= lo:
                continue
            base = query_start_loc[i] - start
            rows.extend(range(base + lo, base + hi))
            targets.extend(prompt[lo + 1 : hi + 1])
            k = req.sampling_params.prompt_logprobs or 0
            spans.append((req.request_id, lo + 1, hi - lo, k))
            k_max = max(k_max, k)
        if not rows:
            return None
        return cls(rows, targets, spans, k_max)

    def compute(
        self,
        hidden: torch.Tensor,
        compute_logits: Callable[[torch.Tensor], torch.Tensor],
        chunk_rows: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """LM head and :func:`topk_logprobs` over the plan's rows of ``hidden [T, H]``, at
        most ``chunk_rows`` rows at a time (bounds the ``[rows, V]`` temporaries to what
        the sampler's memory profile covers).

        Returns:
            ``(ids [N, k_max + 2], lps [N, k_max + 1])``.
        """
        device = hidden.device
        rows = to_device(self.rows, device)
        targets = to_device(self.targets, device)
        ids_parts, lp_parts = [], []
        for lo in range(0, len(self.rows), chunk_rows):
            logits = compute_logits(hidden.index_select(0, rows[lo : lo + chunk_rows]))
            ids, lps = topk_logprobs(logits, targets[lo : lo + chunk_rows], self.k_max)
            ids_parts.append(ids)
            lp_parts.append(lps)
        if len(ids_parts) == 1:
            return ids_parts[0], lp_parts[0]
        return torch.cat(ids_parts), torch.cat(lp_parts)


def to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """An int64 tensor on ``device`` without a host sync (through pinned memory on CUDA)."""
    t = torch.tensor(values, dtype=torch.int64)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


class StepLogprobs:
    """The logprob tensors of one launched step, on their way to the host.

    Args:
        sample: ``(rows, ids, lps)`` of the sampled tokens, or None.
        prompt: ``(plan, ids, lps)`` of prompt positions, or None.
    """

    __slots__ = ("sample", "prompt")

    def __init__(
        self,
        sample: tuple[LogprobRows, torch.Tensor, torch.Tensor] | None,
        prompt: tuple[PromptLogprobPlan, torch.Tensor, torch.Tensor] | None,
    ) -> None:
        self.sample = sample
        self.prompt = prompt

    def copy_to_host(self) -> None:
        """Queue ``non_blocking`` copies of the device tensors into fresh pinned buffers
        (CUDA only; the caller records the event that :meth:`lists` is read after)."""
        if self.sample is not None:
            rows, ids, lps = self.sample
            self.sample = (rows, _to_pinned(ids), _to_pinned(lps))
        if self.prompt is not None:
            plan, ids, lps = self.prompt
            self.prompt = (plan, _to_pinned(ids), _to_pinned(lps))

    def lists(
        self, sampled_request_ids: list[str]
    ) -> tuple[dict[str, LogprobsLists], dict[str, tuple[int, LogprobsLists]]]:
        """Host lists, once the step's event has completed: request_id -> one row for the
        sampled token, and request_id -> (first prompt index, rows)."""
        sample_out: dict[str, LogprobsLists] = {}
        prompt_out: dict[str, tuple[int, LogprobsLists]] = {}
        if self.sample is not None:
            rows, ids, lps = self.sample
            id_rows, lp_rows = ids.tolist(), lps.tolist()
            for j, (i, k) in enumerate(zip(rows.row_ids, rows.ks, strict=True)):
                r = id_rows[j]
                sample_out[sampled_request_ids[i]] = LogprobsLists(
                    [r[: k + 1]], [lp_rows[j][: k + 1]], [r[-1]]
                )
        if self.prompt is not None:
            plan, ids, lps = self.prompt
            id_rows, lp_rows = ids.tolist(), lps.tolist()
            at = 0
            for request_id, first, count, k in plan.spans:
                part = LogprobsLists(
                    [r[: k + 1] for r in id_rows[at : at + count]],
                    [r[: k + 1] for r in lp_rows[at : at + count]],
                    [r[-1] for r in id_rows[at : at + count]],
                )
                prompt_out[request_id] = (first, part)
                at += count
        return sample_out, prompt_out


def _to_pinned(t: torch.Tensor) -> torch.Tensor:
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host
