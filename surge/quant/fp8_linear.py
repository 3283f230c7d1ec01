"""The FP8 linear method that :mod:`surge.layers.linear` delegates to when a layer is quantized.

One :class:`Fp8LinearMethod` per layer. It (1) for an FP8 checkpoint, swaps the layer's weight
for an e4m3 parameter and adds the checkpoint's scale parameter before loading, (2) after
loading, quantizes a bf16 weight (online mode, dummy weights) or puts the loaded scales in
their kernel layout, and (3) runs the GEMM:

* per-channel scales (online quantization, per-tensor checkpoints), on CUDA:
  ``torch._scaled_mm`` (cuBLASLt FP8, row-wise scales: activations quantized per token by
  :func:`surge.kernels.fp8_quant.per_token_quant_fp8` into ``a_scale [M, 1]``, the weight
  ``[N, K]`` passed transposed, i.e. column-major, with ``b_scale [1, N]``), except:
  decode steps (``M <= SPLITK_MAX_M``) of the weight shapes and token counts in
  :data:`SPLITK_MEASURED` (:func:`splitk_configs`), which run the split-K FP8 GEMM of
  :mod:`surge.kernels.fp8_gemm_splitk` with the measured config; decode steps
  (``M <= SKINNY_MAX_M``) of the weight shapes in :data:`TRITON_FASTER`, and shapes
  ``_scaled_mm`` cannot take (a dim not a multiple of 16, a non-bf16 model), which run the
  weight-only Triton kernel of :mod:`surge.kernels.fp8_gemm`;
* block-wise scales (FP8 checkpoints with ``weight_block_size``): the split-K FP8 GEMM with
  its block scales: decode steps (``M <= SPLITK_MAX_M``) of the weight shapes in
  :data:`SPLITK_BLOCK_FASTER` with :func:`block_splitk_config`'s tiles (w8a8 from
  :data:`BLOCK_SPLITK_A8_FROM` tokens, else w8a16), larger steps with
  :data:`BLOCK_PREFILL_TILES` (w8a8, one ``K`` slice), or, for 128 x 128 blocks of a shape
  cuBLAS takes (:func:`block_scaled_mm_eligible`) where the start-up probe
  (:func:`block_scaled_mm_probe`) passed on the device, cuBLAS's block-scaled GEMM
  (:func:`block_scaled_mm_linear`: activations quantized per token and 128-column group);
  the weight-only Triton kernel with its block scales where none applies (other shapes'
  decode steps, non-bf16 models);
* on CPU (``emulate``, tests only): :func:`surge.quant.fp8.fp8_linear_reference`, i.e.
  dequantize then matmul in float32, activations quantized per token exactly when the CUDA
  path does (:meth:`weight_only`), per token and 128-column group where the CUDA path would
  take cuBLAS's block-scaled GEMM by shape and step size (:meth:`block_scaled_mm_step`; the
  probe is not consulted: on a GPU whose probe failed, those steps run per-token Triton and
  differ from the emulation by the activation scales' granularity).

Pre-quantized activations: when a step's path is w8a8 (:meth:`Fp8LinearMethod.wants_fp8_input`),
the kernel that produces this layer's input (RMSNorm, SiLU-and-mul, see
:meth:`surge.layers.linear._LinearBase.wants_fp8_input`) may quantize per token in its own
epilogue and pass :class:`surge.quant.fp8.Fp8Activations`; :meth:`Fp8LinearMethod.apply` then
runs the same w8a8 GEMM on them without a quantization launch of its own.

Deferred split-K reduction: a row-parallel layer whose output an RMSNorm reduces
(:meth:`surge.layers.norm.RMSNorm.sums_partials_of`, TP=1) calls
:meth:`Fp8LinearMethod.apply_partials`, which returns the split-K GEMM's partials
(:class:`surge.quant.fp8.SplitKPartials`) on the steps whose config would sum them with a
second launch (``split_k > 1``, ``reduce == "kernel"``); the norm's kernel sums them instead.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from surge.quant.config import FP8_ACT_GROUP, Fp8Config
from surge.quant.fp8 import (
    FP8_DTYPE,
    Fp8Activations,
    SplitKPartials,
    fp8_linear_reference,
    quantize_block,
    quantize_per_channel,
)

if TYPE_CHECKING:
    from surge.kernels.fp8_gemm_splitk import Fp8SplitKConfig, SplitKWorkspace
    from surge.layers.linear import _LinearBase

logger = logging.getLogger("surge.quant")

SKINNY_MAX_M = 16
"""Largest token count that may take the Triton kernel instead of ``_scaled_mm``."""

TRITON_FASTER: frozenset[tuple[int, int]] = frozenset()
"""Weight shapes ``(N, K)`` where the weight-only Triton FP8 GEMM beat per-token quantization +
``torch._scaled_mm`` for 1..16 tokens on the H200. Empty until measured: run
``benchmarks/fp8_gemm_bench.py`` on the GPU, which prints this table's new value with the
timings behind it."""


SPLITK_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
"""Token counts the split-K table is measured at (see :func:`splitk_configs` for the steps in
between and the buckets not measured)."""
SPLITK_MAX_M = SPLITK_BUCKETS[-1]

SplitKTiles = (
    tuple[int, int, int, int, int, int, bool, str] | tuple[int, int, int, int, int, int, bool, str, bool]
)
"""The fields of :class:`surge.kernels.fp8_gemm_splitk.Fp8SplitKConfig` in order: ``(block_m,
block_n, block_k, split_k, num_stages, num_warps, a8, reduce[, tma])`` (a plain tuple: this
module must not import a Triton kernel at import time); ``reduce`` is ``"kernel"`` (a second
launch sums the split-K partials) or ``"inline"`` (the last program of each tile does); the
optional ``tma`` (False when absent, as in the tables written before it existed) loads the
weight tiles through a Hopper TMA descriptor."""

SPLITK_MEASURED: dict[tuple[int, int], dict[int, SplitKTiles | None]] = {
    (6144, 4096): {  # qkv; us: bf16 / quant+_scaled_mm / chosen
        1: (16, 32, 128, 4, 4, 4, True, "inline", False),  # 15.6 / 21.4 / 11.4
        2: (16, 64, 128, 4, 4, 4, True, "inline", False),  # 16.4 / 21.3 / 11.2
        4: (16, 64, 128, 4, 4, 4, True, "inline", False),  # 16.1 / 21.4 / 12.0
        8: (16, 64, 128, 4, 4, 4, True, "inline", False),  # 15.9 / 20.8 / 12.0
        16: (16, 64, 128, 4, 4, 4, True, "kernel", False),  # 16.0 / 21.1 / 12.3
        32: (32, 64, 128, 4, 4, 4, True, "kernel", False),  # 16.2 / 19.8 / 13.2
        64: (64, 32, 128, 2, 4, 4, True, "kernel", False),  # 16.5 / 17.5 / 13.8
    },
    (4096, 4096): {  # o; us: bf16 / quant+_scaled_mm / chosen (1..8: w8a16, see below)
        1: (16, 64, 128, 4, 4, 4, False, "kernel", False),  # 13.2 / 17.4 / 10.6
        2: (16, 64, 128, 4, 4, 4, False, "kernel", False),  # 13.1 / 17.3 / 10.5
        4: (16, 64, 128, 4, 4, 4, False, "kernel", False),  # 13.2 / 17.0 / 10.5
        8: (16, 64, 128, 4, 4, 4, False, "kernel", False),  # 13.3 / 17.4 / 10.5
        16: (16, 64, 128, 4, 4, 4, False, "kernel", False),  # 13.4 / 16.5 / 10.5
        32: (32, 64, 128, 4, 4, 4, True, "kernel", False),  # 13.9 / 16.5 / 11.1
        64: (64, 64, 128, 4, 4, 4, True, "kernel", False),  # 11.9 / 16.5 / 11.3
    },
    (24576, 4096): {  # gate_up; us: bf16 / quant+_scaled_mm / chosen
        1: (16, 64, 256, 1, 4, 4, True, "kernel", True),  # 51.0 / 46.5 / 28.7
        2: (16, 64, 256, 1, 4, 4, True, "kernel", True),  # 49.6 / 47.2 / 29.1
        4: (16, 64, 256, 1, 4, 4, True, "kernel", True),  # 49.6 / 44.2 / 29.2
        8: (16, 64, 256, 1, 4, 4, True, "kernel", True),  # 54.1 / 44.9 / 29.6
        16: (16, 64, 256, 1, 4, 4, True, "kernel", True),  # 50.2 / 44.5 / 29.8
        32: (32, 64, 128, 1, 4, 4, True, "kernel", False),  # 50.7 / 43.8 / 31.3
        64: (64, 64, 128, 1, 4, 4, True, "kernel", True),  # 51.7 / 42.9 / 31.0
    },
    (4096, 12288): {  # down; us: bf16 / quant+_scaled_mm / chosen
        1: (16, 64, 128, 8, 4, 4, False, "kernel", False),  # 30.5 / 43.6 / 21.5
        2: (16, 64, 128, 8, 4, 4, False, "kernel", False),  # 30.6 / 43.8 / 21.5
        4: (16, 64, 128, 8, 4, 4, False, "kernel", False),  # 30.4 / 42.9 / 21.5
        8: (16, 64, 128, 8, 4, 4, False, "kernel", False),  # 30.7 / 41.7 / 21.6
        16: (16, 64, 128, 8, 4, 4, False, "kernel", False),  # 29.1 / 40.0 / 21.6
        32: (32, 64, 512, 2, 4, 4, True, "inline", False),  # 30.1 / 39.2 / 23.6
        64: (64, 64, 128, 4, 4, 4, True, "kernel", False),  # 32.0 / 38.9 / 24.9
    },
}
"""Per weight shape ``(N, K)`` and measured token bucket ``M``: the split-K FP8 GEMM config
that beat per-token quantization + ``torch._scaled_mm`` by >= 3 % on the H200 (CUDA graphs,
weights not in L2), or None where ``_scaled_mm`` was as fast. Written by
``benchmarks/fp8_gemm_bench.py --sweep --m ... --json F`` then ``--emit F --write-source
surge/quant/fp8_linear.py`` (timings in the comments, microseconds; the runs in
``benchmarks/results/h200-qwen3-8b-fp8/``, whose README says which buckets each run swept). The
table now is the ``c6c7dec`` sweep's (``sweep-c6c7dec/``, 2026-12-01, H200, torch 2.11, Triton
3.6; M = 1, 2, 4, 8, 16, 32 and 64, every config also timed with TMA weight loads, the FP8 dots
promoting into fp32 every 128 products as they do now), except o at ``M`` = 1..8: there the sweep's
w8a8 winner (10.0-10.2 us) needs a per-token quantization launch of the attention output
before it, and its best w8a16 config (10.5-10.6 us, the one in the table, its reduction
deferred to the post-attention norm) made the whole decode step faster instead: 3.405 ->
3.377 ms at batch 1, 3.447 -> 3.423 ms at batch 4 (``benchmarks/decode_step_sweep.py``, H200,
``benchmarks/results/h200-qwen3-8b-fp8/step-sweep/``; re-emitting the table from a sweep
would put the w8a8 entries back)."""


def splitk_configs(n: int, k: int) -> tuple[Fp8SplitKConfig | None, ...]:
    """Index ``M`` (``0..SPLITK_MAX_M``) -> the split-K config for a ``[M, K] @ [N, K]^T``
    step, or None (take ``_scaled_mm``).

    A step of ``M`` tokens takes the entry of the smallest *measured* bucket ``>= M`` in
    :data:`SPLITK_MEASURED`: a bucket missing from the table was not swept, so the next larger
    measured one decides for it (its config is correct for any ``M``, and a decode GEMM this
    skinny costs about the same at every ``M`` up to its ``block_m``: 1 and 16 are within 1 us
    on the H200). Above the largest measured bucket, and for a shape not in the table,
    ``_scaled_mm``. Entries are 8-tuples (``tma`` False) or 9-tuples (see :data:`SplitKTiles`;
    shorter ones take :class:`~surge.kernels.fp8_gemm_splitk.Fp8SplitKConfig`'s defaults).
    """
    from surge.kernels.fp8_gemm_splitk import Fp8SplitKConfig

    measured = SPLITK_MEASURED.get((n, k), {})
    buckets = sorted(measured)
    by_m: list[Fp8SplitKConfig | None] = []
    for m in range(SPLITK_MAX_M + 1):
        b = next((b for b in buckets if b >= m), None)
        tiles = measured[b] if b is not None else None
        by_m.append(Fp8SplitKConfig(*tiles) if tiles is not None else None)
    return tuple(by_m)


SPLITK_BLOCK_FASTER: frozenset[tuple[int, int]] = frozenset(
    {(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)}
)
"""Weight shapes ``(N, K)`` of block-scaled FP8 checkpoints where the split-K FP8 GEMM with
block scales (:func:`block_splitk_config`, w8a8 as :data:`BLOCK_SPLITK_A8_FROM` sets it) beat the
weight-only Triton kernel at every measured ``M <= SPLITK_MAX_M`` on the H200: Qwen3-8B's four,
measured at M = 1, 4, 16, 32 and 64 (qkv 15.1 against 25.1 us at M = 1, 14.9 against 60.5 at
M = 64; gate_up 29.7 against 42.3 and 32.2 against 112.8; ``benchmarks/fp8_gemm_bench.py``, its
default mode, the ``fp8 split-K (block)`` rows, ``benchmarks/results/h200-qwen3-8b-fp8/session18/``).
The set assumes w8a8: w8a16 gate_up (45.0-46.2 us) lost to the weight-only kernel (41.8-42.3)
at M = 1..16."""

BLOCK_SPLITK_A8_FROM: int | None = 1
"""The smallest token count from which a block-scaled layer's split-K decode steps run w8a8
(activations quantized per token by the GEMM's launcher, block scales applied per ``K`` step)
instead of w8a16; None: w8a16 at every decode size. On the H200 w8a8 was faster for every
Qwen3-8B shape at every measured size, the quantization launch included (gate_up at M = 1:
29.7 against 45.1 us; down 23.7 against 24.3; ``benchmarks/fp8_gemm_bench.py``, the ``fp8
split-K (block)`` and ``... (block) a8`` rows)."""

BLOCK_PREFILL_TILES: SplitKTiles | None = (128, 128, 128, 1, 4, 8, True, "kernel", True)
"""The split-K config (one ``K`` slice, w8a8: activations quantized per token, block scales
applied per ``K`` step) of a block-scaled layer's steps of more than ``SPLITK_MAX_M`` tokens
(prefill and large mixed steps); None keeps the weight-only Triton kernel there, which converts
every weight tile to bf16 in registers and ran about 2.4-3x slower than bf16 cuBLAS on the H200
(gate_up at 8192 tokens: 5,712 us; this config 2,670; bf16 2,385; a whole 8192-token prefill
step 451.9 -> 240.6 ms). Measured with ``benchmarks/fp8_gemm_bench.py`` (the ``fp8 split-K
(block) a8 ...`` rows above ``M = 64``). cuBLAS's own block-scaled GEMM measured faster there as
a bare GEMM and replaces this config where it can (:func:`block_scaled_mm_eligible` and
:func:`block_scaled_mm_probe`; see ``docs/fp8.md``)."""

BLOCK_SCALED_MM_ROWS = 16
"""Row multiple that a step's activations are padded to for cuBLAS's block-scaled GEMM
(:func:`block_scaled_mm_linear`). On the H200 (torch 2.11, CUDA 13) it refused ``M`` = 1 (the
scale tensor's strides) and 17 (``CUBLAS_STATUS_NOT_SUPPORTED``) and ran ``M`` = 100, 128, 512,
2048 and 8192: the outer-dim-major activation scales need ``M`` in multiples of 4 (16-byte
aligned columns). 16 keeps every step on multiples of 16 (the GPU tests run 80, 112, 512 and
2048 rows) for at most 15 rows of extra work on steps of more than 64 tokens."""


def block_scaled_mm_eligible(n: int, k: int, block_size: tuple[int, int]) -> bool:
    """Whether a block-scaled ``[N, K]`` weight's shape fits cuBLAS's block-scaled GEMM: 128 x 128
    blocks, ``N`` a multiple of 128, ``K`` a multiple of 512 (torch 2.11 refuses a ``K / 128``
    that is not a multiple of 4: ``scale_b must have shape 4 x 2``, measured on the H200)."""
    return tuple(block_size) == (128, 128) and n % 128 == 0 and k % 512 == 0


def _scaled_mm_has_block_scaling() -> bool:
    """Whether this torch has ``torch.nn.functional.scaled_mm`` with 1 x 128 and 128 x 128 block
    scaling (torch >= 2.9)."""
    f = torch.nn.functional
    st = getattr(f, "ScalingType", None)
    return (
        hasattr(f, "scaled_mm")
        and st is not None
        and hasattr(st, "BlockWise1x128")
        and hasattr(st, "BlockWise128x128")
    )


def cublas_block_scaled_mm(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """cuBLAS's block-scaled FP8 GEMM, ``xq [M, K] @ weight [N, K]^T -> [M, N]`` of ``out_dtype``.

    Args:
        xq: float8_e4m3fn ``[M, K]`` contiguous, ``M`` a multiple of 4.
        x_scale: float32 ``[M, K / 128]`` outer-dim-major (strides ``(1, M)``), per token and
            128-column group (:func:`surge.kernels.fp8_group_quant.per_token_group_quant_fp8`).
        weight: float8_e4m3fn ``[N, K]`` contiguous (passed transposed: the column-major operand).
        weight_scale: float32 ``[N / 128, K / 128]`` contiguous block scales (passed transposed,
            ``[K / 128, N / 128]`` outer-dim-major).
        out_dtype: the output's dtype (bf16).

    Raises:
        whatever torch or cuBLAS raises for a shape or layout they do not take (see
        :data:`BLOCK_SCALED_MM_ROWS`, :func:`block_scaled_mm_eligible`).
    """
    f = torch.nn.functional
    st = f.ScalingType
    return f.scaled_mm(
        xq,
        weight.t(),
        x_scale,
        st.BlockWise1x128,
        weight_scale.t(),
        st.BlockWise128x128,
        output_dtype=out_dtype,
    )


def block_scaled_mm_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """A 128 x 128 block-scaled FP8 linear layer on cuBLAS: ``x [M, K] -> [M, N]`` in ``x``'s dtype.

    ``x`` is quantized per token and 128-column group into ``M`` rows padded to a multiple of
    :data:`BLOCK_SCALED_MM_ROWS` (zero rows), the GEMM runs on the padded rows
    (:func:`cublas_block_scaled_mm`), the first ``M`` output rows are kept and ``bias`` is added
    to them in bf16 (one rounding more than the emulation, which adds it in float32 before
    rounding). Two launches, fixed shapes, no host sync: safe inside CUDA-graph capture.

    Args:
        x: ``[M, K]`` bf16, last dim contiguous (copied otherwise).
        weight: float8_e4m3fn ``[N, K]`` contiguous; ``(N, K)`` eligible
            (:func:`block_scaled_mm_eligible`).
        weight_scale: float32 ``[N / 128, K / 128]`` contiguous.
        bias: optional ``[N]`` in ``x``'s dtype.

    Returns:
        ``[M, N]`` in ``x``'s dtype, contiguous.

    Raises:
        ValueError: ``x`` not 2-D bf16, ``weight`` not float8_e4m3fn ``[N, K]`` of an eligible
            shape with ``x``'s ``K``, or ``weight_scale`` not ``[N / 128, K / 128]`` float32.
    """
    from surge.kernels.fp8_group_quant import per_token_group_quant_fp8

    if x.dim() != 2 or x.dtype != torch.bfloat16:
        raise ValueError(f"x must be 2-D bf16, got {tuple(x.shape)} {x.dtype}")
    n, k = weight.shape
    if weight.dtype != FP8_DTYPE or k != x.shape[1] or not block_scaled_mm_eligible(n, k, (128, 128)):
        raise ValueError(
            f"weight must be float8_e4m3fn [N, K] with N % 128 == 0, K % 512 == 0 and K == {x.shape[1]}, "
            f"got {tuple(weight.shape)} {weight.dtype}"
        )
    if weight_scale.dtype != torch.float32 or tuple(weight_scale.shape) != (n // 128, k // 128):
        raise ValueError(
            f"weight_scale must be float32 [{n // 128}, {k // 128}], got {tuple(weight_scale.shape)} {weight_scale.dtype}"
        )
    m = x.shape[0]
    xq, xs = per_token_group_quant_fp8(x if x.stride(1) == 1 else x.contiguous(), BLOCK_SCALED_MM_ROWS)
    out = cublas_block_scaled_mm(xq, xs, weight, weight_scale, x.dtype)[:m]
    if bias is not None:
        out += bias
    return out


BLOCK_SCALED_MM_PROBE_COLUMNS = 256
"""Output columns of a layer that :func:`block_scaled_mm_probe` checks against the reference."""


def block_scaled_mm_probe(weight: torch.Tensor, weight_scale: torch.Tensor) -> bool:
    """Whether cuBLAS's block-scaled GEMM computes this layer right on its device.

    One :func:`block_scaled_mm_linear` of 100 random bf16 tokens (padded to 112) by the layer's
    own weight, whose first :data:`BLOCK_SCALED_MM_PROBE_COLUMNS` output columns are compared
    with the dequantized float32 reference of the same quantized operands
    (:func:`surge.quant.fp8.fp8_linear_reference` with ``input_group=128``): every row's cosine
    must exceed 0.999 (the same operands give about 0.99999, the bf16 output's rounding). cuBLAS's refusals depend on the shape (the H200's
    diagnostic, :data:`BLOCK_SCALED_MM_ROWS`), hence one probe per ``(N, K)`` and device:
    :meth:`Fp8LinearMethod.process_weights` runs it after loading, eagerly, before any CUDA graph
    is captured, and :func:`surge.quant.loading.process_fp8` passes each result on to the other
    layers of that shape. An exception (a GPU or cuBLAS without block scaling) or a low cosine is
    logged and gives False: that layer keeps the Triton prefill config.

    Args:
        weight: float8_e4m3fn ``[N, K]``, an eligible shape (:func:`block_scaled_mm_eligible`).
        weight_scale: float32 ``[N / 128, K / 128]`` block scales.

    Returns:
        False off CUDA and without torch's block-scaled ``F.scaled_mm``.
    """
    n, k = weight.shape
    if not _scaled_mm_has_block_scaling():
        logger.info(
            "fp8: torch %s has no block-scaled F.scaled_mm; block prefill GEMMs run on Triton",
            torch.__version__,
        )
        return False
    if weight.device.type != "cuda":
        return False
    block = (128, 128)
    cols = min(n, BLOCK_SCALED_MM_PROBE_COLUMNS)
    try:
        gen = torch.Generator(device=weight.device).manual_seed(0)
        x = torch.randn(100, k, generator=gen, device=weight.device).to(torch.bfloat16)
        got = block_scaled_mm_linear(x, weight, weight_scale, None)[:, :cols]
        head_scale = weight_scale[: cols // block[0]]
        want = fp8_linear_reference(x, weight[:cols], head_scale, block_size=block, input_group=FP8_ACT_GROUP)
        cos = torch.nn.functional.cosine_similarity(got.float(), want.float(), dim=-1).min().item()
    except Exception:  # noqa: BLE001 -- any failure only means: keep the Triton path
        logger.warning(
            "fp8: cuBLAS block-scaled GEMM failed its probe for %d x %d on %s; using Triton",
            n,
            k,
            weight.device,
            exc_info=True,
        )
        return False
    if not cos > 0.999:
        logger.warning(
            "fp8: cuBLAS block-scaled GEMM gave cosine %.5f in its probe for %d x %d on %s; using Triton",
            cos,
            n,
            k,
            weight.device,
        )
        return False
    logger.info(
        "fp8: cuBLAS block-scaled GEMM passed its probe for %d x %d on %s (cosine %.5f)",
        n,
        k,
        weight.device,
        cos,
    )
    return True


def block_splitk_config(
    m: int, n: int, k: int, block_size: tuple[int, int], a8: bool = False
) -> Fp8SplitKConfig:
    """The split-K launch for a ``[M, K] @ [N, K]^T`` decode step with ``(bn, bk)`` block scales:
    the tiles that :func:`splitk_configs` gives the per-channel layer of that shape at ``M`` (its
    measured ones), else :func:`surge.kernels.fp8_gemm_splitk.default_splitk_config`'s; w8a16,
    or w8a8 with ``a8`` (the launcher quantizes the activations per token; see
    :data:`BLOCK_SPLITK_A8_FROM`), and ``block_k`` at most ``bk``'s largest power-of-two
    divisor, so that every ``K`` step lies in one scale block."""
    from dataclasses import replace

    from surge.kernels.fp8_gemm_splitk import default_splitk_config

    by_m = splitk_configs(n, k)
    cfg = by_m[m] if m < len(by_m) else None
    if cfg is None:
        cfg = default_splitk_config(m, n, k)
    bk = block_size[1]
    return replace(cfg, a8=a8, block_k=min(cfg.block_k, bk & -bk))


def block_prefill_config(block_size: tuple[int, int]) -> Fp8SplitKConfig | None:
    """:data:`BLOCK_PREFILL_TILES` as a config, its ``block_k`` at most ``bk``'s largest
    power-of-two divisor; None when unset."""
    if BLOCK_PREFILL_TILES is None:
        return None
    from dataclasses import replace

    from surge.kernels.fp8_gemm_splitk import Fp8SplitKConfig

    cfg = Fp8SplitKConfig(*BLOCK_PREFILL_TILES)
    bk = block_size[1]
    return replace(cfg, block_k=min(cfg.block_k, bk & -bk))


def _tma_where_supported(
    by_m: tuple[Fp8SplitKConfig | None, ...], weight: torch.Tensor
) -> tuple[Fp8SplitKConfig | None, ...]:
    """``by_m`` as is, or with ``tma`` off in every config where ``weight`` cannot take TMA
    loads (:func:`surge.kernels.fp8_gemm_splitk.check_tma_weight`: a GPU older than Hopper, an
    unaligned weight): the pointer loads compute the same result, the measured table being the
    H200's."""
    if not any(c is not None and c.tma for c in by_m):
        return by_m
    from dataclasses import replace

    from surge.kernels.fp8_gemm_splitk import check_tma_weight

    try:
        check_tma_weight(weight)
    except ValueError:
        return tuple(None if c is None else replace(c, tma=False) for c in by_m)
    return by_m


def _shard_index(layer: _LinearBase, shard_id: str | int | None) -> int:
    """Index of a stacked part (q/k/v, gate/up) in the layer's per-part scale vector."""
    if shard_id is None:
        return 0
    if shard_id in ("q", "k", "v"):
        return ("q", "k", "v").index(shard_id)  # type: ignore[arg-type]
    return int(shard_id)


def _part_sizes(layer: _LinearBase) -> list[int]:
    """Local output rows of each stacked part: ``[q, k, v]``, ``[gate, up]`` or ``[N]``."""
    if hasattr(layer, "q_size"):
        return [layer.q_size, layer.kv_size, layer.kv_size]  # type: ignore[attr-defined]
    if hasattr(layer, "output_sizes_local"):
        return list(layer.output_sizes_local)  # type: ignore[attr-defined]
    return [layer.out_features_local]


def _check_scales(loaded: torch.Tensor, what: str) -> None:
    """Refuse weight scales that are not finite or are negative (NaN scales gave NaN logits); a
    zero scale (an all-zero block) is allowed, as vLLM allows it.

    Raises:
        ValueError: naming ``what`` and the first bad value.
    """
    values = loaded.float()
    bad = ~(torch.isfinite(values) & (values >= 0))
    if bool(bad.any()):
        raise ValueError(f"{what} must be finite and not negative, got {values[bad].reshape(-1)[0].item()}")


def _block_scale_shape(
    layer: _LinearBase, shard_id: str | int | None, block: tuple[int, int]
) -> tuple[int | None, int | None]:
    """The ``[rows, cols]`` a checkpoint's ``weight_scale_inv`` must have for one stored tensor of
    ``layer`` (the whole weight, or part ``shard_id``): one scale per block of its full,
    unsharded size. None where the layer cannot tell (k/v rows when KV heads are replicated)."""
    from surge.layers.linear import ReplicatedLinear, RowParallelLinear

    bn, bk = block
    tp = layer.tp_size
    cols = layer.in_features_local * (tp if isinstance(layer, RowParallelLinear) else 1)
    rows: int | None
    if isinstance(layer, RowParallelLinear | ReplicatedLinear):
        rows = layer.out_features_local
    elif shard_id is None:
        rows = layer.out_features_local * tp
    elif shard_id == "q":
        rows = layer.q_size * tp  # type: ignore[attr-defined]
    elif shard_id in ("k", "v"):
        rows = None if tp > 1 else layer.kv_size  # type: ignore[attr-defined]
    else:
        rows = layer.output_sizes_local[int(shard_id)] * tp  # type: ignore[attr-defined]
    return (None if rows is None else -(-rows // bn)), -(-cols // bk)


class Fp8LinearMethod:
    """FP8 weights for one linear layer (see the module docstring).

    Args:
        config: the model's :class:`Fp8Config`.
        emulate: compute by dequantization in torch (CPU tests); otherwise the CUDA kernels.

    After :meth:`process_weights`, the layer holds ``weight`` (float8_e4m3fn ``[N, K]``) and
    ``weight_scale`` (float32 ``[N]`` per channel, or ``[cdiv(N, bn), cdiv(K, bk)]`` block
    scales).
    """

    def __init__(self, config: Fp8Config, emulate: bool) -> None:
        self.config = config
        self.emulate = emulate
        self.block_size = config.block_size if config.scheme == "block" else None
        self.scale_row: torch.Tensor | None = None  # [1, N] view of the per-channel scales
        self.use_scaled_mm = False
        self.triton_for_decode = False
        self.splitk_by_m: tuple[Fp8SplitKConfig | None, ...] = ()
        self.block_splitk_by_m: tuple[Fp8SplitKConfig, ...] = ()  # block scales, M = 0..SPLITK_MAX_M
        self.block_prefill: Fp8SplitKConfig | None = None  # block scales, M > SPLITK_MAX_M
        self.block_scaled_mm = False  # cuBLAS's block-scaled GEMM instead of block_prefill
        self.splitk_workspace: SplitKWorkspace | None = None  # shared, set by process_fp8

    # ------------------------------------------------------------------ loading

    def check_block_layout(self, layer: _LinearBase, name: str) -> None:
        """Refuse block-wise scales on a layer whose parts or input size are not multiples of the
        block (checked for dummy weights too, so a benchmark config fails as its checkpoint would).

        Raises:
            ValueError: naming the layer ``name``, its full sizes and, under tensor parallelism,
                the sizes per rank.
        """
        from surge.layers.linear import ReplicatedLinear, RowParallelLinear

        if self.block_size is None:
            return
        bn, bk = self.block_size
        parts, in_local = _part_sizes(layer), layer.in_features_local
        if any(p % bn for p in parts) or in_local % bk:
            tp = layer.tp_size
            per_rank = f" ({parts} x {in_local} per rank at tensor_parallel_size {tp})" if tp > 1 else ""
            full_in = in_local * tp if isinstance(layer, RowParallelLinear) else in_local
            full_parts = (
                parts if isinstance(layer, RowParallelLinear | ReplicatedLinear) else [p * tp for p in parts]
            )
            raise ValueError(
                f"fp8: {name or type(layer).__name__} with output parts {full_parts} x input {full_in}{per_rank} "
                f"is not a multiple of weight_block_size {list(self.block_size)}"
            )

    def create_weights(self, layer: _LinearBase, name: str = "") -> None:
        """Before loading an FP8 checkpoint: an e4m3 ``weight`` and the checkpoint's scale
        parameter (``weight_scale_inv``, block-wise, or ``weight_scale``, one per stored
        tensor), each loaded through the layer's own TP-aware ``weight_loader``.

        Raises:
            ValueError: block-wise scales on a layer whose parts or input size are not
                multiples of the block (:meth:`check_block_layout`). While loading: a weight
                stored in another dtype than float8_e4m3fn, a scale tensor of the wrong shape, or
                a scale that is not finite and positive.
        """
        self.check_block_layout(layer, name)
        out_local, in_local = layer.weight.shape
        dev = layer.weight.device
        weight = nn.Parameter(
            torch.empty(out_local, in_local, dtype=FP8_DTYPE, device=dev), requires_grad=False
        )

        def load_weight(param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
            if loaded.dtype != FP8_DTYPE:
                raise ValueError(
                    f"the weight is stored as {str(loaded.dtype).removeprefix('torch.')}, but an fp8 "
                    "checkpoint's quantized layers hold float8_e4m3fn (list the layer in "
                    "quantization_config.modules_to_not_convert if it is meant to stay unquantized)"
                )
            layer.weight_loader(param, loaded, shard_id)

        weight.weight_loader = load_weight  # type: ignore[attr-defined]
        layer.weight = weight
        if self.block_size is not None:
            bn, bk = self.block_size
            # Rows expanded to one per output channel while loading, so the layer's row slicing
            # (TP shards, stacked parts) applies unchanged; process_weights folds them back.
            scale = nn.Parameter(
                torch.empty(out_local, in_local // bk, dtype=torch.float32, device=dev), requires_grad=False
            )

            def load_block(
                param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None
            ) -> None:
                _check_scales(loaded, "weight_scale_inv")
                expected = _block_scale_shape(layer, shard_id, (bn, bk))
                got = tuple(loaded.shape)
                if len(got) != 2 or any(e is not None and g != e for g, e in zip(got, expected, strict=True)):
                    want = ", ".join("?" if e is None else str(e) for e in expected)
                    part = "" if shard_id is None else f" (part {shard_id})"
                    raise ValueError(
                        f"weight_scale_inv{part} has shape {list(got)}, expected [{want}]: one scale per "
                        f"{bn} x {bk} block of the weight"
                    )
                layer.weight_loader(param, loaded.float().repeat_interleave(bn, 0), shard_id)

            scale.weight_loader = load_block  # type: ignore[attr-defined]
            layer.weight_scale_inv = scale
        else:
            parts = len(_part_sizes(layer))
            scale = nn.Parameter(torch.ones(parts, dtype=torch.float32, device=dev), requires_grad=False)

            def load_tensor(
                param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None
            ) -> None:
                if loaded.numel() != 1:
                    raise ValueError(f"weight_scale must be one value, got shape {tuple(loaded.shape)}")
                _check_scales(loaded, "weight_scale")
                param.data[_shard_index(layer, shard_id)] = loaded.reshape(()).float()

            scale.weight_loader = load_tensor  # type: ignore[attr-defined]
            layer.weight_scale = scale

    @torch.no_grad()
    def process_weights(
        self, layer: _LinearBase, probed: dict[tuple[int, int, str], bool] | None = None
    ) -> None:
        """After loading: quantize a non-FP8 weight (online mode, dummy weights: per channel,
        or block-wise for a block checkpoint's layout) or fold the loaded scales into the
        kernel layout; then pick the GEMM path.

        ``probed``: results of :func:`block_scaled_mm_probe` by ``(N, K, device)``, shared by the
        layers of one model load (:func:`surge.quant.loading.process_fp8`): a shape already
        probed is not probed again. None: probe this layer if it is eligible."""
        w = layer.weight
        if w.dtype != FP8_DTYPE:
            if self.block_size is not None:
                q, s = quantize_block(w.data, self.block_size)
            else:
                q, s = quantize_per_channel(w.data)
        elif self.block_size is not None:
            expanded: torch.Tensor = layer.weight_scale_inv.data
            del layer.weight_scale_inv
            q, s = w.data, expanded[:: self.block_size[0]].contiguous()
        else:
            per_part: torch.Tensor = layer.weight_scale.data
            del layer.weight_scale
            sizes = torch.tensor(_part_sizes(layer), device=per_part.device)
            q, s = w.data, per_part.repeat_interleave(sizes).contiguous()
        layer.weight = nn.Parameter(q.contiguous(), requires_grad=False)
        layer.register_buffer("weight_scale", s.float().contiguous(), persistent=False)
        n, k = q.shape
        if self.block_size is not None:
            # set under emulation too: :meth:`weight_only` reads which steps quantize their input
            bs = self.block_size
            a8_from = BLOCK_SPLITK_A8_FROM
            if (n, k) in SPLITK_BLOCK_FASTER:
                by_m = tuple(
                    block_splitk_config(max(m, 1), n, k, bs, a8_from is not None and m >= a8_from)
                    for m in range(SPLITK_MAX_M + 1)
                )
                self.block_splitk_by_m = by_m if self.emulate else _tma_where_supported(by_m, layer.weight)
            pre = block_prefill_config(bs)
            if pre is not None and not self.emulate:
                pre = _tma_where_supported((pre,), layer.weight)[0]
            self.block_prefill = pre
            # the emulation mirrors the choice by shape alone (see the module docstring)
            self.block_scaled_mm = pre is not None and block_scaled_mm_eligible(n, k, bs)
            if self.block_scaled_mm and not self.emulate:
                probed = {} if probed is None else probed
                key = (n, k, str(layer.weight.device))
                if key not in probed:
                    probed[key] = block_scaled_mm_probe(layer.weight, layer.weight_scale)
                self.block_scaled_mm = probed[key]
        if self.block_size is None:
            self.scale_row = layer.weight_scale.view(1, n)
            self.use_scaled_mm = n % 16 == 0 and k % 16 == 0
            self.triton_for_decode = (n, k) in TRITON_FASTER
            if self.use_scaled_mm and not self.emulate and (n, k) in SPLITK_MEASURED:
                self.splitk_by_m = _tma_where_supported(splitk_configs(n, k), layer.weight)

    def splitk_workspace_need(self, n: int) -> tuple[int, int]:
        """``(floats, counters)`` of the :class:`~surge.kernels.fp8_gemm_splitk.SplitKWorkspace`
        that this layer's ``"inline"`` split-K configs need (the largest over ``M``; ``(0, 0)``
        for none, and under emulation, which launches no kernel though it keeps the block tables
        for :meth:`weight_only`); :func:`surge.quant.loading.process_fp8` allocates one for all
        layers."""
        if self.emulate:
            return 0, 0
        inline = [
            (m, c)
            for by_m in (self.splitk_by_m, self.block_splitk_by_m)
            for m, c in enumerate(by_m)
            if c is not None and c.reduce == "inline"
        ]
        if not inline:
            return 0, 0
        from surge.kernels.fp8_gemm_splitk import splitk_workspace_size

        need = [splitk_workspace_size(m, n, c) for m, c in inline]
        return max(f for f, _ in need), max(t for _, t in need)

    # ------------------------------------------------------------------ forward

    def _decode_config(self, m: int) -> Fp8SplitKConfig | None:
        """The split-K config of a decode step of ``m`` tokens from :attr:`block_splitk_by_m`
        (block scales) or :attr:`splitk_by_m`; None above the table or where it has none."""
        by_m = self.splitk_by_m if self.block_size is None else self.block_splitk_by_m
        return by_m[m] if m < len(by_m) else None

    def _block_config(self, m: int) -> Fp8SplitKConfig | None:
        """A block-scaled layer's split-K config for a bf16 step of ``m`` tokens: its decode
        table's entry, :attr:`block_prefill` above ``SPLITK_MAX_M``, or None (the weight-only
        kernel)."""
        if m > SPLITK_MAX_M:
            return self.block_prefill
        return self._decode_config(m)

    def block_scaled_mm_step(self, m: int, dtype: torch.dtype = torch.bfloat16) -> bool:
        """Whether a step of ``m`` tokens of ``dtype`` activations runs cuBLAS's block-scaled GEMM
        (:func:`block_scaled_mm_linear`, activations quantized per token and 128-column group)
        instead of :attr:`block_prefill`: a bf16 step of more than ``SPLITK_MAX_M`` tokens of a
        layer whose :attr:`block_scaled_mm` is set (decided in :meth:`process_weights`)."""
        return self.block_scaled_mm and dtype == torch.bfloat16 and m > SPLITK_MAX_M

    def weight_only(self, m: int, dtype: torch.dtype = torch.bfloat16) -> bool:
        """Whether a step of ``m`` tokens of ``dtype`` activations takes a weight-only (w8a16:
        activations not quantized) GEMM: a w8a16 entry of :attr:`splitk_by_m` or
        :attr:`block_splitk_by_m`, the Triton decode kernel (:attr:`triton_for_decode`), or a
        block-scaled layer's weight-only kernel (no split-K config for ``m``, or a non-bf16
        model, whose block layers always take it). The emulation follows it, so it computes what
        the CUDA path computes (the per-channel CUDA fallbacks for odd shapes and non-bf16
        models aside)."""
        if self.block_size is not None:
            if self.block_scaled_mm_step(m, dtype):  # cuBLAS: per-group FP8 activations
                return False
            cfg = self._block_config(m) if dtype == torch.bfloat16 else None
            return cfg is None or not cfg.a8
        cfg = self.splitk_by_m[m] if m < len(self.splitk_by_m) else None
        if cfg is not None:
            return not cfg.a8
        return self.triton_for_decode and m <= SKINNY_MAX_M

    def wants_fp8_input(self, m: int, dtype: torch.dtype) -> bool:
        """Whether a step of ``m`` tokens of ``dtype`` activations runs a w8a8 GEMM (split-K
        w8a8 or ``torch._scaled_mm``), i.e. takes per-token FP8 activations, so that the
        kernel producing them may pass :class:`Fp8Activations` instead (decided when a CUDA
        graph is captured, per token bucket). Under emulation: whenever :meth:`apply` would
        quantize the input itself."""
        if self.block_size is not None:  # split-K w8a8 decode steps of bf16 models
            cfg = self._decode_config(m)
            return dtype == torch.bfloat16 and cfg is not None and cfg.a8
        if self.emulate:
            return not self.weight_only(m)
        if dtype != torch.bfloat16:
            return False
        cfg = self.splitk_by_m[m] if m < len(self.splitk_by_m) else None
        if cfg is not None:
            return cfg.a8
        return self.use_scaled_mm and not (self.triton_for_decode and m <= SKINNY_MAX_M)

    def apply(
        self, layer: _LinearBase, x: torch.Tensor | Fp8Activations, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """``x [T, K] -> [T, N]`` in ``x``'s dtype through the path chosen for this layer; for
        :class:`Fp8Activations` (given only when :meth:`wants_fp8_input` held), that w8a8 path
        without quantizing.

        Raises:
            ValueError: :class:`Fp8Activations` on a layer whose path is not w8a8.
        """
        w, s = layer.weight, layer.weight_scale
        if isinstance(x, Fp8Activations):
            return self._apply_fp8(x, w, s, bias)
        m = x.shape[0]
        if self.emulate:
            return fp8_linear_reference(
                x,
                w,
                s,
                bias,
                block_size=self.block_size,
                quantize_input=not self.weight_only(m, x.dtype),
                input_group=FP8_ACT_GROUP if self.block_scaled_mm_step(m, x.dtype) else None,
            )
        from surge.kernels.fp8_gemm import fp8_linear

        if self.block_size is not None:
            if self.block_scaled_mm_step(m, x.dtype):
                return block_scaled_mm_linear(x, w, s, bias)
            cfg = self._block_config(m) if x.dtype == torch.bfloat16 else None
            if cfg is not None:
                from surge.kernels.fp8_gemm_splitk import fp8_linear_splitk

                xc = x if x.stride(1) == 1 else x.contiguous()
                ws = self.splitk_workspace
                return fp8_linear_splitk(xc, w, s, bias, config=cfg, block_size=self.block_size, workspace=ws)
            return fp8_linear(x, w, s, bias, block_size=self.block_size)
        if m < len(self.splitk_by_m) and x.dtype == torch.bfloat16:
            cfg = self.splitk_by_m[m]
            if cfg is not None:
                from surge.kernels.fp8_gemm_splitk import fp8_linear_splitk

                xc = x if x.stride(1) == 1 else x.contiguous()
                return fp8_linear_splitk(xc, w, s, bias, config=cfg, workspace=self.splitk_workspace)
        if (
            not self.use_scaled_mm
            or x.dtype != torch.bfloat16
            or (self.triton_for_decode and m <= SKINNY_MAX_M)
        ):
            return fp8_linear(x, w, s, bias)
        return scaled_mm_linear(x, w, self.scale_row, bias)

    def apply_gated(
        self, layer: _LinearBase, x: torch.Tensor | Fp8Activations, bias: torch.Tensor | None
    ) -> torch.Tensor | None:
        """SwiGLU's ``silu(gate) * up`` ``[T, N/2]`` straight from this merged ``[gate; up]``
        layer's GEMM epilogue (:func:`surge.kernels.fp8_gemm_splitk.fp8_linear_splitk` with
        ``gated``: bit for bit :meth:`apply` then :func:`surge.kernels.silu_and_mul.silu_and_mul`,
        one launch less; with half the config's ``block_n``), or None where the step's path
        cannot fuse it: emulation, block
        scales, a non-bf16 model, or no split-K config with ``split_k == 1`` for ``T`` tokens
        (on the H200 table: gate_up at 1..64 tokens). The caller decides whether its consumer
        takes bf16 activations (a w8a8 consumer wants them quantized per token instead)."""
        if self.emulate or self.block_size is not None:
            return None
        m = x.data.shape[0] if isinstance(x, Fp8Activations) else x.shape[0]
        cfg = self.splitk_by_m[m] if m < len(self.splitk_by_m) else None
        if cfg is None or cfg.split_k != 1 or x.dtype != torch.bfloat16:
            return None
        if isinstance(x, Fp8Activations) and not cfg.a8:
            return None
        from dataclasses import replace

        from surge.kernels.fp8_gemm_splitk import fp8_linear_splitk

        # half the column tile: each program reads a gate and an up tile, so it streams the
        # plain config's bytes per step (and shared memory), over as many programs
        cfg = replace(cfg, block_n=max(16, cfg.block_n // 2))
        w, s = layer.weight, layer.weight_scale
        if isinstance(x, Fp8Activations):
            return fp8_linear_splitk(
                x.data, w, s, bias, config=cfg, x_scale=x.scale, out_dtype=x.dtype, gated=True
            )
        xc = x if x.stride(1) == 1 else x.contiguous()
        return fp8_linear_splitk(xc, w, s, bias, config=cfg, gated=True)

    def apply_partials(
        self, layer: _LinearBase, x: torch.Tensor | Fp8Activations, bias: torch.Tensor | None
    ) -> torch.Tensor | SplitKPartials:
        """:meth:`apply` for a layer whose output an RMSNorm reduces
        (:attr:`surge.layers.linear.RowParallelLinear.partials_consumer`): where the step's path
        is the split-K GEMM with a ``split_k > 1``, ``reduce == "kernel"`` config (per-channel
        w8a16 or w8a8, including pre-quantized :class:`Fp8Activations`, or block scales), the
        GEMM's partials (:func:`surge.kernels.fp8_gemm_splitk.fp8_linear_splitk_partials`)
        instead of the reduce launch; :meth:`apply`'s tensor otherwise (and always under
        emulation).

        Raises:
            ValueError: as :meth:`apply`.
        """
        if not self.emulate:
            cfg: Fp8SplitKConfig | None = None
            if isinstance(x, Fp8Activations):
                m = x.data.shape[0]
                cfg = self._decode_config(m)
                if (
                    cfg is not None
                    and cfg.split_k > 1
                    and cfg.reduce == "kernel"
                    and self.wants_fp8_input(m, x.dtype)
                ):
                    from surge.kernels.fp8_gemm_splitk import fp8_linear_splitk_partials

                    return fp8_linear_splitk_partials(
                        x.data,
                        layer.weight,
                        layer.weight_scale,
                        bias,
                        config=cfg,
                        block_size=self.block_size,
                        x_scale=x.scale,
                        out_dtype=x.dtype,
                    )
            elif x.dtype == torch.bfloat16:
                m = x.shape[0]
                cfg = self._decode_config(m)
                if cfg is not None and cfg.split_k > 1 and cfg.reduce == "kernel":
                    from surge.kernels.fp8_gemm_splitk import fp8_linear_splitk_partials

                    xc = x if x.stride(1) == 1 else x.contiguous()
                    w, s = layer.weight, layer.weight_scale
                    return fp8_linear_splitk_partials(xc, w, s, bias, config=cfg, block_size=self.block_size)
        return self.apply(layer, x, bias)

    def _apply_fp8(
        self, x: Fp8Activations, w: torch.Tensor, s: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        m = x.data.shape[0]
        if not self.wants_fp8_input(m, x.dtype):
            raise ValueError(f"fp8: this layer's path for {m} tokens does not take FP8 activations")
        if self.emulate:
            return fp8_linear_reference(x, w, s, bias, block_size=self.block_size)
        cfg = self._decode_config(m)
        if cfg is not None:
            from surge.kernels.fp8_gemm_splitk import fp8_linear_splitk

            return fp8_linear_splitk(
                x.data,
                w,
                s,
                bias,
                config=cfg,
                block_size=self.block_size,
                x_scale=x.scale,
                out_dtype=x.dtype,
                workspace=self.splitk_workspace,
            )
        assert self.scale_row is not None
        out = torch._scaled_mm(x.data, w.t(), scale_a=x.scale, scale_b=self.scale_row, out_dtype=x.dtype)
        if bias is not None:
            out += bias
        return out


def scaled_mm_linear(
    x: torch.Tensor, weight: torch.Tensor, scale_row: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    """Per-token FP8 activations times a per-channel FP8 weight on cuBLASLt.

    Args:
        x: ``[M, K]`` bf16 (quantized here, one scale per row).
        weight: float8_e4m3fn ``[N, K]`` contiguous (``weight.t()`` is the column-major
            ``[K, N]`` operand ``_scaled_mm`` requires); ``K``, ``N`` multiples of 16.
        scale_row: float32 ``[1, N]`` weight scales.
        bias: optional ``[N]`` bf16, added after the GEMM.

    Returns:
        ``[M, N]`` bf16.
    """
    from surge.kernels.fp8_quant import per_token_quant_fp8

    assert scale_row is not None
    xq, xs = per_token_quant_fp8(x if x.stride(1) == 1 else x.contiguous())
    out = torch._scaled_mm(xq, weight.t(), scale_a=xs, scale_b=scale_row, out_dtype=x.dtype)
    if bias is not None:
        out += bias
    return out
