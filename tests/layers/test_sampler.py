"""Sampler: greedy, top-k, top-p, min-p, penalties, min_tokens, seeds, distribution."""

from __future__ import annotations

import pytest
import torch

from surge.layers.sampler import (
    Sampler,
    SamplingMetadata,
    apply_min_p,
    apply_penalties,
    penalty_tensors_from_ids,
    seeded_exponential,
)
from surge.sampling_params import SamplingParams

V = 50


def _md(params: list[SamplingParams], outputs: list[list[int]] | None = None, prompts=None, eos=None):
    n = len(params)
    return SamplingMetadata.build(
        params,
        prompts or [[]] * n,
        outputs or [[]] * n,
        eos or [()] * n,
        V,
        "cpu",
    )


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax_also_in_a_mixed_batch() -> None:
    logits = _logits(6)
    sampler = Sampler(seed=0)
    greedy = SamplingParams(temperature=0.0)
    assert torch.equal(sampler(logits, _md([greedy] * 6)), logits.argmax(-1))
    mixed = [greedy, SamplingParams(temperature=1.0)] * 3
    out = sampler(logits, _md(mixed))
    assert out.dtype == torch.int64 and out.shape == (6,)
    assert torch.equal(out[0::2], logits[0::2].argmax(-1))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.5, top_k=1),
        SamplingParams(temperature=1.5, top_p=1e-6),
        SamplingParams(temperature=1.5, min_p=1.0),
        SamplingParams(temperature=1.5, top_k=1, seed=3),
    ],
    ids=["top_k=1", "top_p tiny", "min_p=1", "top_k=1 seeded"],
)
def test_degenerate_sampling_is_argmax(params: SamplingParams) -> None:
    logits = _logits(64, seed=1)
    sampler = Sampler(seed=0)
    for _ in range(3):
        assert torch.equal(sampler(logits, _md([params] * 64)), logits.argmax(-1))


def test_top_k_and_top_p_restrict_the_support() -> None:
    logits = torch.log(torch.tensor([[0.05, 0.1, 0.15, 0.3, 0.4] + [1e-9] * (V - 5)]))
    sampler = Sampler(seed=0)
    rows = 2000
    got = sampler(logits.expand(rows, V), _md([SamplingParams(top_k=2)] * rows))
    assert set(got.tolist()) == {3, 4}
    # top_p=0.6: 0.4 alone is not enough, 0.4 + 0.3 is: tokens {4, 3}.
    got = sampler(logits.expand(rows, V), _md([SamplingParams(top_p=0.6)] * rows))
    assert set(got.tolist()) == {3, 4}


def test_min_p_masks_below_the_scaled_maximum() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    masked = apply_min_p(probs.log(), torch.tensor([0.4]))
    assert torch.isinf(masked[0, 2:]).all() and torch.isfinite(masked[0, :2]).all()
    logits = torch.full((1, V), -30.0)
    logits[0, :4] = probs.log()
    rows = 1000
    got = Sampler(seed=1)(logits.expand(rows, V), _md([SamplingParams(min_p=0.4)] * rows))
    assert set(got.tolist()) == {0, 1}


@pytest.mark.parametrize("top_k", [0, 10], ids=["full sort", "top-k window"])
def test_min_p_cuts_before_top_p_as_in_vllm(top_k: int) -> None:
    """vLLM applies min-p before top-k/top-p, so top-p's mass is counted over the tokens min-p
    kept. Probabilities 0.4, 0.3, 0.1, 0.01...: min-p 0.2 keeps three (0.5, 0.375, 0.125
    renormalised) and top-p 0.75 cuts the third; top-p first (0.4 + 0.3 < 0.75 before it) kept
    it, one draw in eight."""
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.1] + [0.2 / (V - 3)] * (V - 3)]))
    rows = 2000
    params = SamplingParams(temperature=1.0, top_k=top_k, top_p=0.75, min_p=0.2)
    got = Sampler(seed=0)(logits.expand(rows, V), _md([params] * rows))
    assert set(got.tolist()) == {0, 1}


def test_penalties_hand_computed() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0, 1.0]])
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    md = SamplingMetadata.build([params], [[0, 4]], [[1, 3, 3]], [()], 6, "cpu")
    got = apply_penalties(logits.clone(), md)
    # repetition on prompt+output {0, 1, 3, 4}: positive / 2, negative * 2;
    # then token 1 (count 1): -0.5 - 0.25; token 3 (count 2): -1.0 - 0.25.
    expected = torch.tensor([[1.0, -2.75, 0.5, 0.25, -4.0, 1.0]])
    torch.testing.assert_close(got, expected)
    # A greedy request with a repetition penalty moves off a repeated argmax.
    logits = torch.tensor([[5.0, 4.0, 0.0, 0.0, 0.0, 0.0]])
    greedy = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    md = SamplingMetadata.build([greedy], [[]], [[0]], [()], 6, "cpu")
    assert Sampler()(logits, md).tolist() == [1]


