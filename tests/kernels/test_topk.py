"""The two-launch top-k kernel (:mod:`surge.kernels.topk`) against ``torch.topk``.

Values must equal ``torch.topk``'s exactly (same multiset, descending); ids must point at those
values, be distinct, and prefer the smaller id among equal logits. Small shapes under the CPU
interpreter (with a small ``chunk`` so that the merge of several chunks runs); the sampler's
real shape (Qwen3's 151,936-token vocabulary, 1 and 64 rows) on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from surge.kernels.topk import topk_rows, topk_supported

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _check(logits: torch.Tensor, k: int, chunk: int | None = None) -> None:
    vals, ids = topk_rows(logits.to(DEVICE), k) if chunk is None else topk_rows(logits.to(DEVICE), k, chunk)
    vals, ids, logits = vals.cpu(), ids.cpu(), logits.cpu()
    ref = torch.topk(logits.float(), k, dim=-1).values
    assert torch.equal(vals, ref)
    assert torch.equal(logits.float().gather(1, ids), vals)
    for row_ids, row_vals in zip(ids.tolist(), vals.tolist(), strict=True):
        assert len(set(row_ids)) == k
        for j in range(k - 1):  # among equal values, the smaller id first
            if row_vals[j] == row_vals[j + 1]:
                assert row_ids[j] < row_ids[j + 1]


@pytest.mark.parametrize(
    ("rows", "vocab", "k", "chunk"),
    [
        (3, 1000, 32, 256),
        (2, 777, 64, 128),
        (1, 50, 16, 64),
        (2, 300, 8, 256),
        (1, 32, 32, 32),
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
    _check(logits, 16, 128)
    ties = torch.randint(-3, 3, (2, 5000), generator=gen).float()  # ties through the second launch
    ties[1, ::7] = 3.0
    _check(ties, 8, 128)
    assert topk_rows(logits.to(DEVICE), 16, 128)[1][0, :4].tolist() == [5, 7, 300, 599]


def test_signed_zeros_tie_and_nan_rows_give_real_ids() -> None:
    zeros = torch.tensor([[-0.0, 0.0, -0.0, 0.0] + [-1.0] * 60])
    vals, ids = topk_rows(zeros.to(DEVICE), 2, 64)
    assert ids.cpu().tolist() == [[0, 1]] and torch.equal(vals.cpu(), torch.zeros(1, 2))
    nan = torch.randn(3, 600, generator=torch.Generator().manual_seed(3))
    nan[0] = float("nan")  # a whole row of NaN: every id is still a position of the row
    nan[1, [10, 20]] = float("nan")
    nan[2, 500] = -float("nan")
    vals, ids = topk_rows(nan.to(DEVICE), 8, 128)
    ids = ids.cpu()
    assert bool(((ids >= 0) & (ids < 600)).all())
    assert all(len(set(r)) == 8 for r in ids.tolist())
    assert ids[1, :2].tolist() == [10, 20]  # a positive NaN sorts as the largest value
    assert 500 not in ids[2].tolist()  # a negative one as the smallest
    assert torch.equal(vals.cpu()[2], torch.topk(nan[2][~nan[2].isnan()], 8).values)  # torch.topk: NaN first


def test_bf16_logits_and_a_zero_stride_batch() -> None:
    gen = torch.Generator().manual_seed(2)
    row = (torch.randn(500, generator=gen) * 3).to(torch.bfloat16)
    logits = row.expand(3, 500)  # rows share storage (stride 0), as a test of the sampler does
    _check(logits, 32, 128)


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
    with pytest.raises(ValueError, match="chunk"):
        topk_rows(x, 32, chunk=24)
    with pytest.raises(ValueError, match="contiguous"):
        topk_rows(x.t(), 16)
    assert topk_rows(x[:0], 16)[0].shape == (0, 16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize("k", [32, 64])
def test_qwen3_vocabulary_on_cuda(rows: int, k: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(rows * k)
    logits = torch.randn(rows, 151936, device="cuda", generator=gen) * 3
    logits[0, torch.randperm(151936, device="cuda", generator=gen)[:50]] = logits[0].max()  # ties at the top
    _check(logits, k)
