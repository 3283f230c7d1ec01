"""Which steps :meth:`surge.layers.attention.Attention.project_and_attend` runs through the fused
qkv reduce + rotary + K/V write (:mod:`surge.kernels.qkv_rope_kv_write`), and that its output
and caches equal the unfused path's (the GEMM with its reduce kernel, then
:meth:`~surge.layers.attention.Attention.forward`). The layer's CUDA gate is opened on CPU so
that the Triton kernels run under the interpreter."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from surge.config import ModelConfig
from surge.kernels import qkv_rope_kv_write as fused_module
from surge.kernels.fp8_gemm_splitk import Fp8SplitKConfig
from surge.layers import attention as attention_module
from surge.layers.attention import Attention
from surge.layers.attention_backend import AttentionBackend, AttentionMetadata
from surge.layers.linear import QKVParallelLinear, _LinearBase
from surge.layers.norm import RMSNorm
from surge.layers.rotary import RotaryEmbedding
from surge.layers.torch_attention import TorchAttentionBackend
from surge.layers.triton_attention import TritonAttentionBackend
from surge.model.loader import load_model
from surge.quant import fp8_linear
from surge.quant.config import Fp8Config
from surge.quant.fp8 import SplitKPartials
from tests.kernels.attn_utils import PagedBatch, make_batch

BF16 = torch.bfloat16
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 64, 4, 2, 32


def _layers(reduce: str, with_norm: bool, with_bias: bool, a8: bool) -> tuple[QKVParallelLinear, Attention]:
    qkv = QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, KV_HEADS, bias=with_bias, dtype=BF16)
    gen = torch.Generator().manual_seed(4)
    qkv.weight.data.copy_(torch.randn(qkv.weight.shape, generator=gen) * 0.1)
    if qkv.bias is not None:
        qkv.bias.data.copy_(torch.randn(qkv.bias.shape, generator=gen) * 0.3)
    method = fp8_linear.Fp8LinearMethod(Fp8Config("channel", False), emulate=False)
    method.process_weights(qkv)
    cfg = Fp8SplitKConfig(16, 32, 32, 2, 2, 4, a8=a8, reduce=reduce)  # type: ignore[arg-type]
    method.splitk_by_m = (cfg,) * (fp8_linear.SPLITK_MAX_M + 1)
    qkv.quant_method = method
    norms: tuple[RMSNorm | None, RMSNorm | None] = (None, None)
    if with_norm:
        qn, kn = RMSNorm(HEAD_DIM, 1e-6, BF16), RMSNorm(HEAD_DIM, 1e-6, BF16)
        qn.weight.data.copy_(1 + 0.3 * torch.randn(HEAD_DIM, generator=gen))
        kn.weight.data.copy_(1 + 0.3 * torch.randn(HEAD_DIM, generator=gen))
        norms = (qn, kn)
    rope = RotaryEmbedding(HEAD_DIM, 512, base=1_000_000.0)
    return qkv, Attention(HEADS, KV_HEADS, HEAD_DIM, rope, *norms)


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = fused_module.qkv_rope_kv_write

    def spy(p: SplitKPartials, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(p.partials.shape[1])
        return real(p, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fused_module, "qkv_rope_kv_write", spy)
    return calls


@pytest.mark.parametrize("with_norm,with_bias,a8", [(True, False, True), (False, True, False)])
def test_decode_step_takes_the_fused_kernel_with_equal_results(
    monkeypatch: pytest.MonkeyPatch, with_norm: bool, with_bias: bool, a8: bool
) -> None:
    """A 3-sequence decode step (one padding row) on the Triton backend: Qwen3-like (q/k norm,
    w8a8) and Qwen2-like (bias, w8a16); attention output and both caches bit for bit the
    unfused path's; the KV write happens once, in the fused kernel."""
    monkeypatch.setattr(attention_module, "_is_cuda", lambda t: True)
    calls = _spy(monkeypatch)
    qkv, attn = _layers("kernel", with_norm, with_bias, a8)
    batch = make_batch([1, 1, 1], [5, 19, 3], HEADS, KV_HEADS, HEAD_DIM, dtype=BF16, num_pad_tokens=1)
    t = batch.metadata.num_tokens + 1
    md = replace(batch.metadata, num_tokens=t)
    hidden = torch.randn(t, HIDDEN, generator=torch.Generator().manual_seed(8)).to(BF16)
    positions = torch.tensor([4, 18, 2, 0])
    backend = TritonAttentionBackend(num_sms=4, decode_rope_max_seqs=2)
    kc, vc = batch.k_cache.clone(), batch.v_cache.clone()
    got = attn.project_and_attend(positions, qkv, hidden, (kc, vc), md, backend)
    assert calls == [t]
    kc_want, vc_want = batch.k_cache.clone(), batch.v_cache.clone()
    q, k, v = qkv(hidden).split([qkv.q_size, qkv.kv_size, qkv.kv_size], dim=-1)
    want = attn.forward(positions, q, k, v, (kc_want, vc_want), md, backend)
    assert calls == [t]
    assert not torch.equal(kc, batch.k_cache)  # written
    assert torch.equal(kc, kc_want) and torch.equal(vc, vc_want)
    n = batch.metadata.num_tokens  # padding rows are unspecified
    assert got.shape == want.shape and torch.equal(got[:n], want[:n])