def test_penalty_tensors_from_ids() -> None:
    counts, mask = penalty_tensors_from_ids([[1, 1, 4], []], [[2, 2, 2, 0], [5]], 6, "cpu")
    assert counts.tolist() == [[1, 0, 3, 0, 0, 0], [0, 0, 0, 0, 0, 1]]
    assert mask.tolist() == [[False, True, False, False, True, False], [False] * 6]


def test_min_tokens_suppresses_eos_and_stop_ids() -> None:
    logits = torch.zeros(3, V)
    logits[:, 2] = 10.0  # EOS
    logits[:, 7] = 9.0  # a stop token id
    logits[:, 9] = 8.0
    params = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=(7,))
    eos = [(2,), (2,), (2,)]
    md = _md([params] * 3, outputs=[[], [1], [1, 1]], eos=eos)
    assert Sampler()(logits, md).tolist() == [9, 9, 2]
    # Under ignore_eos too (vLLM 0.26 bans its all_stop_token_ids, which hold the EOS ids).
    ignore = SamplingParams(temperature=0.0, min_tokens=2, ignore_eos=True)
    assert Sampler()(logits[:1], _md([ignore], eos=eos[:1])).tolist() == [7]
    md = _md([ignore] * 2, outputs=[[1], [1, 1]], eos=eos[:2])
    assert Sampler()(logits[:2], md).tolist() == [7, 2]


def test_a_step_that_bans_tokens_builds_no_tensor_from_host_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch with banned tokens (bad words of one token keep their metadata from step to step)
    samples without ``torch.tensor``: on CUDA that is a blocking copy from the host, which waits
    for the step's forward on every step."""
    logits = torch.zeros(2, V)
    logits[:, 4] = 10.0  # the bad word
    logits[:, 9] = 8.0
    params = SamplingParams(temperature=0.0, bad_words=["x"], bad_words_token_ids=[[4]])
    md = _md([params, SamplingParams(temperature=0.0)])
    assert md.suppress_rows is not None

    def refused(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError(f"torch.tensor{args} in the sampler's step")

    monkeypatch.setattr(torch, "tensor", refused)
    assert Sampler()(logits, md).tolist() == [9, 4]


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    logits = _logits(8, seed=2)
    seeded = [SamplingParams(temperature=1.0, seed=s, top_p=0.95) for s in (11, 12, 13)]
    alone = [
        int(Sampler(seed=5)(logits[i : i + 1], _md([p], outputs=[[0] * 4]))[0]) for i, p in enumerate(seeded)
    ]
    # Same rows at other places in a bigger batch with unseeded rows, another engine seed.
    rows = logits[[3, 0, 4, 1, 5, 2]]
    params = [SamplingParams(temperature=1.0)] * 6
    for dst, src in zip([1, 3, 5], range(3), strict=True):
        params[dst] = seeded[src]
    batched = Sampler(seed=99)(rows, _md(params, outputs=[[0] * 4] * 6))
    assert batched[[1, 3, 5]].tolist() == alone
    # The noise is a pure function of (seed, position, vocab index).
    a = seeded_exponential(torch.tensor([7, 7, 8]), torch.tensor([0, 1, 0]), V)
    b = seeded_exponential(torch.tensor([7]), torch.tensor([0]), V)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], a[1]) and not torch.equal(a[0], a[2])
    assert (a > 0).all() and torch.isfinite(a).all()


@pytest.mark.parametrize("seeded", [False, True])
def test_sampled_frequencies_follow_the_distribution(seeded: bool) -> None:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = torch.full((1, V), float("-inf"))
    logits[0, :4] = probs.log()
    draws = 4000
    if seeded:
        params = [SamplingParams(temperature=1.0, seed=s) for s in range(draws)]
    else:
        params = [SamplingParams(temperature=1.0)] * draws
    got = Sampler(seed=0)(logits.expand(draws, V), _md(params))
    freq = torch.bincount(got, minlength=V)[:4].float() / draws
    assert int(torch.bincount(got, minlength=V)[4:].sum()) == 0
    assert (freq - probs).abs().max() < 0.035, freq.tolist()


