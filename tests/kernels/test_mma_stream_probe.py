"""``benchmarks/mma_stream_probe.py`` computes what it times: on an sm89+ GPU, one layer of its
tensor-core GEMV phases (qkv, o, gate_up, down and the next qkv, each launched alone) matches
float32 torch from the kernel's own inputs, for 1 and 4 tokens and block and warp input builds;
its grid barrier never times out. On CPU the probe's table layout and shared-memory size are
checked against the kernel's ``Phase`` struct."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import mma_stream_probe as probe  # noqa: E402

GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def test_phase_struct_is_the_tables_eight_words() -> None:
    """The table rows the probe packs (six addresses, then ``n | k << 32`` and ``n_prev | ld << 32``)
    are the kernel's ``Phase``: six 64-bit fields and four ints."""
    body = re.search(r"struct Phase \{([^}]*)\}", probe._SOURCE)
    assert body is not None
    fields = body.group(1)
    assert fields.count("u64") == 1 and len(fields.split(";")[0].split(",")) == 6
    assert re.search(r"int n, k, n_prev, ld;", fields)


def test_shared_memory_fits_one_block_per_multiprocessor() -> None:
    """Inputs of 16 tokens at the largest ``K`` plus the tile accumulators stay under the H200's
    227 KiB per block; every Qwen3-8B phase splits into whole 256-byte chunks per warp."""
    assert probe.smem_bytes(16) < 227 * 1024
    assert probe.smem_bytes(1) == probe.XS + probe.ACC_ROWS * 4
    assert all(k % (probe.KC * probe.NW) == 0 and k <= probe.XMAX for _, _, k in probe.PHASES)


@pytest.mark.skipif(not GPU, reason="needs an sm89+ CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 4])
@pytest.mark.parametrize("build", ["block", "warp"])
def test_probe_matches_torch(tokens: int, build: str) -> None:
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    w = probe.build_weights(2)
    rows = probe.probe_variant(w, 2, 2, sms, tokens, "bf16", 0, build)
    assert rows and all(r["min_cosine"] > 0.999 and not r["hung"] for r in rows)