def test_other_steps_keep_the_unfused_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not taken: on CPU, on a step the backend fuses into attention, on a mixed step, with a
    backend that takes no rotary, or where the GEMM reduces inline (a tensor comes back); taken
    on a decode-form-like step (``independent_rows`` False) of a size the backend would fuse."""
    calls = _spy(monkeypatch)
    qkv, attn = _layers("kernel", True, False, False)
    decode = make_batch([1, 1], [6, 9], HEADS, KV_HEADS, HEAD_DIM, dtype=BF16)
    mixed = make_batch([1, 3], [6, 9], HEADS, KV_HEADS, HEAD_DIM, dtype=BF16)
    triton_backend = TritonAttentionBackend(num_sms=4, decode_rope_max_seqs=2)
    gen = torch.Generator().manual_seed(1)

    def run(
        batch: PagedBatch, md: AttentionMetadata, backend: AttentionBackend, layer: QKVParallelLinear = qkv
    ) -> None:
        t = md.num_tokens
        hidden = torch.randn(t, HIDDEN, generator=gen).to(BF16)
        positions = torch.tensor([5, 8] if t == 2 else [5, 6, 7, 8])
        kv = (batch.k_cache.clone(), batch.v_cache.clone())
        attn.project_and_attend(positions, layer, hidden, kv, md, backend)

    run(decode, decode.metadata, triton_backend)  # CPU: the gate is closed
    assert calls == []
    monkeypatch.setattr(attention_module, "_is_cuda", lambda t: True)
    run(decode, replace(decode.metadata, independent_rows=True), triton_backend)
    assert calls == []  # the backend does the rotary inside its decode kernel
    run(mixed, mixed.metadata, triton_backend)
    assert calls == []
    run(decode, decode.metadata, TorchAttentionBackend())
    assert calls == []
    inline, _ = _layers("inline", True, False, False)
    run(decode, decode.metadata, triton_backend, inline)
    assert calls == []
    run(decode, decode.metadata, triton_backend)  # independent_rows False (decode form, graphs)
    assert calls == [2]


def test_column_parallel_partials_only_where_the_gemm_would_reduce() -> None:
    """``forward_partials``: partials on a ``"kernel"`` split-K step, the forward's tensor on an
    inline one and for an unquantized layer."""
    x = torch.randn(3, HIDDEN).to(BF16)
    kernel, _ = _layers("kernel", False, True, False)
    inline, _ = _layers("inline", False, True, False)
    p = kernel.forward_partials(x)
    assert isinstance(p, SplitKPartials) and p.partials.shape == (2, 3, kernel.out_features_local)
    assert p.bias is kernel.bias
    assert torch.equal(inline.forward_partials(x), inline(x))  # type: ignore[arg-type]
    plain = QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, KV_HEADS, dtype=BF16)
    torch.nn.init.normal_(plain.weight)
    assert torch.equal(plain.forward_partials(x), plain(x))  # type: ignore[arg-type]


_TINY: dict[str, dict[str, Any]] = {
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 32},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"},
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
}


def _tiny_fp8_model(tmp_path: Path, kind: str) -> tuple[torch.nn.Module, ModelConfig]:
    """A 2-layer FP8 model whose every linear runs the split-K GEMM's Triton kernels (here under
    the interpreter) with ``"kernel"`` reductions, w8a8 on even token counts."""
    config = {
        **_TINY[kind],
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    mc = ModelConfig.from_pretrained(
        tmp_path, dtype="bfloat16", load_format="dummy", max_model_len=256, quantization="fp8"
    )
    model = load_model(mc, "cpu")
    gen = torch.Generator().manual_seed(1)
    for name, param in model.named_parameters():  # biases and norm weights away from 0 / 1
        if name.endswith("bias") or "norm" in name:
            param.data.add_((torch.randn(param.shape, generator=gen) * 0.2).to(param.dtype))
    for layer in model.modules():
        if isinstance(layer, _LinearBase):
            method = layer.quant_method
            assert isinstance(method, fp8_linear.Fp8LinearMethod)
            method.emulate = False
            method.splitk_by_m = tuple(
                Fp8SplitKConfig(16, 32, 32, 2, 2, 4, a8=m % 2 == 0, reduce="kernel")
                for m in range(fp8_linear.SPLITK_MAX_M + 1)
            )
    return model, mc


@pytest.mark.parametrize("kind", list(_TINY))
@pytest.mark.parametrize("num_seqs", [3, 4])
def test_tiny_fp8_model_decode_step_identical_with_and_without_the_fusion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, num_seqs: int
) -> None:
    """Qwen3 (q/k norm), Qwen2 (qkv bias) and Llama: a decode step on the Triton backend runs
    every layer's qkv through the fused kernel, and its logits and caches equal those of the
    same step with the fusion off (the GEMM's reduce kernel, then the K/V write kernel)."""
    monkeypatch.setattr(attention_module, "_is_cuda", lambda t: True)
    calls = _spy(monkeypatch)
    model, mc = _tiny_fp8_model(tmp_path, kind)
    seq_lens = [5, 19, 3, 40][:num_seqs]
    batch = make_batch([1] * num_seqs, seq_lens, 4, 2, mc.head_dim, dtype=BF16, seed=num_seqs)
    caches = [(batch.k_cache.clone(), batch.v_cache.clone()) for _ in range(mc.num_hidden_layers)]
    ids = torch.tensor([(11 * i + 3) % mc.vocab_size for i in range(num_seqs)])
    positions = torch.tensor([s - 1 for s in seq_lens])
    backend = TritonAttentionBackend(num_sms=4, decode_rope_max_seqs=2)
    with torch.inference_mode():
        on = model.compute_logits(model(ids, positions, caches, batch.metadata, backend))
        assert calls == [num_seqs] * mc.num_hidden_layers
        monkeypatch.setattr(Attention, "fuses_qkv_reduce", lambda *a: False)
        off_caches = [(batch.k_cache.clone(), batch.v_cache.clone()) for _ in range(mc.num_hidden_layers)]
        off = model.compute_logits(model(ids, positions, off_caches, batch.metadata, backend))
    assert calls == [num_seqs] * mc.num_hidden_layers
    assert torch.isfinite(on).all() and torch.equal(on, off)
    for (k_on, v_on), (k_off, v_off) in zip(caches, off_caches, strict=True):
        assert torch.equal(k_on, k_off) and torch.equal(v_on, v_off)
