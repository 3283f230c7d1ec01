"""Sampler: logit_bias, allowed_token_ids and bad words on hand-built logits, in mixed batches,
with penalties, grammar masks and logprobs; and a batch without them builds none of their
tensors."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest
import torch

from surge.engine.llm_engine import choice_params
from surge.layers import sampler as sampler_module
from surge.layers.sampler import (
    DenseRuleRows,
    Sampler,
    SamplingMetadata,
    apply_logit_bias,
    banned_bad_word_tokens,
)
from surge.request import Request
from surge.sampling_params import SamplingParams
from surge.structured.manager import StaticGrammarBitmask
from surge.worker.sampling_state import StepSampler

V = 50


def _md(params: list[SamplingParams], outputs: list[list[int]] | None = None) -> SamplingMetadata:
    n = len(params)
    return SamplingMetadata.build(params, [[]] * n, outputs or [[]] * n, [()] * n, V, "cpu")


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_unused_rules_build_nothing() -> None:
    plain = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_p=0.9)]
    md = _md(plain)
    assert md.logit_bias_rows is None and md.allowed_mask is None and md.suppress_rows is None
    p = SamplingParams()
    assert not p.has_logit_rules and not p.needs_token_history and not p.needs_previous_token
    assert p.token_ids_in_vocab(V) is None
    step = StepSampler(Sampler(seed=0), V, torch.device("cpu"))
    greedy = [Request(f"g{i}", [1], SamplingParams(temperature=0.0)) for i in range(3)]
    step.sample(_logits(3), greedy)
    assert step.greedy and step.cached is None  # one argmax, no tensors at all


def test_logit_bias_pushes_a_token_to_certainty() -> None:
    logits = _logits(1, seed=1).repeat(200, 1)
    target = int(logits[0].argmin())
    # At temperature 1 over 200 seeds, +100 on the least likely token always wins.
    params = [SamplingParams(temperature=1.0, seed=s, logit_bias={target: 100.0}) for s in range(200)]
    out = Sampler(seed=0)(logits, _md(params))
    assert out.tolist() == [target] * 200
    # Without the bias the same seeds pick it (almost) never.
    plain = [SamplingParams(temperature=1.0, seed=s) for s in range(200)]
    assert (Sampler(seed=0)(logits, _md(plain)) == target).sum() == 0
    assert torch.equal(logits, _logits(1, seed=1).repeat(200, 1)), "the caller's logits are not modified"


def test_logit_bias_greedy_negative_and_rows_independent() -> None:
    logits = _logits(4)
    top2 = logits.topk(2, dim=-1).indices
    params = [
        SamplingParams(temperature=0.0, logit_bias={int(top2[0, 0]): -100.0}),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, seed=5),
        SamplingParams(temperature=0.0, logit_bias={int(top2[3, 1]): 0.5, 7: -3.0}),
    ]
    out = Sampler(seed=0)(logits, _md(params))
    assert out[0] == top2[0, 1] and out[1] == top2[1, 0]
    alone = Sampler(seed=0)(logits[2:3], _md([params[2]]))  # a seeded row ignores its neighbours
    assert out[2] == alone[0]
    biased = logits[3].clone()
    biased[top2[3, 1]] += 0.5
    biased[7] -= 3.0
    assert out[3] == biased.argmax()


def test_logit_bias_before_penalties() -> None:
    """vLLM's order: the bias is added to the raw logit, then the repetition penalty divides a
    positive logit of a token seen in the prompt."""
    logits = torch.zeros(1, V)
    logits[0, 3] = 3.0
    logits[0, 4] = 2.5
    p = SamplingParams(temperature=0.0, logit_bias={4: 2.0}, repetition_penalty=2.0)
    md = SamplingMetadata.build([p], [[4]], [[]], [()], V, "cpu")
    # bias then penalty: token 4 -> (2.5 + 2) / 2 = 2.25 < 3; penalty then bias would give 3.25
    assert Sampler(seed=0)(logits, md).item() == 3
    md = SamplingMetadata.build([p], [[3]], [[]], [()], V, "cpu")
    # token 3 seen: 3 / 2 = 1.5 < 4.5
    assert Sampler(seed=0)(logits, md).item() == 4


def test_allowed_token_ids_over_many_seeds() -> None:
    logits = torch.full((400, V), 5.0)
    allowed = (3, 11, 42)
    logits[:, list(allowed)] = torch.tensor([0.0, 0.5, 1.0])  # far less likely than the rest
    params = [SamplingParams(temperature=1.0, seed=s, allowed_token_ids=allowed) for s in range(300)]
    params += [SamplingParams(temperature=1.0, seed=s) for s in range(100)]
    out = Sampler(seed=0)(logits, _md(params)).numpy()
    limited = out[:300]
    assert set(limited.tolist()) <= set(allowed)
    # frequencies follow the softmax over the allowed set (0.19, 0.31, 0.51)
    expect = torch.softmax(torch.tensor([0.0, 0.5, 1.0]), 0).numpy()
    freq = np.array([(limited == t).mean() for t in allowed])
    assert np.abs(freq - expect).max() < 0.1, freq
    assert not set(out[300:].tolist()) & set(allowed)  # the other rows are free (and avoid them)
    greedy = SamplingParams(temperature=0.0, allowed_token_ids=allowed)
    g = Sampler(seed=0)(_logits(5), _md([greedy] * 5))
    expect_ids = torch.tensor(allowed)[_logits(5)[:, list(allowed)].argmax(-1)]
    assert torch.equal(g, expect_ids)


def test_bad_words_single_and_multi_token() -> None:
    assert banned_bad_word_tokens([(5,), (1, 2, 3)], [9, 1, 2]) == [5, 3]
    assert banned_bad_word_tokens([(1, 2, 3)], [1, 2, 9]) == []
    assert banned_bad_word_tokens([(1, 2, 3)], [2]) == []
    assert banned_bad_word_tokens([(1, 2)], []) == []
    assert banned_bad_word_tokens([(1, 2)], [1]) == [2]
    logits = torch.zeros(4, V)
    logits[:, 5] = 10.0
    logits[:, 3] = 9.0
    p = SamplingParams(temperature=0.0, bad_words_token_ids=((5,), (1, 2, 3)))
    assert p.needs_token_history and p.has_logit_rules
    batch = [p, p, p, SamplingParams(temperature=0.0)]
    out = Sampler(seed=0)(logits, _md(batch, [[1, 2], [2, 1], [], [1, 2]]))
    # row 0: 5 always banned, 3 banned after (1, 2); rows 1, 2: only 5; row 3: no bad words
    assert out[0] not in (3, 5) and out[1] == 3 and out[2] == 3 and out[3] == 5
    single = SamplingParams(temperature=0.0, bad_words_token_ids=((5,),))
    assert single.has_logit_rules and not single.needs_token_history  # static: reused tensors


def test_multi_token_bad_word_follows_the_output_step_by_step() -> None:
    """A request's tensors are rebuilt each step while it has a bad word of several tokens,
    so its ban appears the step its prefix is completed, even with an unchanged batch."""
    step = StepSampler(Sampler(seed=0), V, torch.device("cpu"))
    bad = Request("bad", [1], SamplingParams(temperature=0.0, bad_words_token_ids=((7, 8, 9),)))
    other = Request("other", [1], SamplingParams(temperature=0.0))
    logits = torch.zeros(2, V)
    logits[:, 9] = 5.0
    sampled = []
    for t in (7, 8):
        sampled.append(step.sample(logits, [bad, other]).tolist())
        bad.output_token_ids.append(t)
        other.output_token_ids.append(t)
    sampled.append(step.sample(logits, [bad, other]).tolist())
    assert step.fresh
    assert sampled[:2] == [[9, 9], [9, 9]] and sampled[2][0] != 9 and sampled[2][1] == 9


def test_rules_and_grammar_mask_compose() -> None:
    """A grammar's bitmask and allowed_token_ids / logit_bias both apply: the sample lies in
    the intersection, and the bias picks within it."""
    step = StepSampler(Sampler(seed=0), V, torch.device("cpu"))
    grammar_ok = [2, 3, 4, 5]
    bits = np.zeros((1, (V + 31) // 32), dtype=np.int32)
    for t in grammar_ok:
        bits[0, t // 32] |= 1 << (t % 32)
    params = SamplingParams(temperature=1.0, seed=0, allowed_token_ids=(4, 5, 6), logit_bias={5: 50.0})
    req = Request("r", [1], params)
    logits = torch.zeros(1, V)
    logits[0, 6] = 30.0  # allowed but not by the grammar
    logits[0, 2] = 30.0  # grammar but not allowed
    out = step.sample(logits.clone(), [req], StaticGrammarBitmask(bits, ["r"]))
    assert out.item() == 5


def _bits(ok: list[int]) -> np.ndarray:
    bits = np.zeros((1, (V + 31) // 32), dtype=np.int32)
    for t in ok:
        bits[0, t // 32] |= 1 << (t % 32)
    return bits


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_rule_that_leaves_no_token_gives_way(temperature: float) -> None:
    """Constraints that together allow nothing sampled token 0 (an all -inf row): now the
    grammar wins over allowed_token_ids, both over min_tokens' ban of EOS."""
    step = StepSampler(Sampler(seed=0), V, torch.device("cpu"))
    eos = 2
    # a finished grammar allows only EOS, min_tokens bans it: EOS, not token 0
    done = Request(
        "done", [1], SamplingParams(temperature=temperature, seed=1, min_tokens=8), eos_token_ids={eos}
    )
    out = step.sample(_logits(1), [done], StaticGrammarBitmask(_bits([eos]), ["done"]))
    assert out.item() == eos
    # allowed_token_ids only EOS and min_tokens: EOS
    only = Request(
        "only",
        [1],
        SamplingParams(temperature=temperature, seed=1, allowed_token_ids=(eos,), min_tokens=5),
        eos_token_ids={eos},
    )
    assert step.sample(_logits(1, 1), [only]).item() == eos
    # allowed_token_ids disjoint from the grammar: the grammar's token
    apart = Request("apart", [1], SamplingParams(temperature=temperature, seed=1, allowed_token_ids=(5, 6)))
    out = step.sample(_logits(1, 2), [apart], StaticGrammarBitmask(_bits([7, 9]), ["apart"]))
    assert out.item() in (7, 9)
    # rows that keep a token are untouched in the same batch
    free = Request(
        "free", [1], SamplingParams(temperature=temperature, seed=1, min_tokens=8), eos_token_ids={eos}
    )
    logits = _logits(2, 3)
    logits[:, eos] = 100.0
    both = step.sample(logits, [free, only])
    assert both[0].item() != eos and both[1].item() == eos


