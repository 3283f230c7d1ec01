"""The grammar-mask kernel vs its torch reference (:func:`apply_token_bitmask_torch`)."""

from __future__ import annotations

import pytest
import torch

from surge.kernels.token_bitmask import apply_token_bitmask
from surge.structured.bitmask import apply_token_bitmask_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(s: int, vocab: int, rows: list[int], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(vocab + s)
    logits = torch.randn(s, vocab, generator=g).to(dtype)
    width = (vocab + 31) // 32 + 1  # wider than needed: bits past V are ignored
    bits = torch.randint(-(2**31), 2**31 - 1, (len(rows), width), generator=g, dtype=torch.int64)
    mask = bits.to(torch.int32)
    mask[0, :4] = -1  # a stretch of allowed tokens
    mask[-1, 1:3] = 0  # and of forbidden ones
    return logits, mask, torch.tensor(rows, dtype=torch.int32)


@pytest.mark.parametrize("vocab", [37, 4096, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference_and_touches_only_listed_rows(vocab: int, dtype: torch.dtype) -> None:
    logits, mask, rows = _case(5, vocab, [3, 0, 4], dtype)
    expected = logits.clone()
    apply_token_bitmask_torch(expected, mask, rows)
    got = logits.to(DEVICE)
    apply_token_bitmask(got, mask.to(DEVICE), rows.to(DEVICE))
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    for r in (1, 2):  # rows without a mask are untouched
        assert torch.equal(got[r].cpu(), logits[r])
    # the reference itself: bit t of word t // 32 clear <=> -inf
    t = torch.arange(vocab)
    allowed = ((mask[0][t // 32] >> (t % 32)) & 1).bool()
    assert torch.equal(torch.isinf(expected[3]), ~allowed)


def test_no_rows_and_errors() -> None:
    logits = torch.randn(2, 64, device=DEVICE)
    before = logits.clone()
    apply_token_bitmask(
        logits,
        torch.empty(0, 2, dtype=torch.int32, device=DEVICE),
        torch.empty(0, dtype=torch.int32, device=DEVICE),
    )
    assert torch.equal(logits, before)
    with pytest.raises(ValueError):
        apply_token_bitmask(
            logits,
            torch.zeros(1, 1, dtype=torch.int32, device=DEVICE),
            torch.zeros(1, dtype=torch.int32, device=DEVICE),
        )
    with pytest.raises(ValueError):
        apply_token_bitmask(
            logits,
            torch.zeros(1, 2, dtype=torch.int64, device=DEVICE),
            torch.zeros(1, dtype=torch.int32, device=DEVICE),
        )
    with pytest.raises(ValueError):
        apply_token_bitmask(
            logits,
            torch.zeros(1, 2, dtype=torch.int32, device=DEVICE),
            torch.zeros(2, dtype=torch.int32, device=DEVICE),
        )
