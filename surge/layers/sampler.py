"""Batched token sampling on the device: penalties, temperature, min-p, top-k, top-p, seeds.

Every step is a tensor operation over the whole batch ``[B, V]``; there is no per-request
loop over the vocabulary and no host sync before the sampled ids are copied back.

Sampling draws with the exponential race (the Gumbel-max trick in another form, as in
vLLM): ``argmax_i p_i / E_i`` with ``E_i ~ Exp(1)`` i.i.d. picks ``i`` with probability
``p_i``. For a request with a seed, ``E`` comes from a counter-based hash of
``(seed, output position, vocab index)`` (Salmon et al., 2011, "Parallel random numbers:
as easy as 1, 2, 3"; the mixing function is a MurmurHash-style finalizer), so its draws do
not depend on the rest of the batch (its tokens then do not either, as long as its logits do
not: see ``seed`` in docs/openai-api.md). Other requests draw from one ``torch.Generator``
seeded with the engine seed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from surge.layers.top_k_top_p import (
    apply_top_k_top_p,
    apply_top_k_top_p_window,
    sample_top_k_window,
    top_k_window,
)
from surge.sampling_params import GREEDY_EPS, SamplingParams

_M32 = 0xFFFFFFFF

DENSE_RULE_DIVISOR = 8
"""A ``logit_bias`` dict or ``allowed_token_ids`` list of at least ``vocab_size / 8`` tokens is
laid out as one dense ``[V]`` row per distinct rule set (:class:`DenseRuleRows`) instead of
``(row, token)`` entries per batch row. On 2 CPUs, adding 128 rows' biases took about 16 ns
per sparse entry (``index_put`` with ``accumulate``) against about 2 ns per element of a dense
row (``index_add_`` of the row broadcast over its batch rows), so dense is cheaper above about
``V / 8`` tokens per row even before counting the build (per row for entries, per distinct rule
set for dense rows); on a GPU the sparse scatter sorts its entries and dense wins earlier."""


@dataclass
class SamplingMetadata:
    """Per-row sampling inputs of one step (``B`` rows, vocabulary ``V``).

    Optional tensors are None when no row of the batch uses the feature, so the sampler
    skips that work. Host booleans are decided when the batch is built (no device sync).

    Attributes:
        temperature: ``[B]`` float32; rows below 1e-5 are greedy (argmax).
        all_greedy: every row is greedy.
        all_random: no row is greedy.
        all_seeded: every sampling row has its own seed (the shared generator is not drawn).
        top_k: ``[B]`` int64, 0 = off.
        top_p: ``[B]`` float32, 1 = off.
        top_k_window: host int ``W`` when every row that truncates (top-k or top-p) has
            ``top_k`` in ``1..TOP_K_WINDOW_MAX``: top-k/top-p then take ``torch.topk(W)``
            instead of a full sort (:mod:`surge.layers.top_k_top_p`); None: full sort.
        window_sample: host bool, the batch can take :func:`sample_top_k_window` (on CUDA):
            some row samples, every sampling row has ``top_k`` in ``1..top_k_window``, and no
            row has its own seed (seeded rows keep the full-row hash noise).
        min_p: ``[B]`` float32, 0 = off.
        seeds: ``[B]`` int64 per-request seeds, as given (any value where ``seeded`` is False).
        seeded: ``[B]`` bool, rows that use their own seed.
        output_positions: ``[B]`` int64, index among the outputs of the token being sampled
            (the request's number of output tokens so far); part of the seeded hash.
        presence_penalties, frequency_penalties, repetition_penalties: ``[B]`` float32.
        output_token_counts: ``[B, V]`` float32, occurrences of each token in the output.
        prompt_mask: ``[B, V]`` bool, tokens present in the prompt.
        suppress_rows, suppress_tokens: ``[S]`` int64 pairs whose logits are set to -inf
            (EOS and stop ids of requests still under ``min_tokens``, ``ignore_eos`` or not, and
            banned bad words).
        logit_bias_rows, logit_bias_tokens, logit_bias_values: ``[L]`` (int64, int64, float32)
            biases added to the logits (``logit_bias``) of rows whose dict has fewer than
            ``vocab_size / DENSE_RULE_DIVISOR`` entries.
        logit_bias_dense: the other rows' biases, one ``(rows [R_d] int64, bias [V] float32)``
            pair per distinct dict (the ``n`` choices of a request share one): ``bias`` holds
            the dict's values and -0.0 elsewhere (``x + -0.0 == x`` bit for bit, -0.0 and
            infinities included, so the sum equals the sparse scatter's exactly).
        allowed_mask: ``[B, V]`` bool, False for tokens a row may not sample
            (``allowed_token_ids``; rows without the field are all True).
    """

    temperature: torch.Tensor
    all_greedy: bool
    all_random: bool
    all_seeded: bool = False
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    top_k_window: int | None = None
    window_sample: bool = False
    min_p: torch.Tensor | None = None
    seeds: torch.Tensor | None = None
    seeded: torch.Tensor | None = None
    output_positions: torch.Tensor | None = None
    presence_penalties: torch.Tensor | None = None
    frequency_penalties: torch.Tensor | None = None
    repetition_penalties: torch.Tensor | None = None
    output_token_counts: torch.Tensor | None = None
    prompt_mask: torch.Tensor | None = None
    suppress_rows: torch.Tensor | None = None
    suppress_tokens: torch.Tensor | None = None
    logit_bias_rows: torch.Tensor | None = None
    logit_bias_tokens: torch.Tensor | None = None
    logit_bias_values: torch.Tensor | None = None
    logit_bias_dense: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None
    allowed_mask: torch.Tensor | None = None

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        prompt_token_ids: Sequence[Sequence[int]],
        output_token_ids: Sequence[Sequence[int]],
        eos_token_ids: Sequence[Iterable[int]],
        vocab_size: int,
        device: torch.device | str,
        penalty_tensors: tuple[torch.Tensor, torch.Tensor] | None = None,
        dense_rules: DenseRuleRows | None = None,
    ) -> SamplingMetadata:
        """Build the tensors of a batch, one row per entry of ``params``.

        ``output_token_ids`` gives every row's output length (for seeds and
        ``min_tokens``). When a row has penalties, the penalty inputs come from
        ``penalty_tensors`` (``(output_token_counts, prompt_mask)``, e.g. kept incrementally
        by the caller) or else are computed here from the token id lists.

        Large ``logit_bias`` dicts and ``allowed_token_ids`` lists (at least
        ``vocab_size / DENSE_RULE_DIVISOR`` tokens) become one dense device row per distinct
        rule set, taken from ``dense_rules`` when given (kept there between builds; the rows
        this build does not use are released from it) or else converted for this build only.
        """
        temps = np.array([p.temperature for p in params], dtype=np.float32)
        greedy = temps < GREEDY_EPS
        num_out = np.array([len(o) for o in output_token_ids], dtype=np.int64)

        def tensor(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(device, non_blocking=True)

        md = cls(temperature=tensor(temps), all_greedy=bool(greedy.all()), all_random=not bool(greedy.any()))
        sampling_rows = [p for p, g in zip(params, greedy, strict=True) if not g]
        if any(p.top_k > 0 for p in sampling_rows):
            md.top_k = tensor(np.array([p.top_k for p in params], dtype=np.int64))
        if any(p.top_p < 1.0 for p in sampling_rows):
            md.top_p = tensor(np.array([p.top_p for p in params], dtype=np.float32))
        if md.top_k is not None:
            md.top_k_window = top_k_window(
                [p.top_k for p in sampling_rows if p.top_k > 0 or p.top_p < 1.0], vocab_size
            )
        if any(p.min_p > 0.0 for p in sampling_rows):
            md.min_p = tensor(np.array([p.min_p for p in params], dtype=np.float32))
        if any(p.seed is not None for p in sampling_rows):
            md.seeds = tensor(np.array([p.seed or 0 for p in params], dtype=np.int64))  # [-2**63, 2**63)
            md.seeded = tensor(np.array([p.seed is not None for p in params], dtype=np.bool_))
            md.output_positions = tensor(num_out)
            md.all_seeded = all(p.seed is not None for p in sampling_rows)
        md.window_sample = (
            md.top_k_window is not None
            and md.seeds is None
            and bool(sampling_rows)
            and all(p.top_k > 0 for p in sampling_rows)
        )
        if any(p.has_penalties for p in params):
            md.presence_penalties = tensor(np.array([p.presence_penalty for p in params], dtype=np.float32))
            md.frequency_penalties = tensor(np.array([p.frequency_penalty for p in params], dtype=np.float32))
            md.repetition_penalties = tensor(
                np.array([p.repetition_penalty for p in params], dtype=np.float32)
            )
            if penalty_tensors is None:
                use = [p.has_penalties for p in params]
                penalty_tensors = penalty_tensors_from_ids(
                    [ids if u else [] for u, ids in zip(use, prompt_token_ids, strict=True)],
                    [ids if u else [] for u, ids in zip(use, output_token_ids, strict=True)],
                    vocab_size,
                    device,
                )
            md.output_token_counts, md.prompt_mask = penalty_tensors
        suppressed = _suppressed_entries(params, num_out, output_token_ids, eos_token_ids, vocab_size)
        if suppressed is not None:
            md.suppress_rows, md.suppress_tokens = map(tensor, suppressed)
        rules = dense_rules if dense_rules is not None else DenseRuleRows()
        if any(p.logit_bias for p in params):
            small, dense = _dense_groups([p.logit_bias for p in params], vocab_size, device, rules)
            md.logit_bias_dense = dense or None
            bias = _row_entries(small, vocab_size)
            if bias is not None and bias[2] is not None:
                md.logit_bias_rows, md.logit_bias_tokens, md.logit_bias_values = map(tensor, bias)
        if any(p.allowed_token_ids is not None for p in params):
            lists = [p.allowed_token_ids for p in params]
            small, dense = _dense_groups(lists, vocab_size, device, rules)
            mask = torch.ones(len(params), vocab_size, dtype=torch.bool, device=device)
            for rows, row in dense:
                mask[rows] = row
            limited = np.array([i for i, ids in enumerate(small) if ids is not None], dtype=np.int64)
            if len(limited):
                mask[tensor(limited)] = False
                allowed = _row_entries(small, vocab_size)
                if allowed is not None:
                    mask[tensor(allowed[0]), tensor(allowed[1])] = True
            md.allowed_mask = mask
        rules.release_unused()
        return md


_Rule = Mapping[int, float] | Sequence[int]
"""A ``logit_bias`` dict (token -> value) or an ``allowed_token_ids`` list."""


class DenseRuleRows:
    """Dense device rows of large token rules, one per distinct rule set, kept between
    :meth:`SamplingMetadata.build` calls (a :class:`surge.worker.sampling_state.StepSampler`
    holds one, so a batch rebuilt every step, e.g. with seeds, converts its rules once).

    A rule set is a ``logit_bias`` dict, whose row is ``[V]`` float32 (its values, -0.0
    elsewhere), or an ``allowed_token_ids`` list, whose row is ``[V]`` bool (True on its
    tokens); tokens outside ``[0, V)`` are dropped. Entries are keyed by the rule set's
    ``id()`` (the ``n`` choices of a request share their parent's object), ``V`` and the
    device; each entry holds the rule set itself, so its id is not reused while the entry
    lives. Rule sets are taken as immutable once in a request (``SamplingParams`` checks them
    on construction). :meth:`release_unused`, called at the end of each build, drops the rows
    that build did not use, and :meth:`retain` those of the requests no longer in the batch
    when it changes (also when no build follows: a greedy or empty batch): the memory of a
    finished request's rules (``4 V`` bytes per distinct bias dict, ``V`` per allowed list) is
    released when the batch composition changes.
    """

    def __init__(self) -> None:
        self._rows: dict[tuple[int, int, torch.device], tuple[_Rule, torch.Tensor]] = {}
        self._used: set[tuple[int, int, torch.device]] = set()
        self.conversions = 0
        """Rule sets converted to a row so far (tests: a shared rule set is converted once)."""

    def row(self, rule: _Rule, vocab_size: int, device: torch.device | str) -> torch.Tensor:
        """The dense ``[V]`` row of ``rule`` on ``device``, converted on first use."""
        key = (id(rule), vocab_size, torch.device(device))
        entry = self._rows.get(key)
        if entry is None:
            tokens, values = _rule_arrays(rule, vocab_size)
            if values is None:
                host = np.zeros(vocab_size, dtype=np.bool_)
                host[tokens] = True
            else:
                host = np.full(vocab_size, -0.0, dtype=np.float32)
                host[tokens] = values
            entry = self._rows[key] = (rule, torch.from_numpy(host).to(device))
            self.conversions += 1
        self._used.add(key)
        return entry[1]

    def release_unused(self) -> None:
        """Drop the rows not asked for since the last call."""
        for key in self._rows.keys() - self._used:
            del self._rows[key]
        self._used.clear()

    def retain(self, rules: Iterable[object]) -> None:
        """Drop the rows of every rule set not in ``rules`` (the rule sets of the batch now
        running; called when the batch changes, also when no build follows: a greedy or empty
        batch builds nothing, and would otherwise hold a finished request's rows)."""
        keep = {id(r) for r in rules if r}
        for key in [k for k in self._rows if k[0] not in keep]:
            del self._rows[key]

    @property
    def num_rows(self) -> int:
        """Rows held now."""
        return len(self._rows)


def _dense_groups(
    items: Sequence[_Rule | None], vocab_size: int, device: torch.device | str, rules: DenseRuleRows
) -> tuple[list[_Rule | None], tuple[tuple[torch.Tensor, torch.Tensor], ...]]:
    """Split per-row rule sets into the small ones (kept in place, the large ones replaced by
    None) and one ``(rows [R_d] int64 on device, dense row [V])`` group per distinct large
    rule set (at least ``vocab_size / DENSE_RULE_DIVISOR`` entries; rows from ``rules``)."""
    small: list[_Rule | None] = list(items)
    groups: dict[int, tuple[_Rule, list[int]]] = {}
    for i, item in enumerate(items):
        if item and len(item) * DENSE_RULE_DIVISOR >= vocab_size:
            groups.setdefault(id(item), (item, []))[1].append(i)
            small[i] = None
    dense = tuple(
        (
            torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True),
            rules.row(item, vocab_size, device),
        )
        for item, rows in groups.values()
    )
    return small, dense


def _rule_arrays(rule: _Rule, vocab_size: int) -> tuple[np.ndarray, np.ndarray | None]:
    """``(tokens int64, values float32 or None)`` of one rule set, tokens outside
    ``[0, vocab_size)`` dropped (values only for a ``logit_bias`` dict)."""
    keys = rule.keys() if isinstance(rule, Mapping) else rule
    t = np.fromiter(keys, dtype=np.int64, count=len(rule))
    inside = (t >= 0) & (t < vocab_size)
    v = None
    if isinstance(rule, Mapping):
        v = np.fromiter(rule.values(), dtype=np.float32, count=len(rule))[inside]
    return t[inside], v


def _suppressed_entries(
    params: Sequence[SamplingParams],
    num_out: np.ndarray,
    output_token_ids: Sequence[Sequence[int]],
    eos_token_ids: Sequence[Iterable[int]],
    vocab_size: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(rows int64, tokens int64)`` of the tokens each row may not sample this step (sorted
    per row, inside the vocabulary), or None when there are none: before ``min_tokens``, the
    ``stop_token_ids`` and the EOS tokens (under ``ignore_eos`` too: vLLM 0.26 bans its
    ``all_stop_token_ids``, which always hold the EOS ids); and the last tokens of the bad words
    the output is about to complete.

    The ``min_tokens`` ban of each distinct stop list and EOS set is converted once per build
    (a request's ``n`` choices share their parent's list) and laid out by NumPy: as per-row
    Python sets, ``n: 128`` choices sharing 150,000 ``stop_token_ids`` took 1-3 s of the engine
    loop per step until ``min_tokens``, every other request waiting.
    """
    bans: dict[tuple[int, frozenset[int]], np.ndarray] = {}
    rows: list[np.ndarray] = []  # rows before min_tokens (their bad words merged in)
    tokens: list[np.ndarray] = []
    word_rows: list[int] = []  # rows with bad words only: a few tokens, kept as Python ints
    word_tokens: list[int] = []
    for i, p in enumerate(params):
        words = (
            banned_bad_word_tokens(p.bad_words_token_ids, output_token_ids[i])
            if p.bad_words_token_ids
            else []
        )
        if num_out[i] >= p.min_tokens:
            for t in sorted(set(words)):
                if 0 <= t < vocab_size:
                    word_rows.append(i)
                    word_tokens.append(t)
            continue
        eos = frozenset(eos_token_ids[i])
        key = (id(p.stop_token_ids), eos)
        banned = bans.get(key)
        if banned is None:
            stops = np.fromiter(p.stop_token_ids, dtype=np.int64, count=len(p.stop_token_ids))
            ids = np.union1d(stops, np.fromiter(eos, dtype=np.int64, count=len(eos)))
            banned = bans[key] = ids[(ids >= 0) & (ids < vocab_size)]
        if words:
            extra = np.array(words, dtype=np.int64)
            banned = np.union1d(banned, extra[(extra >= 0) & (extra < vocab_size)])
        if len(banned):
            rows.append(np.full(len(banned), i, dtype=np.int64))
            tokens.append(banned)
    if word_rows:
        rows.append(np.array(word_rows, dtype=np.int64))
        tokens.append(np.array(word_tokens, dtype=np.int64))
    if not rows:
        return None
    if len(rows) == 1:
        return rows[0], tokens[0]
    return np.concatenate(rows), np.concatenate(tokens)


def _row_entries(
    items: Sequence[Mapping[int, float] | Sequence[int] | None], vocab_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """``(rows int64, tokens int64, values float32 or None)`` of per-row token sets inside the
    vocabulary, or None when there are none.

    Args:
        items: per batch row, a ``{token: value}`` dict (``logit_bias``: values returned), a
            token list (``allowed_token_ids``: values None), or None / empty for no entries.
        vocab_size: tokens outside ``[0, vocab_size)`` are dropped.

    Each distinct dict or list is converted once (a request's ``n`` choices share their
    parent's) and its rows are laid out by NumPy: as Python tuples, ``n: 128`` choices with a
    bias on each of Qwen3's 151,936 tokens took 9 s of the engine loop (``allowed_token_ids``
    of them all 6 s) while every other request waited. Such large rule sets now take
    :class:`DenseRuleRows` instead (19 M entries here were 0.1 s to build and 0.2-0.4 s to
    add every step); this layout is for the small ones.
    """
    arrays: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
    rows: list[np.ndarray] = []
    tokens: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for i, item in enumerate(items):
        if not item:
            continue
        pair = arrays.get(id(item))
        if pair is None:
            pair = arrays[id(item)] = _rule_arrays(item, vocab_size)
        rows.append(np.full(len(pair[0]), i, dtype=np.int64))
        tokens.append(pair[0])
        if pair[1] is not None:
            values.append(pair[1])
    if not rows or not sum(len(r) for r in rows):
        return None
    return np.concatenate(rows), np.concatenate(tokens), np.concatenate(values) if values else None


def banned_bad_word_tokens(
    bad_words_token_ids: Sequence[Sequence[int]], output_token_ids: Sequence[int]
) -> list[int]:
    """Tokens a row must not sample next because of its bad words (vLLM's rule): the last token of
    each bad word whose other tokens end the output so far (a one-token word is always banned).

    A word is compared with the output's end only when its next-to-last token is the output's
    last one, so a step costs one token comparison per word for most words (256 words of 700
    tokens against an output as long took 78 ms per step for ``n: 128`` when every word's slices
    were copied and compared, and every other request of the batch waited for it; 1.7 ms now).
    """
    out: list[int] = []
    n = len(output_token_ids)
    last = output_token_ids[-1] if n else None
    for word in bad_words_token_ids:
        k = len(word) - 1
        if k == 0 or (k <= n and word[k - 1] == last and list(output_token_ids[n - k :]) == list(word[:k])):
            out.append(word[-1])
    return out


def penalty_tensors_from_ids(
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    vocab_size: int,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output_token_counts [B, V] float32, prompt_mask [B, V] bool)`` from token id lists,
    by a scatter over padded ``[B, L]`` id tensors (padding id ``V`` lands in a dropped column)."""
    out_ids = torch.from_numpy(_pad(output_token_ids, vocab_size)).to(device)
    prompt_ids = torch.from_numpy(_pad(prompt_token_ids, vocab_size)).to(device)
    b = out_ids.shape[0]
    counts = torch.zeros(b, vocab_size + 1, dtype=torch.float32, device=device)
    counts.scatter_add_(1, out_ids, torch.ones_like(out_ids, dtype=torch.float32))
    mask = torch.zeros(b, vocab_size + 1, dtype=torch.bool, device=device)
    mask.scatter_(1, prompt_ids, True)
    return counts[:, :vocab_size], mask[:, :vocab_size]


def _pad(rows: Sequence[Sequence[int]], pad: int) -> np.ndarray:
    width = max(1, max((len(r) for r in rows), default=0))
    out = np.full((len(rows), width), pad, dtype=np.int64)
    for i, r in enumerate(rows):
        if len(r):
            out[i, : len(r)] = r
    return out


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche mix of int64 values in ``[0, 2^32)``; constants below 2^31 keep
    every product inside int64."""
    x = x ^ (x >> 16)
    x = (x * 0x5BD1E995) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x27D4EB2D) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 13)


def seeded_exponential(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[B, V]`` float32 Exp(1) noise, a pure function of ``(seed, position, vocab index)``.

    Args:
        seeds: ``[B]`` int64 (any value, 64 bits are used).
        positions: ``[B]`` int64 output positions.
        vocab_size: ``V``.
    """
    lo = seeds & _M32
    hi = (seeds >> 32) & _M32
    row = _mix32(lo ^ _mix32(hi ^ 0x1E3779B9))
    row = _mix32(row ^ _mix32((positions & _M32) ^ 0x7F4A7C15))
    col = _mix32(torch.arange(vocab_size, device=seeds.device, dtype=torch.int64) ^ 0x2545F491)
    h = _mix32(row[:, None] ^ col[None, :])
    u = ((h >> 8).float() + 0.5) * (1.0 / (1 << 24))  # uniform in (0, 1)
    return -torch.log(u)


def apply_penalties(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Apply repetition, then frequency and presence penalties to ``logits [B, V]`` (float32);
    returns a new tensor.

    Repetition (Keskar et al., 2019, CTRL; as HF and vLLM): on tokens of the prompt or the
    output, positive logits are divided by the penalty and negative ones multiplied.
    Frequency / presence (OpenAI): ``logit -= frequency * count + presence * (count > 0)``
    over generated tokens.
    """
    assert md.output_token_counts is not None and md.prompt_mask is not None
    assert md.repetition_penalties is not None
    assert md.frequency_penalties is not None and md.presence_penalties is not None
    counts = md.output_token_counts.to(logits.dtype)
    seen = md.prompt_mask | (counts > 0)
    rep = md.repetition_penalties[:, None]
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalized, logits)
    logits -= md.frequency_penalties[:, None] * counts
    logits -= md.presence_penalties[:, None] * (counts > 0).to(logits.dtype)
    return logits


def apply_logit_bias(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """``logits [B, V]`` (float32) plus the batch's ``logit_bias``: a new tensor, or ``logits``
    itself when no row has a bias. The dense rows (large dicts) and the sparse entries (small
    ones) cover different rows, so their order does not matter."""
    if md.logit_bias_dense is not None:
        logits = add_dense_rows(logits, md.logit_bias_dense)
    if md.logit_bias_rows is not None:
        assert md.logit_bias_tokens is not None and md.logit_bias_values is not None
        logits = logits.index_put(
            (md.logit_bias_rows, md.logit_bias_tokens), md.logit_bias_values, accumulate=True
        )
    return logits


def add_dense_rows(logits: torch.Tensor, groups: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """``logits [B, V]`` (float32, not modified) plus, for each ``(rows [R_d] int64, row [V]
    float32)`` of ``groups``, ``row`` on each of ``rows`` (rows distinct within and across
    groups); returns a new tensor. The row is broadcast (``expand``), not copied per batch row:
    one ``index_add_`` per group."""
    out: torch.Tensor | None = None
    for rows, row in groups:
        source = row.expand(rows.shape[0], row.shape[0])
        out = logits.index_add(0, rows, source) if out is None else out.index_add_(0, rows, source)
    return logits.clone() if out is None else out


def _unless_empty(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``after`` (``[B, V]`` logits with more tokens masked to -inf), except the rows it leaves
    with no finite logit, which keep ``before``'s (no host sync: one reduction and a select)."""
    empty = torch.isneginf(after).all(dim=-1, keepdim=True)
    return torch.where(empty, before, after)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose probability is below ``min_p * max probability`` (Nguyen et al., 2024)."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p[:, None]
    return logits.masked_fill(probs < threshold, float("-inf"))


class Sampler(nn.Module):
    """Turns ``logits [B, V]`` into one token id per row.

    Order: ``allowed_token_ids`` mask, ``logit_bias``, penalties, ``min_tokens`` and bad-word
    suppression (all rows), greedy argmax for greedy
    rows; for sampling rows temperature, min-p, top-k, top-p (vLLM's order: top-p over the
    tokens min-p kept), then the exponential race.

    Args:
        seed: seed of the generator used by rows without their own seed.
        device: where sampling runs.
    """

    def __init__(self, seed: int = 0, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def forward(self, logits: torch.Tensor, md: SamplingMetadata, constrained: bool = False) -> torch.Tensor:
        """Sample. ``logits`` are ``[B, V]`` (any float dtype, not modified); returns ``[B]`` int64.
        ``constrained``: a grammar mask was applied to ``logits`` (then a rule that would leave a
        row no token gives way, see below; without a grammar or ``allowed_token_ids`` no row can
        lose every token, so nothing is checked).

        On CUDA, a batch with ``md.window_sample`` (the common case: temperature with top-k,
        optionally top-p and min-p, no seeds) takes :func:`sample_top_k_window`, which draws
        from the same distribution with fewer kernels and no ``[B, V]`` softmax or noise
        (its random stream differs from the full-row race's).
        """
        window = md.top_k_window if md.window_sample and logits.is_cuda else None
        rules = (
            md.allowed_mask is not None
            or md.logit_bias_rows is not None
            or md.logit_bias_dense is not None
            or md.repetition_penalties is not None
            or md.suppress_rows is not None
        )
        if window is None or rules:
            logits = logits.float()
        # A rule that would leave a row no token at all gives way (the grammar, applied before
        # the sampler, over allowed_token_ids; both over min_tokens' and bad_words' bans): an
        # all -inf row would sample NaN into token 0, whatever the constraints allowed.
        if md.allowed_mask is not None:
            allowed = logits.masked_fill(~md.allowed_mask, float("-inf"))
            logits = _unless_empty(logits, allowed) if constrained else allowed
        logits = apply_logit_bias(logits, md)
        if md.repetition_penalties is not None:
            logits = apply_penalties(logits, md)
        if md.suppress_rows is not None:
            # the -inf made on the device: torch.tensor(..., device=cuda) is a blocking copy from
            # the host, which would wait for this step's forward on every step that bans tokens
            suppressed = logits.index_put(
                (md.suppress_rows, md.suppress_tokens), logits.new_full((), float("-inf"))
            )
            restricted = constrained or md.allowed_mask is not None
            logits = _unless_empty(logits, suppressed) if restricted else suppressed
        greedy_tokens = None if md.all_random else logits.argmax(dim=-1)
        if md.all_greedy:
            assert greedy_tokens is not None
            return greedy_tokens
        if window is not None:
            assert md.top_k is not None
            sampled = sample_top_k_window(
                logits, md.temperature, md.top_k, md.top_p, md.min_p, window, self.generator, GREEDY_EPS
            )
            if greedy_tokens is None:
                return sampled
            return torch.where(md.temperature < GREEDY_EPS, greedy_tokens, sampled)
        is_greedy = md.temperature < GREEDY_EPS
        temperature = torch.where(is_greedy, 1.0, md.temperature)
        logits = logits / temperature[:, None]
        # min-p before top-k/top-p, as vLLM: top-p's mass is then counted over the tokens min-p
        # kept (min-p's cut, relative to the most likely token, is the same either side of top-k)
        if md.min_p is not None:
            logits = apply_min_p(logits, md.min_p)
        if md.top_k is not None and md.top_k_window is not None:
            logits = apply_top_k_top_p_window(logits, md.top_k, md.top_p, md.top_k_window)
        elif md.top_k is not None or md.top_p is not None:
            logits = apply_top_k_top_p(logits, md.top_k, md.top_p)
        probs = logits.softmax(dim=-1)
        if md.seeds is None:
            noise = torch.empty_like(probs).exponential_(generator=self.generator)
        else:
            assert md.seeded is not None and md.output_positions is not None
            noise = seeded_exponential(md.seeds, md.output_positions, probs.shape[1])
            if not md.all_seeded:
                unseeded = torch.empty_like(probs).exponential_(generator=self.generator)
                noise = torch.where(md.seeded[:, None], noise, unseeded)
        sampled = (probs / noise.clamp_min_(1e-10)).argmax(dim=-1)
        if greedy_tokens is None:
            return sampled
        return torch.where(is_greedy, greedy_tokens, sampled)