def test_logprobs_stay_raw_under_the_rules() -> None:
    """Logprobs are the log-softmax of the raw logits, before logit_bias, allowed_token_ids
    and bad words (vLLM's default); the sampled token is the one the rules chose."""
    step = StepSampler(Sampler(seed=0), V, torch.device("cpu"))
    logits = _logits(2, seed=3)
    low = int(logits[0].argmin())
    rules = SamplingParams(
        temperature=0.0,
        logprobs=2,
        logit_bias={low: 100.0},
        allowed_token_ids=(low, 1, 2),
        bad_words_token_ids=((1,),),
    )
    reqs = [Request("a", [1], rules), Request("b", [1], SamplingParams(temperature=0.0, logprobs=2))]
    sampled, lp = step.sample_with_logprobs(logits.clone(), reqs)
    assert sampled.tolist() == [low, int(logits[1].argmax())]
    assert lp is not None
    _, ids, lps = lp
    raw = torch.log_softmax(logits, dim=-1)
    # ids: (sampled, top-k..., rank); lps: (sampled, top-k...) of the raw distribution
    assert lps[0, 0].item() == pytest.approx(raw[0, low].item(), abs=1e-5)
    assert ids[0, 1:3].tolist() == raw[0].topk(2).indices.tolist() and ids[0, 3].item() == V
    assert torch.allclose(lps[0, 1:], raw[0].topk(2).values, atol=1e-5)
    assert lps[1, 0].item() == pytest.approx(raw[1].max().item(), abs=1e-5)


