"""Top-k / top-p: the topk-window path against the full-sort path and the scatter-based path
the sampler used before (kept here as the reference), hand-built edge cases, seeded outputs."""

from __future__ import annotations

import pytest
import torch

import surge.layers.sampler as sampler_mod
from surge.layers.sampler import Sampler, SamplingMetadata
from surge.layers.top_k_top_p import (
    TOP_K_WINDOW_MAX,
    apply_top_k_top_p,
    apply_top_k_top_p_window,
    top_k_window,
)
from surge.sampling_params import SamplingParams

NEG = float("-inf")


def _reference(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """The sampler's previous implementation: full sort, masks in sorted order, scatter back."""
    v = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    if top_k is not None:
        k = torch.where(top_k <= 0, v, top_k).clamp(1, v)
        kth = sorted_logits.gather(1, (k - 1)[:, None])
        sorted_logits.masked_fill_(sorted_logits < kth, NEG)
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs
        sorted_logits.masked_fill_((before >= top_p[:, None]) & (top_p[:, None] < 1.0), NEG)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _kept(x: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(x)


def _all_paths(logits, top_k, top_p, window=None):
    """Kept masks of the window path, the sort path and the previous implementation; checks
    the surviving logits are untouched."""
    if window is None:
        window = int(top_k.max())
    fast = apply_top_k_top_p_window(logits, top_k, top_p, window)
    full = apply_top_k_top_p(logits, top_k, top_p)
    ref = _reference(logits.clone(), top_k, top_p)
    for out in (fast, full):
        assert torch.equal(out[_kept(out)], logits[_kept(out)])
    return _kept(fast), _kept(full), _kept(ref)


def test_ties_at_the_kth_value_are_kept_whole() -> None:
    logits = torch.tensor([[5.0, 3.0, 3.0, 3.0, 1.0, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]])
    top_k = torch.tensor([2, 3])
    fast, full, ref = _all_paths(logits, top_k, None)
    assert fast.tolist() == [[True, True, True, True, False, False], [True] * 6]
    assert torch.equal(fast, full) and torch.equal(fast, ref)
    # With top-p on, the ties beyond the window (here W=2: only one of the three 3.0s is
    # inside) still count in the renormalised mass: exp(5)/(exp(5)+3exp(3)) = 0.711.
    fast, full, ref = _all_paths(logits[:1], top_k[:1], torch.tensor([0.70]))
    assert fast[0].tolist() == [True] + [False] * 5
    assert torch.equal(fast, full) and torch.equal(fast, ref)
    # A top-p cut inside a tie is by value (all three 3.0s stay); the previous scatter-based
    # code kept the first of them in sort order only.
    fast, full, ref = _all_paths(logits[:1], top_k[:1], torch.tensor([0.72]))
    assert fast[0].tolist() == [True] * 4 + [False] * 2
    assert torch.equal(fast, full)
    assert ref[0].sum() == 2 and (fast | ref).equal(fast)


def test_top_k_one_is_the_argmax_and_k_of_the_vocabulary_keeps_all() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 300, generator=g) * 4
    one, full, ref = _all_paths(logits, torch.ones(4, dtype=torch.long), None)
    assert torch.equal(one, full) and torch.equal(one, ref)
    assert one.sum(-1).tolist() == [1] * 4
    assert one.float().argmax(-1).tolist() == logits.argmax(-1).tolist()
    for k in (299, 300, 400):
        kk = torch.full((4,), k)
        fast, full, ref = _all_paths(logits, kk, None, window=min(k, 300))
        assert torch.equal(fast, full) and torch.equal(fast, ref)
        assert fast.sum(-1).tolist() == [min(k, 300)] * 4


def test_top_p_edges() -> None:
    probs = torch.tensor([[0.4, 0.3, 0.15, 0.1, 0.05]])
    logits = probs.log()
    top_k = torch.tensor([5])
    # p -> 0+: only the most likely token; p = 1: everything the top-k keeps.
    cases = {1e-7: [True, False, False, False, False], 1.0: [True] * 5}
    # 0.4 < 0.6, 0.7 >= 0.6: two tokens; 0.85 < 0.9 <= 0.95: four.
    cases |= {0.6: [True, True, False, False, False], 0.9: [True, True, True, True, False]}
    for p, expect in cases.items():
        fast, full, ref = _all_paths(logits, top_k, torch.tensor([p]))
        assert fast[0].tolist() == expect, p
        assert torch.equal(fast, full) and torch.equal(fast, ref), p
    # top_p over the renormalised top-k distribution: top-3 masses 0.47, 0.35, 0.18, so the
    # mass before the third is 0.82 > 0.8 (it would be 0.7 without renormalising).
    fast, full, ref = _all_paths(logits, torch.tensor([3]), torch.tensor([0.8]))
    assert fast[0].tolist() == [True, True, False, False, False]
    assert torch.equal(fast, full) and torch.equal(fast, ref)


def test_mixed_rows_and_random_batches_match_the_sort_path() -> None:
    g = torch.Generator().manual_seed(3)
    v = 5000
    logits = torch.randn(32, v, generator=g) * 3
    logits[5, 100:] = NEG  # a row with few finite logits
    logits[6] = torch.round(logits[6])  # many ties
    logits[7] = torch.round(logits[7] * 4) / 4
    top_k = torch.randint(1, 64, (32,), generator=g)
    top_k[::5] = 0  # rows without top-k (and without top-p: they must keep everything)
    top_p = torch.rand(32, generator=g) * 0.9 + 0.05
    top_p[top_k == 0] = 1.0
    top_p[1] = 1.0
    for p in (None, top_p):
        fast, full, ref = _all_paths(logits, top_k, p)
        assert torch.equal(fast, full)
        assert torch.equal(fast[top_k == 0], torch.isfinite(logits[top_k == 0]))
        # The previous code agrees except (a) where a top-p cut falls inside a tie (rows 6, 7):
        # it kept only part of the tie; (b) rows with top_p = 1 and no top-k when the float32
        # cumulative sum over the whole row rounded above 1: it cut tail tokens. It never kept more.
        same = torch.ones(32, dtype=torch.bool)
        same[6:8] = False
        if p is not None:
            same &= top_k > 0
        assert torch.equal(fast[same], ref[same])
        assert torch.equal(fast | ref, fast)
    # A wider window than the batch needs changes nothing.
    wide = apply_top_k_top_p_window(logits, top_k, top_p, 512)
    assert torch.equal(wide, apply_top_k_top_p_window(logits, top_k, top_p, int(top_k.max())))


def test_window_choice_on_the_host() -> None:
    assert top_k_window([20, 20, 5], 151936) == 20
    assert top_k_window([20, 0], 151936) is None  # a top-p row without top-k: sort
    assert top_k_window([20, TOP_K_WINDOW_MAX + 1], 151936) is None
    assert top_k_window([], 151936) is None
    assert top_k_window([900], 100) == 100
    v = 50
    md = SamplingMetadata.build(
        [
            SamplingParams(temperature=0.6, top_k=20, top_p=0.95),
            SamplingParams(temperature=0.0, top_p=0.5),  # greedy: does not count
            SamplingParams(temperature=1.0),  # no truncation: does not count
            SamplingParams(temperature=0.7, top_k=7),
        ],
        [[]] * 4,
        [[]] * 4,
        [()] * 4,
        v,
        "cpu",
    )
    assert md.top_k_window == 20
    md = SamplingMetadata.build(
        [SamplingParams(top_k=20), SamplingParams(top_p=0.9)], [[]] * 2, [[]] * 2, [()] * 2, v, "cpu"
    )
    assert md.top_k_window is None
    md = SamplingMetadata.build([SamplingParams(top_p=0.9)], [[]], [[]], [()], v, "cpu")
    assert md.top_k is None and md.top_k_window is None


@pytest.mark.parametrize("seeded", [False, True])
def test_sampled_tokens_identical_to_the_previous_sampler(
    seeded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    v = 2000
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(48, v, generator=g) * 2.5
    params = []
    for i in range(48):
        seed = 1000 + i if seeded and i % 2 else None
        if i % 6 == 5:
            params.append(SamplingParams(temperature=0.0))
        elif i % 6 == 4:
            params.append(SamplingParams(temperature=0.8, seed=seed))  # no truncation
        else:
            params.append(SamplingParams(temperature=0.6, top_k=(20, 1, 50, 3)[i % 4], top_p=0.95, seed=seed))

    def md() -> SamplingMetadata:
        return SamplingMetadata.build(params, [[]] * 48, [[1, 2]] * 48, [()] * 48, v, "cpu")

    assert md().top_k_window == 50
    sampler = Sampler(seed=11)
    steps_new = [sampler(logits, md()) for _ in range(5)]
    monkeypatch.setattr(sampler_mod, "apply_top_k_top_p", _reference)
    old_md = md()
    old_md.top_k_window = None
    sampler = Sampler(seed=11)
    steps_old = [sampler(logits, old_md) for _ in range(5)]
    for a, b in zip(steps_new, steps_old, strict=True):
        assert torch.equal(a, b)
    assert len({tuple(s.tolist()) for s in steps_new}) > 1  # the steps did sample


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_window_path_matches_on_cuda() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(64, 151936, device="cuda", generator=g) * 3
    logits[3] = torch.round(logits[3])
    top_k = torch.full((64,), 20, device="cuda")
    top_k[::7] = 0
    top_p = torch.full((64,), 0.95, device="cuda")
    top_p[top_k == 0] = 1.0
    fast, full, ref = _all_paths(logits, top_k, top_p, window=20)
    assert torch.equal(fast, full)
    # The previous implementation (the sort-and-scatter `_reference`) differs by design on two
    # kinds of rows: a top-p cut inside a group of tied logits (row 3; the cut is now by value,
    # so a tie is kept whole) and rows with top_p = 1, where its float32 running total over
    # 151,936 probabilities can round above 1 and cut the tail (this test failed on the H200
    # when it compared those rows too).
    rows = (top_k > 0).cpu()
    rows[3] = False
    assert torch.equal(fast[rows], ref[rows])


@pytest.mark.parametrize("top_k", [None, 4], ids=["full sort", "top-k window"])
def test_top_p_cuts_a_token_whose_preceding_mass_reaches_p(top_k: int | None) -> None:
    """vLLM and Hugging Face mask the tokens whose ascending cumulative probability is at most
    ``1 - p``: the nucleus is the shortest prefix whose mass reaches ``p``, so a token with
    exactly ``p`` before it is cut. Probabilities 0.5, 0.25, 0.125, 0.125 (exact in float32)
    at top-p 0.75 keep two tokens; keeping the third (and its tie) made it four."""
    logits = torch.tensor([[0.5, 0.25, 0.125, 0.125]]).log()
    top_p = torch.tensor([0.75])
    if top_k is None:
        out = apply_top_k_top_p(logits, None, top_p)
    else:
        out = apply_top_k_top_p_window(logits, torch.tensor([top_k]), top_p, top_k)
    assert _kept(out).tolist() == [[True, True, False, False]]
