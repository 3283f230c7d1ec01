"""The two-launch top-k kernel (:mod:`surge.kernels.topk`) against ``torch.topk``.

Values must equal ``torch.topk``'s exactly (same multiset, descending); ids must point at those
values, be distinct, and prefer the smaller id among equal logits. Small shapes under the CPU
interpreter (with a small ``chunk`` so that the merge of several chunks runs, and other
``(chunk, group)`` pairs scaled down); the sampler's real shape (Qwen3's 151,936-token
vocabulary, 1 and 64 rows) on a GPU, with the default pair and the pairs the benchmark sweeps.
"""

from __future__ import annotations

import pytest
import torch

from surge.kernels.topk import topk_rows, topk_supported

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _check(logits: torch.Tensor, k: int, chunk: int | None = None, group: int | None = None) -> None:
    vals, ids = topk_rows(logits.to(DEVICE), k, chunk=chunk, group=group)
    vals, ids, logits = vals.cpu(), ids.cpu(), logits.cpu()
    ref = torch.topk(logits.float(), k, dim=-1).values
    assert torch.equal(vals, ref)
    assert torch.equal(logits.float().gather(1, ids), vals)
    first = torch.sort(logits.float(), dim=-1, descending=True, stable=True).indices[:, :k]
    assert torch.equal(ids, first)  # the keys order (value, -id) totally: the ids are exact too
    for row_ids, row_vals in zip(ids.tolist(), vals.tolist(), strict=True):
        assert len(set(row_ids)) == k
        for j in range(k - 1):  # among equal values, the smaller id first
            if row_vals[j] == row_vals[j + 1]:
                assert row_ids[j] < row_ids[j + 1]


@pytest.mark.parametrize(
    ("rows", "vocab", "k", "chunk"),
    [
        (3, 1000, 32, 512),
        (2, 777, 64, 1024),
        (1, 50, 16, 256),
        (2, 300, 8, 256),
        (1, 32, 32, 512),
        (2, 5000, 8, 128),  # 40 chunks: the second launch filters its candidates too
        (1, 20000, 16, 256),
        (2, 300, 2, 64),
        (1, 100, 4, 64),
    ],
)
def test_values_equal_torch_topk(rows: int, vocab: int, k: int, chunk: int) -> None:
    gen = torch.Generator().manual_seed(vocab + k)
    logits = torch.randn(rows, vocab, generator=gen) * 4
    _check(logits, k, chunk)


def test_ties_negative_values_and_masked_rows() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 600, generator=gen)
    logits[0, [5, 7, 300, 599]] = 10.0  # a four-way tie at the top, across chunks
    logits[1] = -torch.rand(600, generator=gen) - 1.0  # only negative logits
    logits[2, :] = float("-inf")
    logits[2, [3, 400]] = 0.0  # fewer finite logits than k: the rest are -inf, ids still distinct
    logits[3] = torch.randint(-3, 3, (600,), generator=gen).float()  # heavy ties everywhere
    _check(logits, 16, 256)
    ties = torch.randint(-3, 3, (2, 5000), generator=gen).float()  # ties through the second launch
    ties[1, ::7] = 3.0
    _check(ties, 8, 128)
    assert topk_rows(logits.to(DEVICE), 16, chunk=256)[1][0, :4].tolist() == [5, 7, 300, 599]


def test_signed_zeros_tie_and_nan_rows_give_real_ids() -> None:
    zeros = torch.tensor([[-0.0, 0.0, -0.0, 0.0] + [-1.0] * 60])
    vals, ids = topk_rows(zeros.to(DEVICE), 2, chunk=64)
    assert ids.cpu().tolist() == [[0, 1]] and torch.equal(vals.cpu(), torch.zeros(1, 2))
    nan = torch.randn(3, 600, generator=torch.Generator().manual_seed(3))
    nan[0] = float("nan")  # a whole row of NaN: every id is still a position of the row
    nan[1, [10, 20]] = float("nan")
    nan[2, 500] = -float("nan")
    vals, ids = topk_rows(nan.to(DEVICE), 8, chunk=128)
    ids = ids.cpu()
    assert bool(((ids >= 0) & (ids < 600)).all())
    assert all(len(set(r)) == 8 for r in ids.tolist())
    assert ids[1, :2].tolist() == [10, 20]  # a positive NaN sorts as the largest value
    if DEVICE == "cpu":
        # the interpreter keeps a NaN's sign: a negative one sorts as the smallest; on the H200
        # (session 38) it sorted as a positive one, so only the ids' validity holds there
        assert 500 not in ids[2].tolist()
        assert torch.equal(vals.cpu()[2], torch.topk(nan[2][~nan[2].isnan()], 8).values)


def test_bf16_logits_and_a_zero_stride_batch() -> None:
    gen = torch.Generator().manual_seed(2)
    row = (torch.randn(500, generator=gen) * 3).to(torch.bfloat16)
    logits = row.expand(3, 500)  # rows share storage (stride 0), as a test of the sampler does
    _check(logits, 32, 512)


