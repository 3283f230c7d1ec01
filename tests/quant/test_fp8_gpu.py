"""FP8 on a GPU (sm89+; skipped without CUDA): every FP8 kernel against its torch reference at
Qwen3-8B shapes, and a 4-layer Qwen3-8B-shaped model in FP8 with CUDA graphs, in each FP8 mode,
against the torch emulation of the same FP8 weights and against bf16 (see that test's docstring).

Run on a GPU host: ``PYTHONPATH=. python3 -m pytest -p no:cacheprovider -o timeout=0 -m gpu tests/quant``
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch

from surge.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from surge.layers.linear import _LinearBase
from surge.layers.torch_attention import TorchAttentionBackend
from surge.quant.fp8 import (
    FP8_DTYPE,
    fp8_linear_reference,
    quantize_block,
    quantize_per_channel,
    quantize_per_token,
)
from surge.quant.fp8_linear import Fp8LinearMethod
from surge.worker.model_runner import ModelRunner
from tests.worker.helpers import QWEN3_8B, count_replays, drive

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

_REPO = Path(__file__).resolve().parents[2]
FP8_CONFIG = _REPO / "benchmarks" / "configs" / "qwen3-8b-fp8" / "config.json"
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6)).item()


@pytest.mark.parametrize("m", [1, 16, 512])
@pytest.mark.parametrize("k", [4096, 12288])
def test_per_token_quant_real_shapes(m: int, k: int) -> None:
    from surge.kernels.fp8_quant import per_token_quant_fp8

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 4
    q, s = per_token_quant_fp8(x)
    _, s_ref = quantize_per_token(x)
    # torch on CUDA divides by a scalar as a multiplication by its reciprocal (1 ulp off the
    # kernel's IEEE division); the quantized values are compared on the kernel's own scales.
    torch.testing.assert_close(s, s_ref, rtol=3e-7, atol=0.0)
    q_ref = (x.float() / s).clamp(-448.0, 448.0).to(FP8_DTYPE)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("layer", list(SHAPES))
@pytest.mark.parametrize("m", [1, 7, 16, 300])
def test_fp8_gemms_real_shapes(layer: str, m: int) -> None:
    from surge.kernels.fp8_gemm import fp8_linear
    from surge.quant.fp8_linear import scaled_mm_linear

    n, k = SHAPES[layer]
    w = torch.randn(n, k, device="cuda") * 0.02
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    wc, sc = quantize_per_channel(w)
    wb, sb = quantize_block(w, (128, 128))
    got = fp8_linear(x, wc, sc)
    assert _rel_err(got, fp8_linear_reference(x, wc, sc, quantize_input=False)) < 1e-2
    got = fp8_linear(x, wb, sb, block_size=(128, 128))
    assert _rel_err(got, fp8_linear_reference(x, wb, sb, block_size=(128, 128), quantize_input=False)) < 1e-2
    got = scaled_mm_linear(x, wc, sc.view(1, n), None)
    assert _rel_err(got, fp8_linear_reference(x, wc, sc)) < 1e-2


@pytest.mark.parametrize("layer", list(SHAPES))
@pytest.mark.parametrize("m", [1, 5, 16, 64])
@pytest.mark.parametrize("a8", [False, True])
def test_fp8_splitk_gemm_real_shapes(layer: str, m: int, a8: bool) -> None:
    from surge.kernels.fp8_gemm_splitk import Fp8SplitKConfig, default_splitk_config, fp8_linear_splitk
    from surge.kernels.fp8_quant import per_token_quant_fp8
    from surge.quant.fp8 import dequantize

    n, k = SHAPES[layer]
    w = torch.randn(n, k, device="cuda") * 0.02
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) * 0.1
    wc, sc = quantize_per_channel(w)
    xq, xs = per_token_quant_fp8(x)
    ref = (dequantize(xq, xs) if a8 else x.float()) @ dequantize(wc, sc).t() + bias.float()
    block_m = 16 if m <= 16 else 64
    for cfg in (
        Fp8SplitKConfig(block_m, 64, 256, 1, 4, 4, a8),
        Fp8SplitKConfig(block_m, 64, 256, 8, 4, 4, a8),
        Fp8SplitKConfig(block_m, 32, 128, 3, 3, 4, a8),  # ragged K slices
        default_splitk_config(m, n, k),
    ):
        got = fp8_linear_splitk(x, wc, sc, bias, config=cfg)
        want = ref if cfg.a8 else x.float() @ dequantize(wc, sc).t() + bias.float()
        assert _rel_err(got, want) < 1e-2, cfg


@pytest.mark.parametrize("layer", list(SHAPES))
@pytest.mark.parametrize("m", [1, 16, 64, 300])
def test_fp8_layer_takes_prequantized_activations_real_shapes(layer: str, m: int) -> None:
    """An FP8 layer with the engine's tables (split-K buckets, ``_scaled_mm``) given the
    per-token FP8 activations of its producer (:meth:`Fp8LinearMethod.wants_fp8_input` steps)
    returns exactly what it returns for the bf16 activations; the producers' fused kernels
    (RMSNorm for K = 4096, SiLU-and-mul for K = 12288) give those activations bit for bit."""
    from surge.kernels.add_rmsnorm import add_rmsnorm, add_rmsnorm_fp8
    from surge.kernels.fp8_quant import per_token_quant_fp8
    from surge.kernels.silu_and_mul import silu_and_mul, silu_and_mul_fp8
    from surge.layers.linear import ReplicatedLinear
    from surge.quant.config import Fp8Config
    from surge.quant.fp8 import Fp8Activations

    n, k = SHAPES[layer]
    lin = ReplicatedLinear(k, n, dtype=torch.bfloat16).cuda()
    lin.weight.data.normal_(0, 0.02)
    method = Fp8LinearMethod(Fp8Config("channel", from_checkpoint=False), emulate=False)
    method.process_weights(lin)
    lin.quant_method = method
    if k == 12288:
        gate_up = 3 * torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16)
        x = silu_and_mul(gate_up)
        q, s = silu_and_mul_fp8(gate_up)
    else:
        h, res = torch.randn(2, m, k, device="cuda", dtype=torch.bfloat16)
        w = (1 + 0.2 * torch.randn(k, device="cuda")).to(torch.bfloat16)
        x = add_rmsnorm(h, w, 1e-6, res)[0]
        q, s, _ = add_rmsnorm_fp8(h, w, 1e-6, res)
    xq, xs = per_token_quant_fp8(x)
    assert torch.equal(s, xs) and torch.equal(q.view(torch.uint8), xq.view(torch.uint8))
    if lin.wants_fp8_input(m, torch.bfloat16):
        assert torch.equal(lin(Fp8Activations(q, s, torch.bfloat16)), lin(x))
    else:
        with pytest.raises(ValueError, match="FP8 activations"):
            lin(Fp8Activations(q, s, torch.bfloat16))


@pytest.mark.parametrize("layer", list(SHAPES))
@pytest.mark.parametrize("m", [1, 5, 16, 64, 512])
def test_fp8_splitk_block_gemm_real_shapes(layer: str, m: int) -> None:
    """The split-K GEMM with 128 x 128 block scales (FP8 checkpoints' decode and prefill paths)
    against the torch reference, with the engine's tiles (w8a16 and w8a8 decode tables, the
    one-slice prefill config) and with split / ragged / w8a8 variants."""
    from surge.kernels.fp8_gemm_splitk import Fp8SplitKConfig, fp8_linear_splitk
    from surge.kernels.fp8_quant import per_token_quant_fp8
    from surge.quant.fp8 import dequantize
    from surge.quant.fp8_linear import block_prefill_config, block_splitk_config

    n, k = SHAPES[layer]
    block = (128, 128)
    # blocks of very different magnitudes: a scale read from the wrong block is a large error
    mag = torch.exp(torch.randn(n // 128, k // 128, device="cuda") * 1.5)
    w = torch.randn(n, k, device="cuda") * 0.02 * mag.repeat_interleave(128, 0).repeat_interleave(128, 1)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) * 0.1
    wb, sb = quantize_block(w, block)
    deq = dequantize(wb, sb, block)
    xq, xs = per_token_quant_fp8(x)
    block_m = 16 if m <= 16 else 64
    prefill = block_prefill_config(block)
    assert prefill is not None
    for cfg in (
        block_splitk_config(m, n, k, block),
        block_splitk_config(m, n, k, block, a8=True),
        prefill,
        Fp8SplitKConfig(block_m, 64, 128, 8, 4, 4),
        Fp8SplitKConfig(block_m, 32, 64, 3, 3, 4),  # ragged K slices, two steps per block
        Fp8SplitKConfig(block_m, 64, 128, 4, 4, 4, a8=True),
    ):
        got = fp8_linear_splitk(x, wb, sb, bias, config=cfg, block_size=block)
        want = (dequantize(xq, xs) if cfg.a8 else x.float()) @ deq.t() + bias.float()
        assert _rel_err(got, want) < 1e-2, cfg


def _block_layers(
    layer: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[torch.nn.Module, torch.nn.Module, list[int]]:
    """A Qwen3-8B-shaped layer with 128 x 128 block scales (blocks of very different magnitudes)
    and a bias, as the engine runs it and as the emulation computes it (the same FP8 weights),
    and the padded row counts of every cuBLAS block-scaled GEMM call (a spy)."""
    from surge.layers.linear import ReplicatedLinear
    from surge.quant import fp8_linear
    from surge.quant.config import Fp8Config

    calls: list[int] = []
    real = fp8_linear.cublas_block_scaled_mm

    def spy(*args: torch.Tensor, **kwargs: object) -> torch.Tensor:
        calls.append(args[0].shape[0])
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fp8_linear, "cublas_block_scaled_mm", spy)
    n, k = SHAPES[layer]
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    mag = torch.exp(torch.randn(n // 128, k // 128, device="cuda", generator=gen) * 1.5)
    w = torch.randn(n, k, device="cuda", generator=gen) * 0.02
    w *= mag.repeat_interleave(128, 0).repeat_interleave(128, 1)
    bias = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16) * 0.1
    layers = []
    for emulate in (False, True):
        lin = ReplicatedLinear(k, n, bias=True, dtype=torch.bfloat16).cuda()
        lin.weight.data.copy_(w)
        assert lin.bias is not None
        lin.bias.data.copy_(bias)
        method = Fp8LinearMethod(Fp8Config("block", False, (128, 128)), emulate=emulate)
        method.process_weights(lin)
        lin.quant_method = method
        layers.append(lin)
    del w
    cuda_method = layers[0].quant_method
    assert isinstance(cuda_method, Fp8LinearMethod)
    if torch.cuda.get_device_capability() == (9, 0):
        assert cuda_method.block_scaled_mm, "cuBLAS block-scaled GEMM probe failed on sm90 (see the log)"
    elif not cuda_method.block_scaled_mm:
        pytest.skip("cuBLAS's block-scaled GEMM failed its probe on this GPU (Triton path instead)")
    calls.clear()  # the start-up probe's own GEMM, when this test ran it first
    return layers[0], layers[1], calls


def _group_scaled_x(m: int, k: int, seed: int) -> torch.Tensor:
    """``[M, K]`` bf16 whose 128-column groups differ in magnitude (e**(1.5 N(0, 1)))."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    mag = torch.exp(torch.randn(m, k // 128, device="cuda", generator=gen) * 1.5)
    x = torch.randn(m, k, device="cuda", generator=gen) * mag.repeat_interleave(128, 1)
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("layer", list(SHAPES))
@pytest.mark.parametrize("m", [65, 100, 512, 2048])
def test_block_prefill_gemm_on_cublas_real_shapes(
    layer: str, m: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 128 x 128 block-scaled layer's prefill step (``M > 64``) through
    :class:`Fp8LinearMethod` takes cuBLAS's block-scaled GEMM on sm90 (asserted, with the rows
    padded to a multiple of 16) and matches the CPU emulation's numerics (activations per token
    and 128-column group) run on the same FP8 weights: per-row cosine >= 0.9999 and max error <=
    2**-6 of the largest output. Both compute on the same quantized operands (the group
    quantization kernel equals torch's bit for bit, checked here too), so
    what is left is the fp32 summation order and the bf16 rounding of the output before the
    bias add: about 1e-6 below 1 in cosine and one bf16 ulp (<= 2**-7 of the largest output).
    Per-token activation scales on these inputs give a cosine near 0.9997 against the
    emulation (activation rounding noise of e4m3), a wrong weight-scale layout far less."""
    from surge.kernels.fp8_group_quant import per_token_group_quant_fp8
    from surge.quant.fp8 import quantize_per_token_group

    lin, emu, calls = _block_layers(layer, monkeypatch)
    n, k = SHAPES[layer]
    x = _group_scaled_x(m, k, seed=m)
    q, s = per_token_group_quant_fp8(x, 16)
    _, s_ref = quantize_per_token_group(x)
    assert torch.equal(s[:m], s_ref)  # both IEEE-rounded divisions
    q_ref = (x.float().view(m, k // 128, 128) / s[:m, :, None]).clamp(-448.0, 448.0).to(FP8_DTYPE)
    assert torch.equal(q[:m].view(torch.uint8), q_ref.view(m, k).view(torch.uint8))
    got = lin(x)
    assert calls == [-(-m // 16) * 16] and got.shape == (m, n)
    want = emu(x)
    cos = torch.nn.functional.cosine_similarity(got.float(), want.float(), dim=-1)
    assert cos.min().item() >= 0.9999, cos.min().item()
    assert _rel_err(got, want) <= 2**-6


@pytest.mark.parametrize("m", [100, 512])
def test_block_prefill_gemm_on_cublas_in_a_cuda_graph(m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cuBLAS block-scaled path (group quantization into fresh padded buffers, the GEMM, the
    row slice and the bias add) captured in a CUDA graph, as the piecewise prefill graphs capture
    it, replays with new inputs to the eager result (the same bits expected; checked up to the
    summation order)."""
    lin, _, calls = _block_layers("qkv", monkeypatch)
    k = SHAPES["qkv"][1]
    static = _group_scaled_x(m, k, seed=1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        lin(static)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = lin(static)
    fresh = _group_scaled_x(m, k, seed=2)
    static.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    eager = lin(fresh)
    # the same bits expected; a different cuBLAS algorithm under capture would only change the
    # summation order, while a stale input or buffer would change everything
    cos = torch.nn.functional.cosine_similarity(out.float(), eager.float(), dim=-1)
    assert cos.min().item() >= 0.99999 and _rel_err(out, eager) <= 2**-7
    assert len(calls) == 3 and set(calls) == {-(-m // 16) * 16}


def test_fp8_kv_write_and_attention_real_shapes() -> None:
    from surge.kernels.kv_write import fused_qk_norm_rope_kv_write
    from surge.kernels.paged_attention import paged_attention
    from surge.layers.rotary import RotaryEmbedding
    from surge.layers.torch_attention import write_kv_cache
    from tests.kernels.attn_utils import make_batch

    # Qwen3-8B attention: 32 query heads, 8 KV heads, head_dim 128; decodes with long contexts
    # (split-KV) and a mixed prefill step.
    for q_lens, seq_lens, splits in (
        ([1] * 6, [5, 300, 2000, 4097, 17, 900], 8),
        ([300, 1, 64], [300, 1500, 700], 1),
    ):
        batch = make_batch(q_lens, seq_lens, 32, 8, 128, dtype=torch.bfloat16, device="cuda")
        md = batch.metadata
        n = md.num_tokens
        k8 = torch.zeros_like(batch.k_cache, dtype=FP8_DTYPE)
        v8 = torch.zeros_like(k8)
        k_ref, v_ref = k8.clone(), v8.clone()
        rope = RotaryEmbedding(128, 8192, 1e6).cuda()
        positions = (md.seq_lens.repeat_interleave(torch.tensor(q_lens, device="cuda")) - 1).long()[:n]
        q, k, v = batch.q[:n].clone(), batch.k[:n].clone(), batch.v[:n]
        q_rot, k_rot = rope(positions, q.clone(), k.clone())
        write_kv_cache(k_rot, v, k_ref, v_ref, md.slot_mapping, 0.5, 0.25)
        fused_qk_norm_rope_kv_write(
            q,
            k,
            v,
            positions,
            rope.cos_cache,
            rope.sin_cache,
            k8,
            v8,
            md.slot_mapping,
            k_scale=0.5,
            v_scale=0.25,
        )
        assert torch.equal(k8.view(torch.uint8), k_ref.view(torch.uint8))
        assert torch.equal(v8.view(torch.uint8), v_ref.view(torch.uint8))
        out = paged_attention(
            q,
            k8,
            v8,
            md.query_start_loc,
            md.seq_lens,
            md.block_table,
            128**-0.5,
            num_splits=splits,
            max_query_len=md.max_query_len,
            k_scale=0.5,
            v_scale=0.25,
        )
        ref = TorchAttentionBackend().forward(q, k, v, k8, v8, md, 128**-0.5, False, 0.5, 0.25)
        assert _rel_err(out[:n], ref[:n]) < 2e-2


def _runner(model_dir: Path, *, eager: bool, torch_backend: bool = False, **kw: object) -> ModelRunner:
    # the stream kernel only where a mode asks for it (it takes over one-token steps), never
    # under the emulation (the reference)
    stream = bool(kw.pop("stream_decode", False)) and not kw.get("emulate", False)
    stream_attention = bool(kw.pop("stream_attention", False)) and stream
    mc = ModelConfig.from_pretrained(
        model_dir,
        dtype="bfloat16",
        load_format="dummy",
        max_model_len=4096,
        quantization=kw.pop("quantization", None),  # type: ignore[arg-type]
    )
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(block_size=16, num_kv_blocks=1024, kv_cache_dtype=str(kw.pop("kv", "auto"))),
        scheduler=SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=1024, max_model_len=4096),
        device="cuda",
        enforce_eager=eager,
        stream_decode=stream,
        stream_attention=stream_attention,
    )
    runner = ModelRunner(cfg, TorchAttentionBackend() if torch_backend else None)
    assert (runner.model.model.stream_decode is not None) == stream
    if kw.pop("splitk_decode", False):
        from dataclasses import replace

        from surge.kernels.fp8_gemm_splitk import SplitKWorkspace, default_splitk_config
        from surge.quant.fp8_linear import SPLITK_MAX_M

        reduce = str(kw.pop("reduce", "kernel"))  # "inline": one shared workspace, as process_fp8
        methods = []
        for m in runner.model.modules():
            if isinstance(m, _LinearBase) and isinstance(m.quant_method, Fp8LinearMethod):
                n, k = m.weight.shape
                m.quant_method.splitk_by_m = tuple(
                    replace(default_splitk_config(t, n, k), reduce=reduce) for t in range(SPLITK_MAX_M + 1)
                )
                methods.append((m.quant_method, n))
        needs = [method.splitk_workspace_need(n) for method, n in methods]
        if reduce == "inline":
            ws = SplitKWorkspace.allocate(max(f for f, _ in needs), max(t for _, t in needs), "cuda")
            for method, _ in methods:
                method.splitk_workspace = ws
    if kw.pop("block_splitk_decode", False):  # as if SPLITK_BLOCK_FASTER held every shape
        from surge.quant.fp8_linear import BLOCK_SPLITK_A8_FROM, SPLITK_MAX_M, block_splitk_config

        a8_from = BLOCK_SPLITK_A8_FROM

        for m in runner.model.modules():
            if isinstance(m, _LinearBase) and isinstance(m.quant_method, Fp8LinearMethod):
                n, k = m.weight.shape
                bs = m.quant_method.block_size
                assert bs is not None
                m.quant_method.block_splitk_by_m = tuple(
                    block_splitk_config(max(t, 1), n, k, bs, a8_from is not None and t >= a8_from)
                    for t in range(SPLITK_MAX_M + 1)
                )
    if kw.pop("triton_decode", False):
        for m in runner.model.modules():
            if isinstance(m, _LinearBase) and isinstance(m.quant_method, Fp8LinearMethod):
                m.quant_method.triton_for_decode = True
    if kw.pop("emulate", False):  # the same FP8 weights, computed by the torch reference
        for m in runner.model.modules():
            if isinstance(m, _LinearBase) and isinstance(m.quant_method, Fp8LinearMethod):
                m.quant_method.emulate = True
    runner.init_kv_cache(1024)
    sd = runner.model.model.stream_decode
    assert (sd is not None and sd.fused_table is not None) == stream_attention  # bound with the caches
    if stream_attention:  # the batch-1 graph captured the one-launch plan, not the fallback
        assert sd is not None and sd.fused_calls > 0
    return runner


def _four_layers(tmp_path: Path, src: Path) -> Path:
    cfg = json.loads(src.read_text())
    cfg["num_hidden_layers"] = 4
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.skipif(not QWEN3_8B.is_dir(), reason="needs the qwen3-8b config")
@pytest.mark.parametrize(
    "mode",
    [
        {"quantization": "fp8"},
        {"quantization": "fp8", "stream_decode": True},
        {"quantization": "fp8", "stream_decode": True, "stream_attention": True},
        {"quantization": "fp8", "triton_decode": True},
        {"quantization": "fp8", "splitk_decode": True},
        {"quantization": "fp8", "splitk_decode": True, "reduce": "inline"},
        {"quantization": "fp8", "kv": "fp8"},
        {"quantization": "fp8", "kv": "fp8", "stream_decode": True, "stream_attention": True},
        {"kv": "fp8"},
        {"checkpoint": True},
        {"checkpoint": True, "block_splitk_decode": True},
        {"checkpoint": True, "stream_decode": True},
        {"checkpoint": True, "stream_decode": True, "stream_attention": True},
    ],
    ids=[
        "fp8-weights",
        "fp8-weights-stream-decode",
        "fp8-weights-stream-attention",
        "fp8-weights-triton-decode",
        "fp8-weights-splitk-decode",
        "fp8-weights-splitk-inline-decode",
        "fp8-weights-kv",
        "fp8-weights-kv-stream-attention",
        "fp8-kv",
        "fp8-block-checkpoint",
        "fp8-block-checkpoint-splitk-decode",
        "fp8-block-checkpoint-stream-decode",
        "fp8-block-checkpoint-stream-attention",
    ],
)
def test_qwen3_8b_shape_fp8_logits_close_to_bf16(tmp_path: Path, mode: dict[str, object]) -> None:
    """A 4-layer Qwen3-8B-shaped model (dummy weights) in each FP8 mode, with CUDA graphs, against
    (1) the same FP8 weights computed by the torch emulation (dequantize, fp32 matmul; activations
    quantized per token exactly where the CUDA path does): cosine >= 0.99 per logits row, i.e.
    the kernels compute FP8 math up to rounding (a wrong scale axis, a scale applied twice, a
    missing clamp or a truncating cast gives far less). The H200 gave 0.993-0.994 (2026-11-30):
    bf16 activations between layers and activation scales one ulp off torch's flip some inputs
    by one e4m3 step, and this random network amplifies that noise (see below); and (2) the bf16 model: per row, at most
    0.005 below the emulation's own cosine to bf16, and >= 0.99 where FP8 math allows it.

    Why not ">= 0.99 against bf16" for the FP8-weight modes (the first H200 run: 0.978 to 0.989):
    it is not reachable by exact FP8 arithmetic on random weights. Measured on CPU by emulation
    at these shapes (4 layers, 48 tokens; ``dummy`` init, normal(0, 0.02)): per-channel FP8
    weights alone give min cosine 0.988 (logits relative error 13.8 %), per-token FP8
    activations alone 0.988, both 0.977, both + FP8 KV 0.971, FP8 KV alone 0.997; the bf16
    model against fp32 0.9998. Each quantized linear adds ~2.5 % relative noise (3 mantissa
    bits) and this random network carries it to the logits undamped (1 % noise on layer 0's qkv
    output: 3.3 % at the logits), 16 linears in all. Scaling o/down by 1/sqrt(2 * 36) (GPT-2's
    residual init) changes nothing (0.979); only when all layers read and write one shared
    256-dim subspace of the residual stream (as trained models concentrate their traffic) does
    it reach 0.999 (weights), 0.994 (weights + activations), 0.990 (+ KV). The trained-model
    quality bound is the CPU test on stories260K (tests/quant/test_fp8_quality.py).
    """
    gc.collect()
    torch.cuda.empty_cache()
    mode = dict(mode)
    src = FP8_CONFIG if mode.pop("checkpoint", False) else QWEN3_8B / "config.json"
    (tmp_path / "fp8").mkdir()
    fp8_dir = _four_layers(tmp_path / "fp8", src)
    (tmp_path / "bf16").mkdir()
    bf16_dir = _four_layers(tmp_path / "bf16", QWEN3_8B / "config.json")
    fp8 = _runner(fp8_dir, eager=False, **dict(mode))
    assert fp8.graph_runner is not None
    quantized = src == FP8_CONFIG or "quantization" in mode
    if quantized:
        qkv = fp8.model.model.layers[0].self_attn.qkv_proj
        assert qkv.weight.dtype == FP8_DTYPE
    emulated = _runner(fp8_dir, eager=True, emulate=True, **dict(mode))
    reference = _runner(bf16_dir, eager=True)
    replays = count_replays(fp8)
    worst = {"fp8~emulated": 1.0, "fp8~bf16": 1.0, "emulated~bf16": 1.0}
    pending: list[torch.Tensor] = []

    def cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)

    def close(logits: torch.Tensor, ref: torch.Tensor) -> None:
        if not pending:  # drive() calls this for fp8, then for the emulation, against bf16
            pending.append(logits)
            return
        got, emu = pending.pop(), logits
        exact, to_bf16, emu_to_bf16 = cos(got, emu), cos(got, ref), cos(emu, ref)
        for key, c in (("fp8~emulated", exact), ("fp8~bf16", to_bf16), ("emulated~bf16", emu_to_bf16)):
            worst[key] = min(worst[key], c.min().item())
        assert exact.min().item() >= 0.99, worst
        assert (to_bf16 >= emu_to_bf16 - 0.005).all(), worst
        if not quantized:  # FP8 KV cache only: within reach of FP8 math on random weights
            assert to_bf16.min().item() >= 0.99, worst

    prompts = [[(7 * i + j) % 150000 for j in range(n)] for i, n in enumerate([32, 600, 5, 2000, 130, 47])]
    drive([fp8, emulated, reference], prompts, [0, 0, 1, 1, 3, 6], 16, close)
    assert not pending
    assert len(replays) > 8
    print("min cosines", {k: round(v, 5) for k, v in worst.items()})
