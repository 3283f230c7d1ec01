"""Start-up checks of the Triton backend's decode fusions on the device that will run them.

Two fusions of FP8 decode steps replace a pair of kernels by one launch and promise the pair's
values: the qkv split-K reduce inside the q/k norm + rotary + K/V write
(:func:`surge.kernels.qkv_rope_kv_write.qkv_rope_kv_write`) and the attention output quantized
per token inside decode attention (``quant_out`` of
:func:`surge.kernels.paged_attention.paged_attention`, whose last arriving KV head quantizes the
row). Both were written and tested under the CPU interpreter; on a GPU they depend on the
compiler and, for the second, on GPU-scope atomics between programs. So that a GPU (or a Triton
version) on which either one does not compile or does not agree with its unfused pair serves
correct results anyway, :class:`surge.layers.triton_attention.TritonAttentionBackend` runs these
checks once when it reserves its counters (before any CUDA graph is captured) and turns off a
fusion whose check fails, with a log line saying why, as the stream kernel's start-up self-test
does (:mod:`surge.kernels.stream_decode`).

Each check runs both paths on small random inputs (8 query heads over 2 KV heads of 128, bf16)
and compares the values with a tolerance of a few bf16 roundings (on a GPU the two paths may
round a sum in another order; a race or a wrong index gives values far outside it).
"""

from __future__ import annotations

import torch

from surge.quant.fp8 import SplitKPartials, splitk_reduce_reference

_HEADS, _KV_HEADS, _HEAD_DIM = 8, 2, 128
_TOL = 3e-2
"""Absolute and relative tolerance of the comparisons (bf16 carries 8 significant bits)."""


