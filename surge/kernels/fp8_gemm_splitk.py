"""Split-K FP8 GEMM for decode steps (and, with one ``K`` slice and large tiles, block-scaled
layers' prefill steps): ``y [M, N] = x [M, K] @ dequant(w_fp8 [N, K])^T (+ bias)``.

A decode step (``M`` up to a few dozen tokens) is bound by reading the weight once. Tiling only
``N`` gives too few programs to keep every SM's memory pipeline busy on Qwen3-8B's shapes
(``N = 4096`` in 64-column tiles is 64 programs for 132 SMs), so this kernel also splits ``K``:
grid ``(cdiv(N, BLOCK_N), SPLIT_K, cdiv(M, BLOCK_M))``, each program reducing one
``K / SPLIT_K`` slice (a multiple of ``BLOCK_K``) into an fp32 ``BLOCK_M x BLOCK_N`` tile. With
``SPLIT_K = 1`` it applies the scales and bias and stores ``y`` directly (one launch); otherwise
it stores fp32 partials ``[SPLIT_K, M, N]`` and one of two reductions (``Fp8SplitKConfig.reduce``)
sums them in the fixed order ``0 .. SPLIT_K - 1`` (deterministic, and the two give the same bits),
scales, adds the bias and casts:

* ``"kernel"``: a second launch, :func:`_splitk_reduce_kernel`, into partials allocated per
  call;
* ``"inline"``: no second launch (serial split-K fix-up, as CUTLASS's "serial split-K" and
  stream-K fix-ups with a semaphore per output tile do): each program stores its partial into a
  persistent :class:`SplitKWorkspace`, waits for its CTA's stores (``tl.debug_barrier``) and
  increments the tile's arrival counter with one ``acq_rel`` GPU-scope atomic (release: the
  partials are visible before the count; acquire: the last program sees every partial). The
  program that arrives last (count ``SPLIT_K - 1``) reads the ``SPLIT_K`` partials back through
  L2 (``.cg``), applies the epilogue, writes ``y`` and sets the counter back to zero, so the next
  call and every CUDA-graph replay start clean; the partials need no reset (each call
  overwrites them). Calls that share a workspace must be ordered (one stream), as the layers of
  a model are.

A ``"kernel"`` config may also leave the reduction to the consumer of ``y``:
:func:`fp8_linear_splitk_partials` returns the partials (:class:`surge.quant.fp8.SplitKPartials`)
and the residual-add + RMSNorm that reads ``y`` next sums them itself
(:func:`surge.kernels.add_rmsnorm.add_rmsnorm_partials`), through the same
:func:`splitk_reduce_row` as :func:`_splitk_reduce_kernel`, so its input is bit for bit the
reduce kernel's ``y``.

Two operand modes, both with fp32 accumulation, and two weight-scale layouts: per output
channel (``scale [N]``, applied once at the end), or block-wise (``scale [cdiv(N, bn),
cdiv(K, bk)]``, the ``weight_scale_inv`` of Qwen's and DeepSeek's FP8 checkpoints: each
``BLOCK_K`` step, which lies inside one ``bk`` block since ``BLOCK_K`` divides ``bk``, adds its
partial product times the scale of its ``(n // bn, k // bk)`` block, as
:mod:`surge.kernels.fp8_gemm` does over the whole of ``K``):

* ``w8a16`` (``quantize_input=False``): the weight is loaded as e4m3 and converted to the
  activations' dtype in registers; ``x`` is not quantized (the more exact one);
* ``w8a8`` (``quantize_input=True``): ``x`` is first quantized per token by
  :func:`surge.kernels.fp8_quant.per_token_quant_fp8` and ``tl.dot`` runs on two e4m3
  operands (sm89+ FP8 MMA); the token scale multiplies the result, as in ``torch._scaled_mm``
  with row-wise scales. Hopper's FP8 ``wgmma`` (what Triton emits for ``BLOCK_M >= 64``) adds
  into its fp32 accumulator with fewer mantissa bits than fp32 (DeepSeek-V3 report, sec.
  3.3.2: about 14), and Triton 3.x on sm90 lets it accumulate a whole ``tl.dot`` chain that way
  by default (``max_num_imprecise_acc`` = 2**30): with ``K / SPLIT_K`` = 6144 or 12288 (down
  at ``M = 64``) the H200 sweep's check failed (issue 13). Every FP8 ``tl.dot`` here therefore
  passes ``max_num_imprecise_acc = min(BLOCK_K, FP8_PROMOTE_K)``, so Triton adds the tensor
  cores' partial sum into a true fp32 accumulator every :data:`FP8_PROMOTE_K` elements of
  ``K`` (DeepGEMM's promotion interval; cuBLAS does the same unless ``use_fast_accum``).

Weight loads: pointer-based ``tl.load`` (``cp.async`` pipelining on sm80+), or, with
``Fp8SplitKConfig.tma``, Hopper's tensor memory accelerator (sm90+): the launcher builds a host
TMA descriptor of the whole ``[N, K]`` weight with ``[BLOCK_N, BLOCK_K]`` boxes
(``triton.tools.tensor_descriptor.TensorDescriptor``) and each ``K`` step loads its weight tile
with one ``w_desc.load([n0, k0])``, rows past ``N`` and columns past ``K`` zero-filled by the TMA
unit as the pointer path's masks fill them with zeros. The activations keep pointer loads. The
tiles, the dots and their order are the same, so both modes are meant to give the same bits
(tested under the CPU interpreter, which runs descriptors too, and on a Hopper GPU by
``tests/kernels/test_fp8_gemm_splitk_tma_gpu.py``). The descriptor is encoded on the host at
every launch (``cuTensorMapEncodeTiled``, CPU work per eager launch; nothing while replaying a
CUDA graph, which holds its bytes), so it is a candidate for the CUDA-graph decode path that
the sweep times, off unless a measured table entry selects it
(:data:`surge.quant.fp8_linear.SPLITK_MEASURED`). Source: CUDA C++ Programming Guide,
"Asynchronous Data Copies using the Tensor Memory Accelerator"; Triton's host-side tensor
descriptors.

Split-K is the standard technique of CUTLASS's "split-K serial/parallel" GEMMs; the tiles that
the engine uses come from ``benchmarks/fp8_gemm_bench.py --sweep`` on the H200
(:data:`surge.quant.fp8_linear.SPLITK_MEASURED`). The launch depends only on the shapes; the
``"kernel"`` reduction's partials are allocated by torch (from the graph pool while capturing)
and the ``"inline"`` one's workspace is allocated once, before capture, so both are safe in
CUDA-graph capture: no host syncs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Literal

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.tools.tensor_descriptor import TensorDescriptor

from surge.kernels.fp8_gemm import check_fp8_gemm_args
from surge.kernels.pdl import pdl_wait, use_pdl
from surge.quant.fp8 import SplitKPartials


@dataclass(frozen=True)
class Fp8SplitKConfig:
    """One launch of :func:`fp8_linear_splitk`.

    ``block_m``, ``block_n``, ``block_k`` are powers of two >= 16; ``split_k >= 1`` slices of
    ``K``; ``a8`` selects the w8a8 mode (per-token FP8 activations), else w8a16; ``reduce`` how
    ``split_k > 1`` partials are summed: ``"kernel"`` (a second launch) or ``"inline"`` (the
    last program of each output tile, through a :class:`SplitKWorkspace`; see the module
    docstring). ``reduce`` is ignored when ``split_k == 1``. ``tma`` loads the weight tiles
    through a Hopper TMA descriptor (sm90+, see :func:`check_tma_weight`) instead of pointer
    loads: the same result bits, another memory pipeline.
    """

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_stages: int
    num_warps: int
    a8: bool = False
    reduce: Literal["kernel", "inline"] = "kernel"
    tma: bool = False


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def tma_supported(device: torch.device | str) -> bool:
    """Whether ``device`` can run the TMA weight loads of ``Fp8SplitKConfig.tma``: an NVIDIA
    (not ROCm) CUDA device of compute capability 9.0 or newer (Hopper, Blackwell); cached per
    device index."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available() or torch.version.hip is not None:
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _capability(index) >= (9, 0)


