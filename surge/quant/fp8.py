"""FP8 (e4m3) quantize / dequantize in plain torch: the reference of every FP8 kernel.

A *scale* here is always the dequantization multiplier: ``x ~= x_fp8.float() * scale``
(checkpoints call the block-wise one ``weight_scale_inv``, after DeepSeek-V3's convention, and
the per-tensor one ``weight_scale``; both multiply). Quantization divides by it, clamps to
``±448`` (torch's cast does not saturate) and rounds to nearest even in the cast. Scales are
``amax / 448`` of the row, block or tensor (floored at :data:`MIN_FP8_SCALE`), as in
Micikevicius et al., "FP8 Formats for Deep Learning" (2022), and vLLM's dynamic FP8.

These functions run on any device; on CPU they are also the FP8 *emulation* path of tests
(``fp8_emulation=True``): quantize, then compute on the dequantized values in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from surge.quant.config import FP8_E4M3_MAX, MIN_FP8_SCALE

FP8_DTYPE = torch.float8_e4m3fn


@dataclass(frozen=True, slots=True)
class Fp8Activations:
    """Activations already quantized per token, handed from the kernel that produced them
    (:class:`surge.layers.norm.RMSNorm`, :class:`surge.layers.activation.SiluAndMul`) to the
    w8a8 FP8 linear layer that consumes them, so the GEMM skips its own quantization launch.

    Attributes:
        data: ``[T, K]`` float8_e4m3fn.
        scale: ``[T, 1]`` float32 dequantization multipliers (:func:`quantize_per_token`'s).
        dtype: the dtype the activations had before quantization: the GEMM's output dtype.
    """

    data: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype


@dataclass(frozen=True, slots=True)
class SplitKPartials:
    """The unreduced output of a split-K FP8 GEMM whose config sums its partials with a second
    launch (``reduce == "kernel"``, see :mod:`surge.kernels.fp8_gemm_splitk`), handed to the
    residual-add + RMSNorm that consumes that output, which does the reduction in its own kernel
    (:func:`surge.kernels.add_rmsnorm.add_rmsnorm_partials`) and saves the reduce launch. Only a
    :class:`surge.layers.linear.RowParallelLinear` whose output an
    :class:`surge.layers.norm.RMSNorm` declared it consumes
    (:meth:`~surge.layers.norm.RMSNorm.sums_partials_of`) returns one.

    The output it stands for is :func:`splitk_reduce_reference`'s: ``y [M, N] = (sum_s
    partials[s]) * weight_scale * token_scale + bias``, summed in the order ``s = 0 .. S - 1``
    in float32 and rounded once to ``dtype``, as the reduce kernel computes it.

    Attributes:
        partials: ``[S, M, N]`` float32, contiguous, ``S >= 2``: the split-K slices' products.
        weight_scale: ``[N]`` float32 per-channel dequantization multipliers, or None when the
            GEMM applied block scales per ``K`` step already.
        token_scale: ``[M, 1]`` float32 per-token activation scales (w8a8), or None (w8a16).
        bias: ``[N]`` in ``dtype``, or None.
        dtype: the GEMM's output dtype (the activations' dtype).
    """

    partials: torch.Tensor
    weight_scale: torch.Tensor | None
    token_scale: torch.Tensor | None
    bias: torch.Tensor | None
    dtype: torch.dtype


def splitk_reduce_reference(p: SplitKPartials) -> torch.Tensor:
    """The ``[M, N]`` tensor of ``p.dtype`` that the split-K reduce kernel would have written:
    the partials summed in float32 in slice order, times the weight scales, times the token
    scales, plus the bias (each a separate float32 rounding), rounded to ``p.dtype``."""
    acc = p.partials[0].clone()
    for s in range(1, p.partials.shape[0]):
        acc += p.partials[s]
    if p.weight_scale is not None:
        acc = acc * p.weight_scale.float()
    if p.token_scale is not None:
        acc = acc * p.token_scale.float().reshape(-1, 1)
    if p.bias is not None:
        acc = acc + p.bias.float()
    return acc.to(p.dtype)


def _scale_of(amax: torch.Tensor) -> torch.Tensor:
    """``max(amax / 448, 1e-12)`` with an IEEE-rounded division on every device, as the Triton
    kernels compute it (``div_rn``). A Python-number divisor would not do: on CUDA, torch
    divides a tensor by a scalar as a multiplication by its reciprocal, which differs from the
    quotient in the last bit for some values."""
    return (amax / amax.new_full((), FP8_E4M3_MAX)).clamp_(min=MIN_FP8_SCALE)


def _to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_DTYPE)


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per output row: ``weight [N, K] -> (fp8 [N, K], scale [N] float32)``."""
    amax = weight.float().abs().amax(dim=1)
    scale = _scale_of(amax)
    return _to_fp8(weight, scale[:, None]), scale


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic activation quantization, one scale per row: ``x [M, K] -> (fp8 [M, K], scale
    [M, 1] float32)`` (the layout ``torch._scaled_mm``'s row-wise scaling takes)."""
    amax = x.float().abs().amax(dim=1, keepdim=True)
    scale = _scale_of(amax)
    return _to_fp8(x, scale), scale


def quantize_per_token_group(x: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic activation quantization, one scale per row and ``group`` consecutive columns:
    ``x [M, K] -> (fp8 [M, K], scale [M, K / group] float32)`` (cuBLAS's ``BlockWise1x128``
    activation scaling for ``group`` 128; the reference of
    :func:`surge.kernels.fp8_group_quant.per_token_group_quant_fp8`, which pads the rows and lays
    the scales out outer-dim-major, the values being these).

    Raises:
        ValueError: ``group < 1``, ``x`` not 2-D, or ``K`` not a multiple of ``group``.
    """
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    if x.dim() != 2 or x.shape[1] % group:
        raise ValueError(f"x must be [M, K] with K a multiple of {group}, got {tuple(x.shape)}")
    m, k = x.shape
    xg = x.float().view(m, k // group, group)
    scale = _scale_of(xg.abs().amax(dim=2))
    return _to_fp8(xg, scale[:, :, None]).view(m, k), scale


def dequantize_per_token_group(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q [M, K]`` fp8 times its group scales ``[M, K / group]`` (any strides), in float32.

    Raises:
        ValueError: ``q`` or ``scale`` not 2-D, their row counts differ, or ``K`` not a multiple
            of ``scale``'s column count.
    """
    if q.dim() != 2 or scale.dim() != 2 or scale.shape[0] != q.shape[0] or not scale.shape[1]:
        raise ValueError(f"need q [M, K] and scale [M, G], got {tuple(q.shape)} and {tuple(scale.shape)}")
    m, k = q.shape
    groups = scale.shape[1]
    if k % groups:
        raise ValueError(f"q's K ({k}) is not a multiple of the {groups} scale groups")
    return (q.float().reshape(m, groups, k // groups) * scale.float()[:, :, None]).reshape(m, k)


def quantize_per_tensor(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale for the whole tensor: ``-> (fp8, scale [] float32)``."""
    amax = weight.float().abs().amax()
    scale = _scale_of(amax)
    return _to_fp8(weight, scale), scale


def quantize_block(weight: torch.Tensor, block_size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-wise scales: ``weight [N, K] -> (fp8 [N, K], scale [cdiv(N, bn), cdiv(K, bk)])``.

    Each ``bn x bk`` tile (the last ones may be partial) has its own scale, as in the
    ``weight_scale_inv`` tensors of Qwen's and DeepSeek's FP8 checkpoints.
    """
    bn, bk = block_size
    n, k = weight.shape
    nb, kb = -(-n // bn), -(-k // bk)
    padded = torch.zeros(nb * bn, kb * bk, dtype=torch.float32, device=weight.device)
    padded[:n, :k] = weight.float()
    tiles = padded.view(nb, bn, kb, bk)
    scale = _scale_of(tiles.abs().amax(dim=(1, 3)))
    q = _to_fp8(tiles, scale[:, None, :, None]).view(nb * bn, kb * bk)[:n, :k].contiguous()
    return q, scale


def expand_block_scale(
    scale: torch.Tensor, shape: tuple[int, int], block_size: tuple[int, int]
) -> torch.Tensor:
    """Block scales ``[cdiv(N, bn), cdiv(K, bk)]`` as one scale per element ``[N, K]``."""
    n, k = shape
    bn, bk = block_size
    return scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]


def dequantize(
    q: torch.Tensor, scale: torch.Tensor, block_size: tuple[int, int] | None = None
) -> torch.Tensor:
    """``q.float() * scale`` in float32.

    Args:
        q: fp8 ``[N, K]`` (or any shape for a broadcastable ``scale``).
        scale: ``[N]`` per row, ``[M, 1]`` per token, ``[]`` per tensor, or
            ``[cdiv(N, bn), cdiv(K, bk)]`` with ``block_size``.
        block_size: ``(bn, bk)`` for block scales, else None.
    """
    if block_size is not None:
        return q.float() * expand_block_scale(scale.float(), tuple(q.shape), block_size)  # type: ignore[arg-type]
    s = scale.float()
    if s.dim() == 1 and q.dim() == 2:
        s = s[:, None]
    return q.float() * s


def fp8_linear_reference(
    x: torch.Tensor | Fp8Activations,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    block_size: tuple[int, int] | None = None,
    quantize_input: bool = True,
    input_group: int | None = None,
) -> torch.Tensor:
    """An FP8 linear layer in float32 torch: ``x [M, K] -> [M, N]`` in ``x``'s dtype.

    With ``quantize_input`` the activations are quantized per token first (the w8a8 GEMM of
    ``torch._scaled_mm``), or per token and ``input_group`` columns with ``input_group``
    (cuBLAS's block-scaled GEMM, ``BlockWise1x128``); without it they stay in their dtype (the
    weight-only kernel of :mod:`surge.kernels.fp8_gemm`). Then ``dequant(x) @
    dequant(weight)^T (+ bias)``. :class:`Fp8Activations` are already quantized: they are
    dequantized as they are (``quantize_input`` is ignored) and the result has their ``dtype``.

    Args:
        weight: fp8 ``[N, K]``; scale: ``[N]`` or block scales (with ``block_size``).
        input_group: columns per activation scale, a divisor of ``K``; None: one per token.
    """
    if isinstance(x, Fp8Activations):
        xf, dtype = dequantize(x.data, x.scale), x.dtype
    else:
        if not quantize_input:
            xf = x.float()
        elif input_group is not None:
            xf = dequantize_per_token_group(*quantize_per_token_group(x, input_group))
        else:
            xf = dequantize(*quantize_per_token(x))
        dtype = x.dtype
    out = xf @ dequantize(weight, scale, block_size).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(dtype)


def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """K or V rows to the FP8 cache: ``(x.float() * (1 / scale)).clamp(±448)`` in e4m3."""
    return (x.float() * (1.0 / scale)).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_DTYPE)