def test_temperature_flattens_and_sharpens() -> None:
    logits = torch.full((1, V), float("-inf"))
    logits[0, :2] = torch.tensor([1.0, 0.0])
    draws = 4000
    cold = Sampler(seed=0)(logits.expand(draws, V), _md([SamplingParams(temperature=0.25)] * draws))
    hot = Sampler(seed=0)(logits.expand(draws, V), _md([SamplingParams(temperature=2.0)] * draws))
    # P(token 0) = sigmoid(1 / T): 0.982 at T=0.25, 0.622 at T=2 (the largest accepted), 0.731 at T=1.
    assert abs((cold == 0).float().mean().item() - 0.982) < 0.02
    assert abs((hot == 0).float().mean().item() - 0.622) < 0.035


def test_extreme_and_negative_seeds_are_accepted() -> None:
    logits = _logits(3)
    params = [
        SamplingParams(temperature=1.0, seed=2**63 - 1),
        SamplingParams(temperature=1.0, seed=-3),
        SamplingParams(temperature=1.0, seed=-(2**63)),
    ]
    out = Sampler()(logits, _md(params))
    assert out.shape == (3,) and ((out >= 0) & (out < V)).all()
    # every int64 seed is its own: -1 and 2**63 - 1 (equal modulo 2**63) draw differently
    flat = torch.zeros(1, V)
    draws = [
        Sampler()(flat.expand(64, V), _md([SamplingParams(temperature=1.0, seed=s)] * 64)).tolist()
        for s in (-1, 2**63 - 1, 0, -(2**63))
    ]
    assert draws[0] != draws[1] and draws[2] != draws[3]


def test_window_sample_is_chosen_on_the_host_for_the_common_case() -> None:
    common = SamplingParams(temperature=0.6, top_k=20, top_p=0.95)
    greedy = SamplingParams(temperature=0.0)
    assert _md([common, SamplingParams(temperature=0.7, top_k=5, min_p=0.1), greedy]).window_sample
    assert not _md([greedy, greedy]).window_sample  # nothing samples
    assert not _md([common, SamplingParams(temperature=0.8)]).window_sample  # a row without top-k
    assert not _md([common, SamplingParams(temperature=0.8, top_p=0.9)]).window_sample
    assert not _md([common, SamplingParams(temperature=0.6, top_k=20, seed=1)]).window_sample  # seeded
    assert not _md([SamplingParams(temperature=0.6, top_k=2000)]).window_sample  # k past the window max
    assert _md([common, SamplingParams(temperature=0.6, top_k=20, presence_penalty=0.5)]).window_sample


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_window_sample_on_cuda_follows_the_distribution_and_keeps_greedy_rows_and_rules() -> None:
    """The fused window path of the sampler: chi-square of many draws of one row against the
    exact min-p/top-k/top-p distribution; greedy rows in the batch get the argmax; logit
    rules still apply first."""
    from surge.layers.top_k_top_p import apply_top_k_top_p

    v, draws = 4096, 32768
    g = torch.Generator().manual_seed(4)
    row = (torch.randn(v, generator=g) * 3).to(torch.bfloat16).float()
    params = SamplingParams(temperature=0.6, top_k=20, top_p=0.9, min_p=0.01)
    md = SamplingMetadata.build([params] * draws, [[]] * draws, [[]] * draws, [()] * draws, v, "cuda")
    assert md.window_sample
    got = Sampler(seed=0, device="cuda")(row.cuda().expand(draws, v), md).cpu()
    x = apply_min_p(row[None] / 0.6, torch.tensor([0.01]))
    probs = apply_top_k_top_p(x, torch.tensor([20]), torch.tensor([0.9])).softmax(-1)[0].double()
    counts = torch.bincount(got, minlength=v).double()
    support = probs > 0
    assert counts[~support].sum() == 0
    expected = probs[support] * draws
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    df = int(support.sum()) - 1
    a = 2.0 / (9.0 * df)
    assert stat < df * (1.0 - a + 4.26 * a**0.5) ** 3, (stat, df)  # p ~ 1e-5 (Wilson-Hilferty)

    logits = _logits(8, seed=5)
    bias_tok = int(logits[1].argmin())
    mixed = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=3, logit_bias={bias_tok: 100.0}),
    ] * 4
    md = SamplingMetadata.build(mixed, [[]] * 8, [[]] * 8, [()] * 8, V, "cuda")
    assert md.window_sample
    out = Sampler(seed=0, device="cuda")(logits.cuda(), md).cpu()
    assert torch.equal(out[0::2], logits[0::2].argmax(-1))
    assert (out[1::2] == bias_tok).all()