def check_tma_weight(weight: torch.Tensor, interpreting: bool | None = None) -> None:
    """Validate a ``[N, K]`` float8_e4m3fn weight for TMA loads (``Fp8SplitKConfig.tma``).

    Args:
        weight: the GEMM's weight, last dim contiguous (checked by the launcher).
        interpreting: whether the kernel runs under Triton's CPU interpreter
            (``TRITON_INTERPRET=1``), which emulates descriptors on any device: the device
            check is then skipped; None: whether this module's kernel was built for it.

    Raises:
        ValueError: not interpreting and ``weight`` not on an NVIDIA GPU of compute
            capability >= 9.0 (:func:`tma_supported`); a non-empty weight whose base address
            or row stride (bytes) is not a multiple of 16 (TMA's alignment).
    """
    if interpreting is None:
        interpreting = isinstance(_fp8_splitk_kernel, InterpretedFunction)
    if not interpreting and not tma_supported(weight.device):
        raise ValueError(
            f"tma=True needs an NVIDIA GPU of compute capability >= 9.0 (Hopper), got {weight.device}"
        )
    row_bytes = weight.stride(0) * weight.element_size()
    if weight.numel() and (weight.data_ptr() % 16 or row_bytes % 16):  # an empty one is not read
        raise ValueError(
            "tma=True needs a 16-byte aligned weight base and row stride, got address "
            f"{weight.data_ptr()} and a {row_bytes}-byte row stride"
        )


