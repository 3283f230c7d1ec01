"""The split-K reduction fused into the next residual-add + RMSNorm on a GPU at Qwen3-8B shapes
(hidden 4096, intermediate 12288) with the engine's measured configs
(:data:`surge.quant.fp8_linear.SPLITK_MEASURED`): the fused kernel against the unfused pair bit
for bit, and a 4-layer Qwen3-8B-shaped FP8 model with CUDA graphs whose logits are identical
with the fusion on and off.

Run on a GPU host: ``PYTHONPATH=. python3 -m pytest -p no:cacheprovider -o timeout=0 -m gpu
tests/kernels/test_splitk_norm_fusion_gpu.py``
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch

from surge.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from surge.kernels.fp8_gemm_splitk import Fp8SplitKConfig
from surge.layers.linear import RowParallelLinear
from surge.quant.fp8 import Fp8Activations, SplitKPartials, quantize_per_channel
from surge.quant.fp8_linear import splitk_configs
from surge.worker.model_runner import ModelRunner
from tests.worker.helpers import QWEN3_8B, count_replays, drive

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BF16 = torch.bfloat16
DEFERRED = {"o": (4096, 4096), "down": (4096, 12288)}


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if a.dtype == torch.float8_e4m3fn:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("layer", list(DEFERRED))
@pytest.mark.parametrize("m", [1, 5, 16, 33, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_kernel_real_shapes_and_configs(layer: str, m: int, with_bias: bool) -> None:
    """With the table's config for ``m`` tokens where it reduces with the kernel (else a 4-way
    kernel-reduce config): the split-K GEMM's
    partials through :func:`add_rmsnorm_partials` (and ``_fp8``) equal the GEMM's output through
    :func:`add_rmsnorm` (and ``_fp8``), output and new residual, bit for bit."""
    from surge.kernels.add_rmsnorm import (
        add_rmsnorm,
        add_rmsnorm_fp8,
        add_rmsnorm_partials,
        add_rmsnorm_partials_fp8,
    )
    from surge.kernels.fp8_gemm_splitk import fp8_linear_splitk, fp8_linear_splitk_partials
    from surge.kernels.fp8_quant import per_token_quant_fp8

    n, k = DEFERRED[layer]
    cfg = splitk_configs(n, k)[m]
    if cfg is None or cfg.split_k == 1 or cfg.reduce != "kernel":
        # The table does not defer here; the fused kernel still runs at this M with a
        # kernel-reduce config of the same block_m.
        cfg = Fp8SplitKConfig(16 if m <= 16 else 32 if m <= 32 else 64, 64, 128, 4, 4, 4, True, "kernel")
    torch.manual_seed(m)
    w, s = quantize_per_channel(torch.randn(n, k, device="cuda") * 0.02)
    x = 3 * torch.randn(m, k, device="cuda", dtype=BF16)
    bias = 0.1 * torch.randn(n, device="cuda", dtype=BF16) if with_bias else None
    residual = torch.randn(m, n, device="cuda", dtype=BF16)
    norm_w = (1 + 0.2 * torch.randn(n, device="cuda")).to(BF16)
    y = fp8_linear_splitk(x, w, s, bias, config=cfg)
    parts = [fp8_linear_splitk_partials(x, w, s, bias, config=cfg)]
    if cfg.a8:
        xq, xs = per_token_quant_fp8(x)
        parts.append(fp8_linear_splitk_partials(xq, w, s, bias, config=cfg, x_scale=xs, out_dtype=BF16))
    want = add_rmsnorm(y, norm_w, 1e-6, residual)
    want8 = add_rmsnorm_fp8(y, norm_w, 1e-6, residual)
    for p in parts:
        got = add_rmsnorm_partials(p, norm_w, 1e-6, residual)
        got8 = add_rmsnorm_partials_fp8(p, norm_w, 1e-6, residual)
        assert all(_same(a, b) for a, b in zip(got, want, strict=True)), cfg
        assert all(_same(a, b) for a, b in zip(got8, want8, strict=True)), cfg
        out, _ = add_rmsnorm_partials(p, norm_w, 1e-6)
        assert _same(out, add_rmsnorm(y, norm_w, 1e-6)[0]), cfg


def _runner(model_dir: Path, *, fused: bool) -> ModelRunner:
    mc = ModelConfig.from_pretrained(
        model_dir, dtype="bfloat16", load_format="dummy", max_model_len=4096, quantization="fp8"
    )
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(block_size=16, num_kv_blocks=1024),
        scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=1024, max_model_len=4096),
        device="cuda",
        enforce_eager=False,
    )
    runner = ModelRunner(cfg, None)
    rows = [m for m in runner.model.modules() if isinstance(m, RowParallelLinear)]
    assert rows and all(r.partials_consumer is not None for r in rows)
    if not fused:
        for r in rows:
            r.partials_consumer = None
    runner.init_kv_cache(1024)  # warm-up and graph capture follow the wiring
    return runner


@pytest.mark.skipif(not QWEN3_8B.is_dir(), reason="needs the qwen3-8b config")
def test_qwen3_8b_shape_fp8_logits_identical_with_fusion_on_and_off(tmp_path: Path) -> None:
    """A 4-layer Qwen3-8B-shaped model with FP8 weights (dummy, the engine's tables), CUDA
    graphs: decode batches of 1 to 40 sequences (table buckets 1 to 64; down_proj defers at
    M <= 16 and M > 32, o_proj at M > 8) and mixed steps;
    the fused runner's logits equal the unfused runner's bit for bit at every step."""
    gc.collect()
    torch.cuda.empty_cache()
    cfg = json.loads((QWEN3_8B / "config.json").read_text())
    cfg["num_hidden_layers"] = 4
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    fused = _runner(tmp_path, fused=True)
    unfused = _runner(tmp_path, fused=False)
    down = fused.model.model.layers[0].mlp.down_proj
    probe = torch.randn(1, 12288, device="cuda", dtype=BF16)
    assert isinstance(down(probe), SplitKPartials)  # the table defers down_proj at M = 1
    act = Fp8Activations(torch.zeros(64, 12288, device="cuda", dtype=torch.float8_e4m3fn),
                         torch.ones(64, 1, device="cuda"), BF16)  # fmt: skip
    assert isinstance(down(act), SplitKPartials)  # and at M = 64 (w8a8)
    replays = count_replays(fused)
    steps = [0]

    def same(logits: torch.Tensor, ref: torch.Tensor) -> None:
        steps[0] += 1
        assert torch.equal(logits, ref), f"step {steps[0]}: max diff {(logits - ref).abs().max().item()}"

    prompts = [[(11 * i + j) % 150000 for j in range(3 + (i * 37) % 90)] for i in range(40)]
    prompts[0] = [(5 * j) % 150000 for j in range(300)]
    arrivals = [0] + [2 + i // 4 for i in range(1, 40)]
    drive([fused, unfused], prompts, arrivals, 20, same)
    assert len(replays) > 8 and 1 in replays and max(replays) > 16