def _first_launch_overflows(logits: torch.Tensor, k: int, chunk: int, group: int) -> int:
    """How many chunks pass more than ``2 k`` candidates through the first launch's filter (its
    exact top-``k`` branch), in torch the kernel's way (no NaN; ``V >= chunk``: no capping)."""
    b, v = logits.shape
    n = -(-v // chunk)
    x = torch.full((b, n * chunk), float("-inf"))
    x[:, :v] = logits.float()
    x = x.view(b, n, chunk)
    thr = x.view(b, n, chunk // group, group).amax(-1).topk(k, dim=-1).values[..., -1:]
    real = (torch.arange(n * chunk) < v).view(1, n, chunk)
    return int((((x >= thr) & real).sum(-1) > 2 * k).sum())


@pytest.mark.parametrize(
    ("chunk", "group", "k", "chunks"),
    [
        (64, 8, 8, 3),  # chunk // group == k: every group maximum is in the bound
        (128, 16, 8, 3),
        (256, 16, 8, 3),
        (256, 32, 8, 3),
        (512, 16, 8, 2),
        (512, 64, 8, 2),  # the second launch's block holds fewer than k groups: no filter there
        (1024, 32, 16, 2),
        (64, 4, 8, 10),  # 10 chunks: the second launch filters with groups of 4
        (64, 32, 2, 3),
        (64, 1, 8, 3),  # groups of one: the bound is the chunk's k-th largest logit itself
    ],
)
def test_chunk_group_pairs_equal_torch_topk(chunk: int, group: int, k: int, chunks: int) -> None:
    """Other ``(chunk, group)`` pairs than the defaults, scaled down: random rows, heavy ties (more
    than ``2 k`` candidates in a chunk), a row masked to ``-inf``, one with fewer finite logits
    than ``k``, and a tie at the top wider than ``k`` across chunks."""
    vocab = chunks * chunk - 37  # a partial last chunk, not a whole number of groups
    gen = torch.Generator().manual_seed(chunk * 131 + group * 7 + k)
    logits = torch.randn(5, vocab, generator=gen) * 4
    logits[1] = torch.randint(-3, 3, (vocab,), generator=gen).float()
    logits[2] = float("-inf")
    logits[3] = float("-inf")
    logits[3, torch.randperm(vocab, generator=gen)[: k // 2 + 1]] = torch.randn(k // 2 + 1, generator=gen)
    logits[4, torch.randperm(vocab, generator=gen)[: 2 * k + 3]] = 20.0
    assert _first_launch_overflows(logits, k, chunk, group) >= 2 * chunks  # rows 2 and 3 at least
    _check(logits, k, chunk, group)


def test_chunk_group_defaults_and_capping() -> None:
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 300, generator=gen)
    ref = topk_rows(logits.to(DEVICE), 8, chunk=256)
    for chunk, group in [(None, None), (256, None), (None, 16), (4096, 16), (65536, 32)]:  # capped to V
        got = topk_rows(logits.to(DEVICE), 8, chunk=chunk, group=group)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    _check(logits, 8, 65536, 32)


def test_bad_arguments_are_refused() -> None:
    x = torch.zeros(2, 100, device=DEVICE)
    assert not topk_supported(24, 100) and not topk_supported(128, 100) and topk_supported(64, 100)
    assert not topk_supported(1, 100) and topk_supported(2, 100)
    with pytest.raises(ValueError, match="power of two"):
        topk_rows(x, 24)
    with pytest.raises(ValueError, match="power of two"):
        topk_rows(x, 128)
    with pytest.raises(ValueError, match="power of two"):
        topk_rows(x, 1)  # tl.topk needs two
    with pytest.raises(ValueError, match="float32"):
        topk_rows(x.double(), 16)
    with pytest.raises(ValueError, match="chunk must be a power of two"):
        topk_rows(x, 32, chunk=24)
    with pytest.raises(ValueError, match="chunk must be a power of two"):
        topk_rows(x, 2, chunk=0, group=1)
    with pytest.raises(ValueError, match="group must be a power of two"):
        topk_rows(x, 16, group=12)
    with pytest.raises(ValueError, match="group must be a power of two"):
        topk_rows(x, 16, chunk=4096, group=0)
    with pytest.raises(ValueError, match="group must be at most chunk"):
        topk_rows(x, 2, chunk=64, group=128)
    with pytest.raises(ValueError, match="at least k"):
        topk_rows(x, 32, chunk=256, group=16)  # 16 groups for k = 32
    with pytest.raises(ValueError, match="at least k"):
        topk_rows(x, 16, chunk=128)  # the default group: 8 groups
    with pytest.raises(ValueError, match="at least k"):
        topk_rows(x, 64, group=256)  # the default chunk at 2 rows (8192): 32 groups
    with pytest.raises(ValueError, match="at least k"):
        topk_rows(torch.zeros(5, 100, device=DEVICE), 64, group=128)  # the default above 4 rows: 32 groups
    with pytest.raises(TypeError):
        topk_rows(x, 16, 256)  # chunk and group are keyword-only
    with pytest.raises(ValueError, match="contiguous"):
        topk_rows(x.t(), 16)
    assert topk_rows(x[:0], 16)[0].shape == (0, 16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize(
    ("k", "chunk", "group"),
    [
        (k, c, g)
        for k in (32, 64)
        for c, g in [(None, None), (4096, 32), (8192, 16), (8192, 32), (16384, 32), (16384, 64), (2048, 16)]
        if c is None or c // g >= k  # the pairs topk_rows takes for this k (the rest: a ValueError)
    ],
)
def test_qwen3_vocabulary_on_cuda(rows: int, k: int, chunk: int | None, group: int | None) -> None:
    gen = torch.Generator(device="cuda").manual_seed(rows * k)
    logits = torch.randn(rows, 151936, device="cuda", generator=gen) * 3
    logits[0, torch.randperm(151936, device="cuda", generator=gen)[:50]] = logits[0].max()  # ties at the top
    if rows > 1:
        logits[1] = float("-inf")  # a masked row: every chunk takes its exact branch
        logits[2] = torch.randint(-3, 3, (151936,), device="cuda", generator=gen).float()  # heavy ties
    _check(logits, k, chunk, group)