def test_logprob_token_ids_replace_the_top_k_row_by_row() -> None:
    """vLLM's logprob_token_ids: a row that lists ids gets those ids' raw logprobs in its order
    (padding past its count is cut on the host); rows next to it keep their top-k, a row
    without logprobs stays out; the sampled token's logprob and rank are as ever."""
    from surge.worker.logprobs import StepLogprobs

    step = StepSampler(Sampler(seed=0), V, torch.device("cpu"))
    logits = _logits(4, seed=5)
    listed = (7, 3, 41, 3, 0)
    reqs = [
        Request("top", [1], SamplingParams(temperature=0.0, logprobs=2)),
        Request("listed", [1], SamplingParams(temperature=0.0, logprob_token_ids=listed)),
        Request("none", [1], SamplingParams(temperature=0.0)),
        Request("short", [1], SamplingParams(temperature=0.0, logprobs=1, logprob_token_ids=[9])),
    ]
    sampled, lp = step.sample_with_logprobs(logits.clone(), reqs)
    assert lp is not None
    raw = torch.log_softmax(logits, dim=-1)
    rows, _ids, _lps = lp
    host = StepLogprobs(lp, None).lists([r.request_id for r in reqs])[0]
    assert set(host) == {"top", "listed", "short"}
    for i, name, alternatives in (
        (0, "top", raw[0].topk(2).indices.tolist()),
        (1, "listed", list(listed)),
        (3, "short", [9]),
    ):
        row = host[name]
        token = int(sampled[i])
        assert row.token_ids[0] == [token, *alternatives], name
        want = [raw[i, token].item()] + [raw[i, t].item() for t in alternatives]
        assert row.logprobs[0] == pytest.approx(want, abs=1e-5), name
        assert row.ranks[0] == int((raw[i] > raw[i, token]).sum()) + 1
    # a batch where every asking row lists ids computes no top-k at all
    only = [reqs[1], reqs[3]]
    step2 = StepSampler(Sampler(seed=0), V, torch.device("cpu"))
    _, lp2 = step2.sample_with_logprobs(logits[[1, 3]].clone(), only)
    assert lp2 is not None and lp2[0].k_top == 0
    assert StepLogprobs(lp2, None).lists(["listed", "short"])[0]["listed"].token_ids[0][1:] == list(listed)


