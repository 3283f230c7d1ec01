"""``benchmarks/megakernel_probe.py`` computes what it times: its launch chain (one program per tile,
or a few programs looping over the tiles, row-major or tile-by-tile weights) and its persistent
kernel with grid barriers (one program, under the interpreter) against a torch reference, at small
shapes. The barrier's multi-program behaviour needs co-resident programs, i.e. a GPU: the probe
itself checks there that every variant gives the chain's bits."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import megakernel_probe as probe  # noqa: E402

PHASES = {"qkv": (192, 256, 2), "o": (128, 128, 1), "gate_up": (256, 128, 1), "down": (128, 256, 2)}
LAYERS = 2
BUF = 512


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> dict[str, torch.Tensor]:
    """The probe at small shapes: its phases and buffer size, and ``[LAYERS, N, K]`` e4m3 weights."""
    monkeypatch.setattr(probe, "PHASES", PHASES)
    monkeypatch.setattr(probe, "BUF", BUF)
    g = torch.Generator().manual_seed(0)
    return {
        name: (torch.randn(LAYERS, n, k, generator=g) * (k / s) ** -0.5).to(torch.float8_e4m3fn)
        for name, (n, k, s) in PHASES.items()
    }


def fresh() -> torch.Tensor:
    """The probe's ``[2 * BUF]`` bf16 activation buffer at the start: 128 seeded random values,
    then zeros."""
    buf = torch.zeros(2 * BUF, dtype=torch.bfloat16)
    buf[:128] = torch.randn(128, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    return buf


def reference(w: dict[str, torch.Tensor]) -> torch.Tensor:
    """The buffer after ``LAYERS`` layers: each phase's ``K / SPLIT`` slices of ``w @ x`` in fp32,
    rounded to bf16, the next phase reading slice 0 (the first ``K`` values) of them."""
    buf = fresh()
    halves = (buf[:BUF], buf[BUF:])
    src = 0
    for layer in range(LAYERS):
        for name, (n, k, split) in PHASES.items():
            x = halves[src][:k].float()
            wt = w[name][layer].float()
            sl = k // split
            for s in range(split):
                part = wt[:, s * sl : (s + 1) * sl] @ x[s * sl : (s + 1) * sl]
                halves[1 - src][s * n : (s + 1) * n] = part.to(torch.bfloat16)
            src = 1 - src
    return buf


@pytest.mark.parametrize("grid", [0, 1, 3])
def test_chain_matches_torch(small: dict[str, torch.Tensor], grid: int) -> None:
    want = reference(small)
    buf = fresh()
    probe.chain(small, buf, LAYERS, grid, False)()
    assert int((want != 0).sum()) > 500  # every phase wrote values
    torch.testing.assert_close(buf.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_tiled_layout_gives_the_row_major_bits(small: dict[str, torch.Tensor]) -> None:
    rows = fresh()
    probe.chain(small, rows, LAYERS, 0, False)()
    tiled_w = {name: probe.tile_layout(t, probe.BN, probe.BK) for name, t in small.items()}
    assert tiled_w["qkv"].shape == (LAYERS, 192 // probe.BN, 256 // probe.BK, probe.BN, probe.BK)
    tiled = fresh()
    probe.chain(tiled_w, tiled, LAYERS, 0, False, tiled=True)()
    assert torch.equal(tiled, rows)


def test_persistent_kernel_gives_the_chain_bits(small: dict[str, torch.Tensor]) -> None:
    chained = fresh()
    probe.chain(small, chained, LAYERS, 1, False)()
    buf = fresh()
    cnt = torch.zeros(1, dtype=torch.int32)
    probe.mega(small, buf, cnt, LAYERS, 1, 0, False)()
    assert int(cnt.item()) == 4 * LAYERS  # one arrival per barrier, no timeout (bit 30 clear)
    assert torch.equal(buf, chained)


def test_a_barrier_never_reached_is_reported_not_hung(small: dict[str, torch.Tensor]) -> None:
    """Two programs that cannot be resident together (the interpreter runs them one after the
    other): the first gives up on its first barrier after ``max_polls`` polls and sets bit 30,
    which releases every later barrier of both programs; the launch returns and the counter
    says so (the probe then reports the variant as hung)."""
    buf = fresh()
    cnt = torch.zeros(1, dtype=torch.int32)
    probe.mega(small, buf, cnt, LAYERS, 2, 0, False, max_polls=4)()
    value = int(cnt.item())
    assert value & probe.HANG
    assert value & (probe.HANG - 1) == 2 * 4 * LAYERS  # both programs arrived at every barrier