def _mismatch(name: str, got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None when ``got`` equals ``want`` within :data:`_TOL`, else what differs."""
    g, w = got.float().cpu(), want.float().cpu()
    if g.shape != w.shape:
        return f"{name}: shape {tuple(g.shape)} against {tuple(w.shape)}"
    if not torch.isfinite(g).all():
        return f"{name}: non-finite values"
    bad = (g - w).abs() > _TOL + _TOL * w.abs()
    if bool(bad.any()):
        worst = float((g - w).abs().max())
        return f"{name}: {int(bad.sum())} of {bad.numel()} values differ (largest difference {worst:.3g})"
    return None


def check_qkv_rope_kv_write(device: torch.device | str) -> str | None:
    """Run the fused qkv reduce + q/k norm + rotary + K/V write against the reduce followed by
    :func:`surge.kernels.kv_write.fused_qk_norm_rope_kv_write` on ``device`` (16 tokens, two
    split-K slices, w8a8 token scales, Qwen3's q/k norms, a bf16 cache, a padding slot).

    Returns:
        None when q, k, v and the cache agree; otherwise one line saying what did not (also when
        a kernel fails to compile or launch).
    """
    from surge.kernels.kv_write import fused_qk_norm_rope_kv_write
    from surge.kernels.qkv_rope_kv_write import qkv_rope_kv_write

    gen = torch.Generator().manual_seed(0)
    t, d = 16, _HEAD_DIM
    n = (_HEADS + 2 * _KV_HEADS) * d
    p = SplitKPartials(
        partials=torch.randn(2, t, n, generator=gen).to(device),
        weight_scale=(torch.rand(n, generator=gen) + 0.5).to(device),
        token_scale=(torch.rand(t, 1, generator=gen) + 0.5).to(device),
        bias=None,
        dtype=torch.bfloat16,
    )
    positions = torch.randint(0, 64, (t,), generator=gen).to(device)
    cos = torch.rand(64, d // 2, generator=gen).mul(2).sub(1).to(device)
    sin = torch.rand(64, d // 2, generator=gen).mul(2).sub(1).to(device)
    qn = (torch.rand(d, generator=gen) + 0.5).to(torch.bfloat16).to(device)
    kn = (torch.rand(d, generator=gen) + 0.5).to(torch.bfloat16).to(device)
    slots = torch.arange(t, dtype=torch.int64)
    slots[5] = -1
    slots = slots.to(device)
    caches = [torch.zeros(2, 16, _KV_HEADS, d, dtype=torch.bfloat16, device=device) for _ in range(4)]
    try:
        fused = qkv_rope_kv_write(
            p, _HEADS, _KV_HEADS, d, positions, cos, sin, caches[0], caches[1], slots, qn, kn, 1e-6
        )
        ref = splitk_reduce_reference(p)
        q, k, v = (x.clone() for x in ref.split([_HEADS * d, _KV_HEADS * d, _KV_HEADS * d], dim=-1))
        q, k, v = q.view(t, _HEADS, d), k.view(t, _KV_HEADS, d), v.view(t, _KV_HEADS, d)
        fused_qk_norm_rope_kv_write(q, k, v, positions, cos, sin, caches[2], caches[3], slots, qn, kn, 1e-6)
    except Exception as e:  # noqa: BLE001 (any failure to compile or run turns the fusion off)
        return f"the fused qkv reduce failed to run: {type(e).__name__}: {e}"
    want = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
    return (
        _mismatch("q/k/v", fused, want)
        or _mismatch("K cache", caches[0], caches[2])
        or _mismatch("V cache", caches[1], caches[3])
    )


def check_quantized_decode_output(
    device: torch.device | str, split_counters: torch.Tensor | None, token_counters: torch.Tensor
) -> str | None:
    """Run decode attention with its output quantized in the launch (``quant_out``) against
    :func:`surge.kernels.fp8_quant.per_token_quant_fp8` of its bf16 output on ``device``: four
    sequences (contexts 40, 17, 600 and 5 tokens; the 600-token one in several KV splits when
    ``split_counters`` is given, merged in the launch), twice on the same counters (the last
    arriver sets them back to zero). ``token_counters`` (and ``split_counters``) are the
    backend's reserved, zeroed counters; they are zero again afterwards when the fusion works.

    Returns:
        None when the dequantized rows agree; otherwise one line saying what did not.
    """
    from surge.kernels.fp8_quant import per_token_quant_fp8
    from surge.kernels.paged_attention import OutputQuant, paged_attention

    gen = torch.Generator().manual_seed(1)
    d, block = _HEAD_DIM, 16
    lens = [40, 17, 600, 5]
    num_seqs = len(lens)
    blocks_per_seq = -(-max(lens) // block)
    kc = (
        torch.randn(num_seqs * blocks_per_seq, block, _KV_HEADS, d, generator=gen)
        .to(torch.bfloat16)
        .to(device)
    )
    vc = (
        torch.randn(num_seqs * blocks_per_seq, block, _KV_HEADS, d, generator=gen)
        .to(torch.bfloat16)
        .to(device)
    )
    q = torch.randn(num_seqs, _HEADS, d, generator=gen).to(torch.bfloat16).to(device)
    table = (
        torch.arange(num_seqs * blocks_per_seq, dtype=torch.int32).view(num_seqs, blocks_per_seq).to(device)
    )
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    qsl = torch.arange(num_seqs + 1, dtype=torch.int32, device=device)
    splits = 4 if split_counters is not None else 1
    args = (q, kc, vc, qsl, seq_lens, table, d**-0.5)
    try:
        ref = paged_attention(*args, num_splits=splits, max_query_len=1, split_counters=split_counters)
        want_q, want_s = per_token_quant_fp8(ref.reshape(num_seqs, -1))
        want = want_q.float() * want_s
        for attempt in range(2):
            quant = OutputQuant(
                torch.empty(num_seqs, _HEADS * d, dtype=torch.float8_e4m3fn, device=device),
                torch.empty(num_seqs, 1, dtype=torch.float32, device=device),
                token_counters,
            )
            paged_attention(
                *args, num_splits=splits, max_query_len=1, split_counters=split_counters, quant_out=quant
            )
            why = _mismatch(
                f"quantized output (launch {attempt + 1})", quant.data.float() * quant.scale, want
            )
            if why is not None:
                return why
    except Exception as e:  # noqa: BLE001 (any failure to compile or run turns the fusion off)
        return f"decode attention with a quantized output failed to run: {type(e).__name__}: {e}"
    if bool(token_counters[:num_seqs].any()):
        return "the per-sequence counters were not set back to zero"
    return None