def _count_fromiter(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Patches ``np.fromiter`` to record the length of each conversion (the sampler converts
    each distinct rule set with it)."""
    calls: list[int] = []
    real = np.fromiter

    def counting(*args: Any, **kwargs: Any) -> np.ndarray:
        out = real(*args, **kwargs)
        calls.append(len(out))
        return out

    monkeypatch.setattr(np, "fromiter", counting)
    return calls


def test_whole_vocabulary_rules_of_many_choices_are_converted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``n: 128`` choices sharing a ``logit_bias`` on each of Qwen3's 151,936 tokens (a 2 MB
    body), or an ``allowed_token_ids`` of them all, convert the shared rules once per build, not
    once per choice (as Python tuples per choice they took 9 s and 6 s of the engine loop, every
    other stream waiting), into one dense ``[V]`` row for the 128 rows (not 19 M sparse
    entries); the mask rows are that row, repeated."""
    vocab = 151_936
    bias = {t: (t % 7) - 3.0 for t in range(vocab)}
    allowed = tuple(range(0, vocab, 2))
    for rules, conversions in (
        ({"logit_bias": bias}, [vocab, vocab]),
        ({"allowed_token_ids": allowed}, [vocab // 2]),
    ):
        children = choice_params(SamplingParams(n=128, temperature=1.0, seed=3, **rules))
        plain = SamplingParams(temperature=1.0)
        params = [plain, *children, plain]
        n = len(params)
        calls = _count_fromiter(monkeypatch)
        md = SamplingMetadata.build(params, [[1]] * n, [[]] * n, [()] * n, vocab, "cpu")
        assert calls == conversions, (rules.keys(), calls)
        monkeypatch.undo()
        if "logit_bias" in rules:
            assert md.logit_bias_rows is None  # no per-row entries
            assert md.logit_bias_dense is not None and len(md.logit_bias_dense) == 1
            rows, row = md.logit_bias_dense[0]
            assert torch.equal(rows, torch.arange(1, 129))
            assert row.shape == (vocab,) and row.dtype == torch.float32
            assert torch.equal(row, torch.tensor([(t % 7) - 3.0 for t in range(vocab)]))
        else:
            assert md.allowed_mask is not None
            assert md.allowed_mask[0].all() and md.allowed_mask[-1].all()
            expect = torch.arange(vocab) % 2 == 0
            assert torch.equal(md.allowed_mask[1:-1], expect.expand(128, vocab))


def _reference_logit_rules(
    logits: torch.Tensor, items: list[dict[int, float] | tuple[int, ...] | None], vocab: int
) -> torch.Tensor:
    """Per-row loop over the rules: a bias dict's values added to the float32 logits one token
    at a time, or -inf outside an allowed list (tokens outside the vocabulary dropped)."""
    out = logits.clone()
    for i, item in enumerate(items):
        if isinstance(item, dict):
            for t, v in item.items():
                if 0 <= t < vocab:
                    out[i, t] += torch.tensor(v, dtype=torch.float32)
        elif item is not None:
            keep = torch.zeros(vocab, dtype=torch.bool)
            keep[[t for t in item if 0 <= t < vocab]] = True
            out[i] = out[i].masked_fill(~keep, float("-inf"))
    return out


def _int_bits(t: torch.Tensor) -> torch.Tensor:
    """The float32 tensor's bit patterns (so -0.0 differs from 0.0)."""
    return t.view(torch.int32)


@pytest.mark.parametrize("seed", range(6))
def test_dense_and_sparse_rules_give_identical_bits(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random batches mixing small and large (dense) ``logit_bias`` dicts and
    ``allowed_token_ids`` lists, some shared by several rows, with ids outside the vocabulary
    and logits of -0.0, 0.0 and infinities: the biased logits equal, bit for bit, both a per-token
    reference and the all-sparse layout (a divisor of 0: nothing is dense), and
    so do the allowed masks and the sampled tokens."""
    rng = np.random.default_rng(seed)
    vocab = 64
    logits = torch.from_numpy(rng.standard_normal((12, vocab)).astype(np.float32) * 4)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf")])
    logits.view(-1)[torch.from_numpy(rng.choice(logits.numel(), 40, replace=False))] = specials.repeat(10)

    def bias_dict(size: int) -> dict[int, float]:
        toks = rng.choice(vocab + 8, size, replace=False)  # a few beyond the vocabulary
        vals = rng.uniform(-100, 100, size)
        vals[:2] = (0.0, -0.0)
        return {int(t): float(v) for t, v in zip(toks, vals, strict=True)}

    shared_big, shared_small = bias_dict(vocab), bias_dict(3)
    unbiased = next(t for t in range(vocab) if t not in shared_big)
    logits[[0, 4, 9], unbiased] = -0.0  # a dense row's other tokens keep -0.0 as it is
    before = logits.clone()
    big_allowed = tuple(int(t) for t in rng.choice(vocab + 8, vocab // 2, replace=False))
    biases: list[dict[int, float] | None] = [
        shared_big, None, shared_small, bias_dict(40), shared_big, bias_dict(5),
        None, shared_small, bias_dict(vocab // 8), shared_big, bias_dict(vocab // 8 - 1), None,
    ]  # fmt: skip
    allowed: list[tuple[int, ...] | None] = [
        None, big_allowed, None, (1, 2, 70), big_allowed, None,
        tuple(range(0, vocab, 3)), None, None, (5,), None, big_allowed,
    ]  # fmt: skip
    params = []
    for i, (b, a) in enumerate(zip(biases, allowed, strict=True)):
        p = SamplingParams(temperature=1.0, seed=i, logit_bias=b, allowed_token_ids=a)
        # share the very objects, as a request's choices do (construction copies them)
        msgspec.structs.force_setattr(p, "logit_bias", b)
        msgspec.structs.force_setattr(p, "allowed_token_ids", a)
        params.append(p)
    n = len(params)
    dense = SamplingMetadata.build(params, [[]] * n, [[]] * n, [()] * n, vocab, "cpu")
    assert dense.logit_bias_dense is not None and dense.logit_bias_rows is not None  # both layouts
    assert [r.tolist() for r, _ in dense.logit_bias_dense] == [[0, 4, 9], [3], [8]]
    monkeypatch.setattr(sampler_module, "DENSE_RULE_DIVISOR", 0)  # no rule set is large
    sparse = SamplingMetadata.build(params, [[]] * n, [[]] * n, [()] * n, vocab, "cpu")
    monkeypatch.undo()
    assert sparse.logit_bias_dense is None
    biased = apply_logit_bias(logits, dense)
    assert torch.equal(_int_bits(biased), _int_bits(apply_logit_bias(logits, sparse)))
    assert torch.equal(_int_bits(biased), _int_bits(_reference_logit_rules(logits, list(biases), vocab)))
    assert dense.allowed_mask is not None and sparse.allowed_mask is not None
    assert torch.equal(dense.allowed_mask, sparse.allowed_mask)
    masked = _reference_logit_rules(torch.zeros(n, vocab), list(allowed), vocab)
    assert torch.equal(dense.allowed_mask, ~torch.isneginf(masked))
    sane = logits.nan_to_num(posinf=50.0, neginf=-50.0)  # no inf - inf: every row samples
    assert torch.equal(Sampler(seed=0)(sane, dense), Sampler(seed=0)(sane, sparse))
    assert torch.equal(_int_bits(logits), _int_bits(before)), "the caller's logits are not modified"


def test_dense_rows_are_kept_between_builds_while_their_requests_stay() -> None:
    """A seeded batch is rebuilt every step: its large shared rules are converted once, kept
    while the requests sample, and released by the first build without them."""
    vocab = 4_000
    bias = {t: 100.0 for t in range(0, vocab, 2)}
    allowed = tuple(range(vocab // 2))
    children = choice_params(
        SamplingParams(n=4, temperature=1.0, seed=1, logit_bias=bias, allowed_token_ids=allowed)
    )
    reqs = [Request(f"c{i}", [1], p) for i, p in enumerate(children)]
    other = Request("o", [1], SamplingParams(temperature=1.0, seed=9, logit_bias={3: 2.0}))
    step = StepSampler(Sampler(seed=0), vocab, torch.device("cpu"))
    logits = torch.zeros(5, vocab)
    for _ in range(3):
        out = step.sample(logits, [*reqs, other])
        assert step.fresh
        assert all(0 <= t < vocab // 2 and t % 2 == 0 for t in out[:4].tolist())
    assert step.dense_rules.conversions == 2 and step.dense_rules.num_rows == 2  # bias + allowed
    step.sample(logits[:1], [other])  # the choices finished: their rows go
    assert step.dense_rules.num_rows == 0
    # without a cache, each build converts its rules again (once per distinct rule set)
    rules = DenseRuleRows()
    for _ in range(2):
        SamplingMetadata.build(children, [[1]] * 4, [[]] * 4, [()] * 4, vocab, "cpu", dense_rules=rules)
    assert rules.conversions == 2
    SamplingMetadata.build(children, [[1]] * 4, [[]] * 4, [()] * 4, vocab, "cpu")
    assert rules.conversions == 2


def test_dense_rows_go_when_no_build_follows() -> None:
    """A batch that turns greedy (no build) or empty (no step) held the finished requests' rows
    (``4 V`` bytes each, and their dicts) until the next build; now the batch change, or the
    last request's drop, releases them. A dict changed in place between two offline calls is then
    converted again, not served from a stale row."""
    vocab = 4_000
    bias = {t: 100.0 for t in range(0, vocab, 2)}
    biased = Request("b", [1], SamplingParams(temperature=1.0, seed=1, logit_bias=bias))
    greedy = Request("g", [1], SamplingParams(temperature=0.0))
    step = StepSampler(Sampler(seed=0), vocab, torch.device("cpu"))
    logits = torch.zeros(2, vocab)
    step.sample(logits, [biased, greedy])
    assert step.dense_rules.num_rows == 1
    step.sample(logits[:1], [greedy])  # greedy: no build
    assert step.greedy and step.dense_rules.num_rows == 0
    step.sample(logits, [biased, greedy])
    assert step.dense_rules.num_rows == 1
    step.drop(["b", "g"])  # the batch is gone: no step follows
    assert step.dense_rules.num_rows == 0
    bias.update({t: -100.0 for t in range(0, vocab, 2)} | {1: 100.0})  # changed in place
    again = Request("b2", [1], SamplingParams(temperature=1.0, seed=1, logit_bias=bias))
    assert step.sample(logits[:1], [again]).tolist() == [1]


def test_many_stop_token_ids_under_min_tokens_are_converted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``n: 128`` choices sharing 150,000 ``stop_token_ids`` under ``min_tokens`` (a 1 MB body)
    ban them every step until ``min_tokens``: the shared list and EOS set are converted once per
    build, not once per choice (the per-row sets took 1-3 s of the engine loop per step, every
    other stream waiting), and the tensors equal those of one row each, repeated; a row with bad
    words bans their tokens too."""
    vocab = 151_936
    stops = tuple(range(1_000, 151_000))
    children = choice_params(
        SamplingParams(n=128, temperature=1.0, seed=3, min_tokens=5, stop_token_ids=stops)
    )
    eos = frozenset({151_645, 151_643})
    n = len(children)
    calls = _count_fromiter(monkeypatch)
    md = SamplingMetadata.build(children, [[1]] * n, [[7]] * n, [eos] * n, vocab, "cpu")
    assert calls == [len(stops), len(eos)], calls
    monkeypatch.undo()
    banned = sorted({*stops, *eos})
    assert md.suppress_rows is not None and md.suppress_tokens is not None
    assert torch.equal(md.suppress_rows, torch.arange(n).repeat_interleave(len(banned)))
    assert torch.equal(md.suppress_tokens, torch.tensor(banned).repeat(n))
    # past min_tokens nothing is banned; ignore_eos bans EOS too (vLLM); bad words join the ban
    done = SamplingMetadata.build(children[:1], [[1]], [[7] * 5], [eos], vocab, "cpu")
    assert done.suppress_rows is None
    mixed = [
        SamplingParams(min_tokens=2, stop_token_ids=(5, 9), ignore_eos=True),
        SamplingParams(min_tokens=2, stop_token_ids=(5, 9), bad_words_token_ids=((3,), (7, 4), (9,))),
    ]
    md = SamplingMetadata.build(mixed, [[1]] * 2, [[7]] * 2, [eos] * 2, vocab, "cpu")
    assert md.suppress_rows is not None and md.suppress_tokens is not None
    assert md.suppress_rows.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert md.suppress_tokens.tolist() == [5, 9, 151_643, 151_645, 3, 4, 5, 9, 151_643, 151_645]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_rules_on_cuda_match_cpu() -> None:
    """The same rules on the GPU: greedy rows give the CPU's tokens, sampled rows obey them."""
    logits = _logits(64, seed=7)
    low = [int(i) for i in logits.argmin(-1)]
    params = []
    for i in range(64):
        kind = i % 4
        if kind == 0:
            params.append(SamplingParams(temperature=0.0, logit_bias={low[i]: 100.0}))
        elif kind == 1:
            params.append(SamplingParams(temperature=1.0, seed=i, allowed_token_ids=(3, 11, 42)))
        elif kind == 2:
            params.append(SamplingParams(temperature=0.0, bad_words_token_ids=((int(logits[i].argmax()),),)))
        else:
            params.append(SamplingParams(temperature=0.9, seed=i))
    outputs = [[1, 2]] * 64

    def run(device: str) -> list[int]:
        md = SamplingMetadata.build(params, [[]] * 64, outputs, [()] * 64, V, device)
        return Sampler(seed=0, device=device)(logits.to(device), md).tolist()

    cpu, gpu = run("cpu"), run("cuda")
    for i in range(64):
        if i % 4 in (0, 2):
            assert gpu[i] == cpu[i]
        if i % 4 == 0:
            assert gpu[i] == low[i]
        if i % 4 == 1:
            assert gpu[i] in (3, 11, 42)
        if i % 4 == 2:
            assert gpu[i] != int(logits[i].argmax())