@dataclass(frozen=True)
class SplitKWorkspace:
    """Persistent scratch of the ``"inline"`` split-K reduction, shared by the calls of one
    stream (e.g. every FP8 layer of a model, see :func:`surge.quant.loading.process_fp8`).

    ``partials``: float32 ``[P]``, the ``[split_k, M, N]`` partials of a call (any content);
    ``counters``: int32 ``[T]``, one arrival counter per output tile, all zero between calls
    (the kernel leaves them zero). Sizes from :func:`splitk_workspace_size`.
    """

    partials: torch.Tensor
    counters: torch.Tensor

    @staticmethod
    def allocate(partials: int, tiles: int, device: torch.device | str) -> SplitKWorkspace:
        """A workspace of ``partials`` floats and ``tiles`` zeroed counters on ``device``."""
        return SplitKWorkspace(
            torch.empty(max(partials, 1), dtype=torch.float32, device=device),
            torch.zeros(max(tiles, 1), dtype=torch.int32, device=device),
        )


def splitk_workspace_size(m: int, n: int, config: Fp8SplitKConfig) -> tuple[int, int]:
    """``(floats, counters)`` that a ``[M, K] @ [N, K]^T`` call with ``config`` needs in a
    :class:`SplitKWorkspace`; ``(0, 0)`` unless it reduces inline (``split_k > 1``)."""
    if config.reduce != "inline" or config.split_k == 1:
        return 0, 0
    tiles = triton.cdiv(n, config.block_n) * triton.cdiv(m, config.block_m)
    return config.split_k * m * n, tiles


FP8_PROMOTE_K = 128
"""Elements of ``K`` that an FP8 x FP8 ``tl.dot`` may sum in the tensor cores' reduced-precision
accumulator before the sum is added into fp32 (see the module docstring)."""


