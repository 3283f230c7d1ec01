"""The attention output quantized per token inside decode attention (``quant_out``), on a GPU at
Qwen3-8B's shapes (32 query heads, 8 KV heads, head size 128) and the o projection's w8a8 step
sizes (32 and 64 tokens): the Triton backend's ``quantize_out`` against its unfused output then
:func:`surge.kernels.fp8_quant.per_token_quant_fp8`, bit for bit, over bf16 and FP8 caches, with
the split count a decode graph captured for a 4096-token ``max_model_len`` uses, padding rows
included; and a captured CUDA graph replayed on the same counters.

Run on a GPU host: ``PYTHONPATH=. python3 -m pytest -p no:cacheprovider -o timeout=0 -m gpu
tests/kernels/test_paged_attention_fp8_out_gpu.py``
"""

from __future__ import annotations

import pytest
import torch

from surge.kernels.fp8_quant import per_token_quant_fp8
from surge.layers.torch_attention import write_kv_cache as torch_write_kv_cache
from surge.layers.triton_attention import TritonAttentionBackend
from surge.quant.fp8 import Fp8Activations, quantize_kv
from tests.kernels.attn_utils import PagedBatch, make_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
MAX_MODEL_LEN = 4096


def _batch(t: int, context: int, real: int, fp8_cache: bool) -> tuple[PagedBatch, float, float]:
    """A decode bucket of ``t`` sequences, ``real`` of them with a token over ``context``-ish
    contexts (a few lengths around it), the rest padding."""
    seq_lens = [max(1, context - 7 * (i % 5)) for i in range(real)] + [0] * (t - real)
    q_lens = [1] * real + [0] * (t - real)
    batch = make_batch(
        q_lens,
        seq_lens,
        HEADS,
        KV_HEADS,
        HEAD_DIM,
        dtype=torch.bfloat16,
        device="cuda",
        num_pad_tokens=t - real,
    )
    md = batch.metadata
    md.max_seq_len = MAX_MODEL_LEN  # as a decode graph is captured
    torch_write_kv_cache(batch.k, batch.v, batch.k_cache, batch.v_cache, md.slot_mapping)
    if not fp8_cache:
        return batch, 1.0, 1.0
    ks, vs = 0.02, 0.015
    batch.k_cache = quantize_kv(batch.k_cache, ks)
    batch.v_cache = quantize_kv(batch.v_cache, vs)
    return batch, ks, vs


def _check(batch: PagedBatch, want: torch.Tensor, got: Fp8Activations) -> None:
    n, (h, d) = batch.metadata.num_tokens, batch.q.shape[1:]
    want_q, want_s = per_token_quant_fp8(want[:n].reshape(n, h * d))
    assert torch.equal(got.data[:n].view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(got.scale[:n], want_s)
    assert torch.all(got.data[n:].view(torch.uint8) == 0)
    zero_s = per_token_quant_fp8(torch.zeros(1, h * d, dtype=torch.bfloat16, device="cuda"))[1]
    assert torch.all(got.scale[n:] == zero_s)


@pytest.mark.parametrize("fp8_cache", [False, True])
@pytest.mark.parametrize("context", [40, 1000])
@pytest.mark.parametrize("t,real", [(32, 32), (32, 29), (64, 64), (64, 61)])
def test_gpu_quantized_output_bit_for_bit(t: int, real: int, context: int, fp8_cache: bool) -> None:
    batch, ks, vs = _batch(t, context, real, fp8_cache)
    md = batch.metadata
    backend = TritonAttentionBackend()
    backend.reserve(64, KV_HEADS, torch.device("cuda"))
    assert backend.quantizes_output(batch.q, batch.k_cache, md)
    args = (batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache, md, HEAD_DIM**-0.5, False, ks, vs)
    want = backend.forward(*args)
    assert isinstance(want, torch.Tensor)
    for _ in range(3):  # the counters are reset by each launch
        got = backend.forward(*args, quantize_out=True)
        assert isinstance(got, Fp8Activations)
        _check(batch, want, got)
    assert backend._token_counters is not None and torch.all(backend._token_counters == 0)


@pytest.mark.parametrize("t", [32, 64])
def test_gpu_quantized_output_in_a_cuda_graph(t: int) -> None:
    """Captured once, replayed with new queries: each replay's bits equal the unfused path's."""
    batch, ks, vs = _batch(t, 1000, t - 3, fp8_cache=False)
    md = batch.metadata
    backend = TritonAttentionBackend()
    backend.reserve(64, KV_HEADS, torch.device("cuda"))
    args = (batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache, md, HEAD_DIM**-0.5, False, ks, vs)
    backend.forward(*args, quantize_out=True)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = backend.forward(*args, quantize_out=True)
    assert isinstance(got, Fp8Activations)
    gen = torch.Generator(device="cuda").manual_seed(9)
    for _ in range(3):
        batch.q.copy_(torch.randn(batch.q.shape, generator=gen, device="cuda").to(batch.q.dtype))
        graph.replay()
        torch.cuda.synchronize()
        want = backend.forward(*args)
        assert isinstance(want, torch.Tensor)
        _check(batch, want, got)