def default_splitk_config(m: int, n: int, k: int) -> Fp8SplitKConfig:
    """Tiles for shapes without a measurement: ``block_m`` 16/32/64 by ``m``, 64 x 256 weight
    tiles, 4 stages, 4 warps, and ``split_k`` the power of two (<= 16) that brings the grid to
    at least 256 programs while keeping >= 2 ``block_k`` steps per slice (w8a16)."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    block_n = min(64, max(16, triton.next_power_of_2(n)))
    block_k = min(256, max(16, triton.next_power_of_2(k)))
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    split = 1
    while split < 16 and tiles * split < 256 and k >= 4 * split * block_k:
        split *= 2
    return Fp8SplitKConfig(block_m, block_n, block_k, split, 4, 4)


@triton.jit
def _epilogue(
    acc,
    y_ptr,
    ws_ptr,
    xs_ptr,
    b_ptr,
    offs_m,
    offs_n,
    mask_m,
    mask_n,
    stride_ym,
    A8: tl.constexpr,
    BLOCK_SCALES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Per-channel weight scales (block scales were applied per step), token scales, bias,
    cast, store."""
    if not BLOCK_SCALES:
        acc = acc * tl.load(ws_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    if A8:
        acc = acc * tl.load(xs_ptr + offs_m, mask=mask_m, other=0.0)[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _gated_epilogue(
    acc_g,
    acc_u,
    y_ptr,
    ws_ptr,
    xs_ptr,
    b_ptr,
    offs_m,
    offs_n,
    mask_m,
    mask_n,
    N,
    stride_ym,
    A8: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """SwiGLU's ``silu(gate) * up`` of the gate tile ``acc_g`` (columns ``offs_n``) and the up
    tile ``acc_u`` (weight rows ``N + offs_n``): each tile finished as :func:`_epilogue` would
    finish it and rounded to ``y``'s dtype, then the roundings of
    :func:`surge.kernels.silu_and_mul.silu_and_mul` (silu in fp32 rounded, the product rounded),
    so the result equals the GEMM then that kernel bit for bit."""
    dtype = y_ptr.dtype.element_ty
    g = acc_g * tl.load(ws_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    u = acc_u * tl.load(ws_ptr + N + offs_n, mask=mask_n, other=0.0)[None, :]
    if A8:
        xs = tl.load(xs_ptr + offs_m, mask=mask_m, other=0.0)[:, None]
        g = g * xs
        u = u * xs
    if HAS_BIAS:
        g += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        u += tl.load(b_ptr + N + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    g = g.to(dtype).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    y = act * u.to(dtype).to(tl.float32)
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, y.to(dtype), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _dot_acc(a, w, acc, A8: tl.constexpr, DOT_IEEE: tl.constexpr, PROMOTE_K: tl.constexpr):
    """``acc + a @ w^T`` for one ``K`` step with per-channel scales: two e4m3 operands with
    fp32 promotion every ``PROMOTE_K`` elements (w8a8), or the weight converted to ``a``'s
    dtype (w8a16)."""
    if A8:
        return tl.dot(a, tl.trans(w), acc, max_num_imprecise_acc=PROMOTE_K)
    elif DOT_IEEE:
        return tl.dot(a, tl.trans(w.to(a.dtype)), acc, input_precision="ieee")
    else:
        return tl.dot(a, tl.trans(w.to(a.dtype)), acc)


@triton.jit(do_not_specialize=["M", "STEPS"])
def _fp8_splitk_kernel(
    y_ptr,
    p_ptr,
    cnt_ptr,
    x_ptr,
    w_ptr,
    w_desc,
    ws_ptr,
    xs_ptr,
    b_ptr,
    M,
    N,
    K,
    STEPS,
    stride_xm,
    stride_wn,
    stride_ym,
    stride_sn,
    A8: tl.constexpr,
    PARTIALS: tl.constexpr,
    INLINE: tl.constexpr,
    BLOCK_SCALES: tl.constexpr,
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_IEEE: tl.constexpr,
    PROMOTE_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TMA: tl.constexpr,
    GATED: tl.constexpr,
    PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    # a multiple of BLOCK_K that the compiler can see (aligned, vectorized loads)
    k_start = pid_k * STEPS * BLOCK_K
    pdl_wait(PDL)
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + (k_start + offs_k)[None, :]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + (k_start + offs_k)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if GATED:  # SwiGLU: the up rows of this program's columns sit N rows below its gate rows
        wu_ptrs = w_ptrs + N.to(tl.int64) * stride_wn
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    s_rows = ws_ptr + (offs_n // SCALE_BN).to(tl.int64) * stride_sn  # block scales' rows
    for kb in range(0, STEPS):
        if EVEN_K:
            a = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
        else:
            k_mask = k_start + kb * BLOCK_K + offs_k < K
            a = tl.load(x_ptrs, mask=mask_m[:, None] & k_mask[None, :], other=0.0)
        if TMA:  # rows >= N and columns >= K arrive zero-filled, as the masks below fill them
            w = w_desc.load([pid_n * BLOCK_N, k_start + kb * BLOCK_K])
        elif EVEN_K:
            w = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0)
        else:
            w = tl.load(w_ptrs, mask=mask_n[:, None] & k_mask[None, :], other=0.0)
        if GATED:  # (a gate tile's rows past N are up rows, masked at the store)
            if TMA:
                wu = w_desc.load([N + pid_n * BLOCK_N, k_start + kb * BLOCK_K])
            elif EVEN_K:
                wu = tl.load(wu_ptrs, mask=mask_n[:, None], other=0.0)
            else:
                wu = tl.load(wu_ptrs, mask=mask_n[:, None] & k_mask[None, :], other=0.0)
        if BLOCK_SCALES:  # this step's partial product times its (n // bn, k // bk) scales
            if A8:
                part = tl.dot(a, tl.trans(w), max_num_imprecise_acc=PROMOTE_K)
            elif DOT_IEEE:
                part = tl.dot(a, tl.trans(w.to(a.dtype)), input_precision="ieee")
            else:
                part = tl.dot(a, tl.trans(w.to(a.dtype)))
            k0 = k_start + kb * BLOCK_K  # the step lies in one bk block (BLOCK_K divides bk)
            s = tl.load(s_rows + k0 // SCALE_BK, mask=mask_n & (k0 < K), other=0.0)
            acc += part * s[None, :]
        else:  # per-channel scales, applied at the end (w8a8: fp32 promotion, see the docstring)
            acc = _dot_acc(a, w, acc, A8, DOT_IEEE, PROMOTE_K)
        if GATED:
            acc_u = _dot_acc(a, wu, acc_u, A8, DOT_IEEE, PROMOTE_K)
            if not TMA:
                wu_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        if not TMA:
            w_ptrs += BLOCK_K
    if PARTIALS:  # partials [SPLIT_K, M, N], contiguous
        mask = mask_m[:, None] & mask_n[None, :]
        p_tile = p_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        slice_stride = M.to(tl.int64) * N
        tl.store(p_tile + pid_k * slice_stride, acc, mask=mask)
        if INLINE:
            splits = tl.num_programs(1)
            counter = cnt_ptr + pid_m * tl.num_programs(0) + pid_n
            tl.debug_barrier()  # every thread's partial stores precede the release below
            arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == splits - 1:  # the last of the tile's programs: sum in a fixed order
                tl.debug_barrier()
                acc = tl.load(p_tile, mask=mask, other=0.0, cache_modifier=".cg")
                for s in range(1, splits):
                    acc += tl.load(p_tile + s * slice_stride, mask=mask, other=0.0, cache_modifier=".cg")
                tl.store(counter, 0)  # clean for the next call (stream-ordered)
                _epilogue(
                    acc,
                    y_ptr,
                    ws_ptr,
                    xs_ptr,
                    b_ptr,
                    offs_m,
                    offs_n,
                    mask_m,
                    mask_n,
                    stride_ym,
                    A8,
                    BLOCK_SCALES,
                    HAS_BIAS,
                )
    elif GATED:
        _gated_epilogue(
            acc,
            acc_u,
            y_ptr,
            ws_ptr,
            xs_ptr,
            b_ptr,
            offs_m,
            offs_n,
            mask_m,
            mask_n,
            N,
            stride_ym,
            A8,
            HAS_BIAS,
        )
    else:
        _epilogue(
            acc,
            y_ptr,
            ws_ptr,
            xs_ptr,
            b_ptr,
            offs_m,
            offs_n,
            mask_m,
            mask_n,
            stride_ym,
            A8,
            BLOCK_SCALES,
            HAS_BIAS,
        )


@triton.jit
def splitk_reduce_row(
    p_ptr,
    ws_ptr,
    xs_ptr,
    b_ptr,
    m,
    offs_n,
    mask,
    M,
    N,
    SPLIT_K: tl.constexpr,
    A8: tl.constexpr,
    CHANNEL_SCALES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Columns ``offs_n`` of row ``m`` of the split-K output in float32, from the partials
    ``[SPLIT_K, M, N]``: summed in the order ``0 .. SPLIT_K - 1``, times the per-channel weight
    scales, times the row's token scale, plus the bias, each a float32 rounding. The one code
    both :func:`_splitk_reduce_kernel` and the fused reduce + add + RMSNorm of
    :mod:`surge.kernels.add_rmsnorm` run, so the two round identically (the caller casts)."""
    row = p_ptr + m.to(tl.int64) * N + offs_n
    acc = tl.load(row, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(row + s * M * N, mask=mask, other=0.0)
    if CHANNEL_SCALES:
        acc = acc * tl.load(ws_ptr + offs_n, mask=mask, other=0.0)
    if A8:
        acc = acc * tl.load(xs_ptr + m)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask, other=0.0).to(tl.float32)
    return acc


@triton.jit(do_not_specialize=["M"])
def _splitk_reduce_kernel(
    y_ptr,
    p_ptr,
    ws_ptr,
    xs_ptr,
    b_ptr,
    M,
    N,
    stride_ym,
    SPLIT_K: tl.constexpr,
    A8: tl.constexpr,
    CHANNEL_SCALES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    m = tl.program_id(1)
    offs_n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs_n < N
    pdl_wait(PDL)
    acc = splitk_reduce_row(
        p_ptr, ws_ptr, xs_ptr, b_ptr, m, offs_n, mask, M, N, SPLIT_K, A8, CHANNEL_SCALES, HAS_BIAS
    )
    tl.store(y_ptr + m.to(tl.int64) * stride_ym + offs_n, acc.to(y_ptr.dtype.element_ty), mask=mask)


def fp8_linear_splitk(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    config: Fp8SplitKConfig | None = None,
    block_size: tuple[int, int] | None = None,
    out: torch.Tensor | None = None,
    workspace: SplitKWorkspace | None = None,
    x_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    pdl: bool | None = None,
    gated: bool = False,
) -> torch.Tensor:
    """``x @ dequant(weight)^T + bias`` with an FP8 weight, split over ``K``; with ``gated``,
    SwiGLU's ``silu(y[:, :N/2]) * y[:, N/2:]`` of that product instead (see below).

    Args:
        x: ``[M, K]`` fp16/bf16/fp32, last dim contiguous; quantized per token first in the
            w8a8 mode (``config.a8``, fp16/bf16 only).
        weight: ``[N, K]`` float8_e4m3fn, last dim contiguous.
        scale: float32 dequantization multipliers: ``[N]`` (or ``[1, N]``) contiguous per
            output channel, or ``[cdiv(N, bn), cdiv(K, bk)]`` (last dim contiguous) with
            ``block_size = (bn, bk)``.
        bias: optional contiguous ``[N]`` in ``x``'s dtype (added in fp32).
        config: launch config; default :func:`default_splitk_config` (with ``block_k`` at
            most ``bk``'s largest power-of-two divisor under block scales); ``config.tma``
            loads the weight through a TMA descriptor (see :func:`check_tma_weight`).
        block_size: ``(bn, bk)`` of block scales, None for per-channel scales.
        out: optional ``[M, N]`` output in ``x``'s dtype, last dim contiguous.
        workspace: the persistent scratch of ``config.reduce == "inline"`` (at least
            :func:`splitk_workspace_size`, on ``x``'s device, counters zero); None allocates a
            fresh one for this call (correct, but a zero-fill per call: the engine passes one).
        x_scale: ``[M, 1]`` float32 per-token scales of an ``x`` already quantized to
            float8_e4m3fn (e.g. by :func:`surge.kernels.add_rmsnorm.add_rmsnorm_fp8`): w8a8
            only (per-channel or block weight scales), nothing quantized here; the output (and
            ``bias``) then has ``out_dtype`` (fp16/bf16) instead of ``x``'s dtype.
        out_dtype: the output dtype with ``x_scale``; ignored without it.
        pdl: launch with programmatic dependent launch (sm90+ only, see
            :mod:`surge.kernels.pdl`); None: :func:`surge.kernels.pdl.use_pdl` of ``x``.
        gated: ``weight`` is a merged ``[gate; up]`` projection (``N`` even) and the result
            is ``silu(gate) * up``, ``[M, N/2]``: each program computes the gate tile and the
            up tile of its columns (rows ``N/2`` apart) and applies the SwiGLU in its epilogue,
            bit for bit what this function without ``gated`` followed by
            :func:`surge.kernels.silu_and_mul.silu_and_mul` gives (one launch and one
            ``[M, N]`` round trip less). Per-channel scales and ``split_k == 1`` only.

    Returns:
        ``[M, N]`` (``[M, N/2]`` with ``gated``) in ``x``'s dtype, fp32 accumulation; equal (up
        to summation order) to :func:`surge.quant.fp8.fp8_linear_reference` with
        ``quantize_input=config.a8`` (and ``block_size``).

    Raises:
        ValueError: mismatched shapes, dtypes or devices, a non-contiguous last dimension, a
            bad config (under block scales: a ``block_k`` that does not divide ``bk``), w8a8
            with fp32 ``x``, ``x_scale`` with a w8a16 config, a workspace too small or of
            the wrong dtype or device, or ``config.tma`` where TMA cannot run (see
            :func:`check_tma_weight`: not a CUDA sm90+ device outside the interpreter, a weight
            base or row stride not 16-byte aligned); with ``gated``: block scales, a config with
            ``split_k > 1`` or an odd ``N``.
    """
    y = _splitk(
        x, weight, scale, bias, config, block_size, out, workspace, x_scale, out_dtype, pdl, False, gated
    )
    assert isinstance(y, torch.Tensor)
    return y


def fp8_linear_splitk_partials(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    config: Fp8SplitKConfig,
    block_size: tuple[int, int] | None = None,
    x_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    pdl: bool | None = None,
) -> SplitKPartials:
    """:func:`fp8_linear_splitk` without its reduce launch: the GEMM kernel writes its float32
    partials and this returns them with what the reduction needs
    (:class:`surge.quant.fp8.SplitKPartials`), for a consumer that reduces them in its own
    kernel (:func:`surge.kernels.add_rmsnorm.add_rmsnorm_partials`). Arguments as
    :func:`fp8_linear_splitk`'s.

    Returns:
        ``SplitKPartials`` with ``partials [config.split_k, M, N]`` float32 (fresh), the
        per-channel ``scale`` (None under block scales), the token scales of the w8a8 mode
        (``x_scale`` or those computed here), ``bias`` and the output dtype.

    Raises:
        ValueError: as :func:`fp8_linear_splitk`, and for a config that does not reduce with
            the second launch (``split_k == 1`` or ``reduce != "kernel"``).
    """
    if config.split_k < 2 or config.reduce != "kernel":
        raise ValueError(f"only a split_k > 1 config with reduce='kernel' leaves partials, got {config}")
    p = _splitk(x, weight, scale, bias, config, block_size, None, None, x_scale, out_dtype, pdl, True, False)
    assert isinstance(p, SplitKPartials)
    return p


def _splitk(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    config: Fp8SplitKConfig | None,
    block_size: tuple[int, int] | None,
    out: torch.Tensor | None,
    workspace: SplitKWorkspace | None,
    x_scale: torch.Tensor | None,
    out_dtype: torch.dtype | None,
    pdl: bool | None,
    defer: bool,
    gated: bool,
) -> torch.Tensor | SplitKPartials:
    """The body of :func:`fp8_linear_splitk`; with ``defer`` (a ``split_k > 1`` ``"kernel"``
    config) it returns :class:`SplitKPartials` instead of launching the reduce kernel; with
    ``gated`` (not deferred) SwiGLU's output."""
    if x_scale is None:
        out_dtype = x.dtype
    m, n, k, scale_bn, scale_bk, stride_sn = check_fp8_gemm_args(
        x, weight, scale, block_size, bias, x_scale, out_dtype
    )
    assert out_dtype is not None
    if config is not None:
        cfg = config
    else:
        cfg = default_splitk_config(m, n, k)
        if block_size is not None:
            cfg = replace(cfg, block_k=min(cfg.block_k, block_size[1] & -block_size[1]))
    for v in (cfg.block_m, cfg.block_n, cfg.block_k):
        if v < 16 or v & (v - 1):
            raise ValueError(f"block sizes must be powers of two >= 16, got {cfg}")
    if cfg.split_k < 1:
        raise ValueError(f"split_k must be >= 1, got {cfg.split_k}")
    if cfg.reduce not in ("kernel", "inline"):
        raise ValueError(f"reduce must be 'kernel' or 'inline', got {cfg.reduce!r}")
    if pdl is None:
        pdl = use_pdl(x)
    if cfg.a8 and x.dtype == torch.float32:
        raise ValueError("the w8a8 mode takes fp16/bf16 activations")
    if x_scale is not None and not cfg.a8:
        raise ValueError("pre-quantized activations (x_scale) need a w8a8 config (a8=True)")
    if block_size is not None and scale_bk % cfg.block_k != 0:
        raise ValueError(f"block_k {cfg.block_k} must divide the scale block's {scale_bk} columns")
    if cfg.tma:
        check_tma_weight(weight)
    n_out = n
    if gated:
        if block_size is not None or cfg.split_k != 1 or n % 2 or defer:
            raise ValueError(
                f"gated (SwiGLU) output needs per-channel scales, split_k == 1 and an even N, got {cfg}, N = {n}"
            )
        n_out = n // 2
    if defer:
        out = None
    elif out is None:
        out = torch.empty((m, n_out), dtype=out_dtype, device=x.device)
    elif out.shape != (m, n_out) or out.dtype != out_dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {n_out}] {out_dtype} with a contiguous last dim")
    partials = cfg.split_k > 1
    inline = partials and cfg.reduce == "inline"
    if inline:
        floats, tiles = splitk_workspace_size(m, n, cfg)
        if workspace is None:
            workspace = SplitKWorkspace.allocate(floats, tiles, x.device)
        elif (
            workspace.partials.dtype != torch.float32
            or workspace.counters.dtype != torch.int32
            or workspace.partials.device != x.device
            or workspace.counters.device != x.device
            or workspace.partials.numel() < floats
            or workspace.counters.numel() < tiles
        ):
            raise ValueError(
                f"workspace must hold {floats} float32 partials and {tiles} int32 counters on {x.device}"
            )
    if defer and (m == 0 or n == 0):
        xs0 = x_scale if x_scale is not None else torch.empty((m, 1), dtype=torch.float32, device=x.device)
        return SplitKPartials(
            torch.empty((cfg.split_k, m, n), dtype=torch.float32, device=x.device),
            scale if block_size is None else None,
            xs0 if cfg.a8 else None,
            bias,
            out_dtype,
        )
    if m == 0 or n == 0:
        assert out is not None
        return out
    a, xs = x, scale
    if x_scale is not None:
        xs = x_scale
    elif cfg.a8:
        from surge.kernels.fp8_quant import per_token_quant_fp8

        a, xs = per_token_quant_fp8(x, pdl=pdl)
    steps = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k)  # BLOCK_K steps per K slice
    if inline:
        assert workspace is not None
        dest, counters = workspace.partials, workspace.counters
    elif partials:
        dest, counters = torch.empty((cfg.split_k, m, n), dtype=torch.float32, device=x.device), scale
    else:
        assert out is not None
        dest, counters = out, scale  # unused
    y = dest if out is None else out  # deferred: y is not written
    grid = (triton.cdiv(n_out, cfg.block_n), cfg.split_k, triton.cdiv(m, cfg.block_m))
    tma = cfg.tma and k > 0  # K = 0 loads nothing (and a descriptor needs a non-empty tensor)
    w_desc = TensorDescriptor.from_tensor(weight, [cfg.block_n, cfg.block_k]) if tma else weight
    _fp8_splitk_kernel[grid](
        y,
        dest,
        counters,
        a,
        weight,
        w_desc,
        scale,
        xs,
        bias if bias is not None else scale,
        m,
        n_out,
        k,
        steps,
        a.stride(0),
        weight.stride(0),
        n if out is None else out.stride(0),
        stride_sn,
        A8=cfg.a8,
        PARTIALS=partials,
        INLINE=inline,
        BLOCK_SCALES=block_size is not None,
        SCALE_BN=scale_bn,
        SCALE_BK=scale_bk,
        HAS_BIAS=bias is not None,
        EVEN_K=steps * cfg.block_k * cfg.split_k == k,
        DOT_IEEE=x.dtype == torch.float32,
        PROMOTE_K=min(cfg.block_k, FP8_PROMOTE_K),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        TMA=tma,
        GATED=gated,
        PDL=pdl,
        num_stages=cfg.num_stages,
        num_warps=cfg.num_warps,
        launch_pdl=pdl,
    )
    if defer:
        return SplitKPartials(
            dest, scale if block_size is None else None, xs if cfg.a8 else None, bias, out_dtype
        )
    if partials and not inline:
        assert out is not None
        block = min(1024, max(128, triton.next_power_of_2(n)))
        _splitk_reduce_kernel[(triton.cdiv(n, block), m)](
            out,
            dest,
            scale,
            xs,
            bias if bias is not None else scale,
            m,
            n,
            out.stride(0),
            SPLIT_K=cfg.split_k,
            A8=cfg.a8,
            CHANNEL_SCALES=block_size is None,
            HAS_BIAS=bias is not None,
            BLOCK=block,
            PDL=pdl,
            num_warps=4,
            launch_pdl=pdl,
        )
    return out
