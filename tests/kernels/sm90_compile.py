"""Compile every Triton kernel of ``surge/kernels`` for sm90 (Hopper, the H200) on a machine
without a GPU, through the engine's own launchers.

Triton's CPU interpreter (``TRITON_INTERPRET=1``, what this directory's tests run) accepts code
the real compiler rejects, e.g. a name bound to tensors of two shapes in the branches of a
run-time ``if`` (session 42). Triton ships its NVIDIA backend with LLVM and ``ptxas``, so the
kernels compile for ``GPUTarget("cuda", 90, 32)`` here; what it lacks is a CUDA driver. Run as
``python -m tests.kernels.sm90_compile`` (without ``TRITON_INTERPRET``), this module:

- makes a stand-in driver active (:class:`Sm90Driver`: target sm90, device 0, stream 0), so that
  ``kernel[grid](...)`` in a launcher binds and specialises its arguments exactly as on the GPU
  (dtypes, 16-byte alignment, integers equal to 1 or divisible by 16, constexprs, ``num_warps``,
  ``num_stages``, ``launch_pdl``), from small CPU tensors;
- replaces ``JITFunction._do_compile`` (Triton 3.6) by a wrapper that compiles to a cubin,
  records the result and returns None, which makes the launch return before it would run;
- turns on what an sm90 GPU turns on: :func:`surge.kernels.pdl.use_pdl` and
  :func:`surge.kernels.fp8_gemm_splitk.tma_supported` answer True;
- calls each :data:`VARIANTS` entry (the real launchers with the flags the engine passes) and
  prints one JSON line per variant: ``{"variant", "kernels": {"module:name": {...}}, "errors":
  [...]}`` (see :func:`_install_sm90` for a kernel's fields).

:func:`_bad_shape_kernel` is a deliberately broken kernel (the session-42 bug) that the
interpreter runs and sm90 must refuse: its variant proves the harness catches that class.
``tests/kernels/test_sm90_compile.py`` runs this once and checks it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

QWEN3_8B = {"hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "inter": 12288}
"""The reference model's shapes (Qwen3-8B, TP=1), which the launches below use."""


@triton.jit
def _bad_shape_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Deliberately wrong: ``acc`` is ``[BLOCK]`` in one branch of a run-time ``if`` and ``[1]``
    in the other. The interpreter runs whichever branch ``n`` selects (the store broadcasts
    both); the compiler must refuse to merge the two types."""
    offs = tl.arange(0, BLOCK)
    if n > BLOCK:
        acc = tl.load(x_ptr + offs)
    else:
        acc = tl.full([1], 0.0, tl.float32)
    tl.store(out_ptr + offs, acc * 2.0)


@dataclass(frozen=True)
class Variant:
    """One launch (or a launcher's chain of launches) to compile.

    Attributes:
        name: unique label, printed in the results.
        kernels: ``"module:function"`` of every kernel the launch compiles (module without the
            ``surge.kernels.`` prefix); the test checks the compiled set equals this.
        run: calls the launcher(s) with CPU tensors.
        expect_fail: the deliberately broken kernel, which must not compile.
        tma: the split-K GEMM of this launch loads its weight through TMA.
    """

    name: str
    kernels: tuple[str, ...]
    run: Callable[[], object]
    expect_fail: bool = False
    tma: bool = False


def _e(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def _i32(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.int32)


# --- norms, activations, quantization -------------------------------------------------------


def _add_rmsnorm(fp8: bool, residual: bool) -> None:
    from surge.kernels.add_rmsnorm import add_rmsnorm, add_rmsnorm_fp8

    h = QWEN3_8B["hidden"]
    x, w = _e(4, h), _e(h)
    (add_rmsnorm_fp8 if fp8 else add_rmsnorm)(x, w, 1e-6, _e(4, h) if residual else None)


def _norm_partials(fp8: bool, a8: bool, block: bool) -> None:
    """The split-K GEMM's partials of the o/down projection summed by the next RMSNorm
    (``Fp8LinearMethod.apply_partials``: the GEMM with a ``split_k > 1``, ``reduce="kernel"``
    config, then :func:`add_rmsnorm_partials`)."""
    from surge.kernels.add_rmsnorm import add_rmsnorm_partials, add_rmsnorm_partials_fp8
    from surge.kernels.fp8_gemm_splitk import Fp8SplitKConfig, fp8_linear_splitk_partials

    h = QWEN3_8B["hidden"]
    m = 4
    cfg = Fp8SplitKConfig(16, 64, 128, 4, 4, 4, a8, "kernel")
    scale = _e(h // 128, h // 128, dtype=torch.float32) if block else _e(h, dtype=torch.float32)
    p = fp8_linear_splitk_partials(
        _e(m, h),
        _e(h, h, dtype=torch.float8_e4m3fn),
        scale,
        config=cfg,
        block_size=(128, 128) if block else None,
    )
    (add_rmsnorm_partials_fp8 if fp8 else add_rmsnorm_partials)(p, _e(h), 1e-6, _e(m, h))


def _silu(fp8: bool) -> None:
    from surge.kernels.silu_and_mul import silu_and_mul, silu_and_mul_fp8

    x = _e(4, 2 * QWEN3_8B["inter"])
    silu_and_mul_fp8(x) if fp8 else silu_and_mul(x)


def _per_token_quant() -> None:
    from surge.kernels.fp8_quant import per_token_quant_fp8

    per_token_quant_fp8(_e(4, QWEN3_8B["hidden"]))


def _group_quant() -> None:
    from surge.kernels.fp8_group_quant import per_token_group_quant_fp8
    from surge.quant.fp8_linear import BLOCK_SCALED_MM_ROWS

    per_token_group_quant_fp8(_e(100, QWEN3_8B["hidden"]), BLOCK_SCALED_MM_ROWS)


# --- GEMMs ----------------------------------------------------------------------------------


def _fp8_gemm(m: int, block: bool, bias: bool, dtype: torch.dtype = torch.bfloat16) -> None:
    """The weight-only FP8 GEMM (shapes ``_scaled_mm`` cannot take, non-bf16 models, block
    scales off the split-K tables)."""
    from surge.kernels.fp8_gemm import fp8_linear

    n, k = 6144, QWEN3_8B["hidden"]
    scale = _e(n // 128, k // 128, dtype=torch.float32) if block else _e(n, dtype=torch.float32)
    fp8_linear(
        _e(m, k, dtype=dtype),
        _e(n, k, dtype=torch.float8_e4m3fn),
        scale,
        _e(n, dtype=dtype) if bias else None,
        block_size=(128, 128) if block else None,
    )


def _splitk(n: int, k: int, m: int, tiles: tuple[object, ...], how: str) -> None:
    """One config of the split-K FP8 GEMM as ``Fp8LinearMethod`` launches it: ``apply``
    (``"apply"``, the inline workspace where the config reduces inline), ``apply_partials``
    (``"partials"``, a row-parallel layer whose partials the next norm sums), ``apply_gated``
    (``"gated"``, half the column tile), or with block scales (``"block"``: ``tiles`` made by
    :func:`block_splitk_config` / :func:`block_prefill_config`)."""
    from surge.kernels.fp8_gemm_splitk import (
        Fp8SplitKConfig,
        SplitKWorkspace,
        fp8_linear_splitk,
        fp8_linear_splitk_partials,
        splitk_workspace_size,
    )

    cfg = Fp8SplitKConfig(*tiles)  # type: ignore[arg-type]
    x, w = _e(m, k), _e(n, k, dtype=torch.float8_e4m3fn)
    if how == "block":
        scale = _e(triton.cdiv(n, 128), triton.cdiv(k, 128), dtype=torch.float32)
        floats, tiles_n = splitk_workspace_size(m, n, cfg)
        ws = SplitKWorkspace.allocate(floats, tiles_n, x.device) if floats else None
        fp8_linear_splitk(x, w, scale, config=cfg, block_size=(128, 128), workspace=ws)
        return
    scale = _e(n, dtype=torch.float32)
    if how == "partials":
        fp8_linear_splitk_partials(x, w, scale, config=cfg)
    elif how == "gated":
        cfg = dataclasses.replace(cfg, block_n=max(16, cfg.block_n // 2))
        fp8_linear_splitk(x, w, scale, config=cfg, gated=True)
    else:
        floats, tiles_n = splitk_workspace_size(m, n, cfg)
        ws = SplitKWorkspace.allocate(floats, tiles_n, x.device) if floats else None
        fp8_linear_splitk(x, w, scale, config=cfg, workspace=ws)


_ROW_PARALLEL = {(4096, 4096), (4096, 12288)}
"""The measured shapes whose outputs an RMSNorm reduces (o and down): their ``split_k > 1``,
``reduce="kernel"`` configs run through ``apply_partials``."""


def _splitk_variants() -> list[Variant]:
    """Every distinct config of ``SPLITK_MEASURED`` (per-channel scales), at the smallest token
    bucket that uses it (``M`` is not specialised, so every bucket of a config is one binary),
    the way the engine launches it; plus the gated gate_up launches and the block-scaled decode
    and prefill configs."""
    from surge.kernels.fp8_gemm_splitk import Fp8SplitKConfig
    from surge.quant.fp8_linear import (
        SPLITK_BLOCK_FASTER,
        SPLITK_MEASURED,
        block_prefill_config,
        block_splitk_config,
    )

    gemm, reduce = "fp8_gemm_splitk:_fp8_splitk_kernel", "fp8_gemm_splitk:_splitk_reduce_kernel"
    quant = "fp8_quant:_per_token_quant_kernel"
    out: list[Variant] = []
    seen: set[tuple[object, ...]] = set()
    for (n, k), by_m in sorted(SPLITK_MEASURED.items()):
        for m, tiles in sorted(by_m.items()):
            if tiles is None:
                continue
            cfg = Fp8SplitKConfig(*tiles)  # type: ignore[arg-type]
            fields = dataclasses.astuple(cfg)
            how = "apply"
            if cfg.split_k > 1 and cfg.reduce == "kernel" and (n, k) in _ROW_PARALLEL:
                how = "partials"
            kernels = [gemm]
            if cfg.a8:
                kernels.append(quant)
            if how == "apply" and cfg.split_k > 1 and cfg.reduce == "kernel":
                kernels.append(reduce)
            if (how, fields) not in seen:
                seen.add((how, fields))
                name = f"splitk {n}x{k} m{m} {how} {fields}"
                out.append(Variant(name, tuple(kernels), _bind(_splitk, n, k, m, fields, how), tma=cfg.tma))
            if cfg.split_k == 1 and ("gated", fields) not in seen:
                seen.add(("gated", fields))
                name = f"splitk {n}x{k} m{m} gated {fields}"
                out.append(
                    Variant(name, tuple(kernels), _bind(_splitk, n, k, m, fields, "gated"), tma=cfg.tma)
                )
    for n, k in sorted(SPLITK_BLOCK_FASTER)[:2]:
        cfg = block_splitk_config(1, n, k, (128, 128), a8=True)
        fields = dataclasses.astuple(cfg)
        kernels = [gemm, quant] + ([reduce] if cfg.split_k > 1 and cfg.reduce == "kernel" else [])
        name = f"splitk block {n}x{k} m1 {fields}"
        out.append(Variant(name, tuple(kernels), _bind(_splitk, n, k, 1, fields, "block"), tma=cfg.tma))
    prefill = block_prefill_config((128, 128))
    if prefill is not None:
        fields = dataclasses.astuple(prefill)
        kernels = [gemm] + ([quant] if prefill.a8 else [])
        name = f"splitk block prefill 4096x4096 m200 {fields}"
        run = _bind(_splitk, 4096, 4096, 200, fields, "block")
        out.append(Variant(name, tuple(kernels), run, tma=prefill.tma))
    return out


def _skinny(m: int, bias: bool, dtype: torch.dtype = torch.bfloat16) -> None:
    from surge.kernels.skinny_gemm import skinny_linear

    n, k = 6144, QWEN3_8B["hidden"]
    skinny_linear(_e(m, k, dtype=dtype), _e(n, k, dtype=dtype), _e(n, dtype=dtype) if bias else None)


# --- attention ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Batch:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    positions: torch.Tensor


def _batch(num_seqs: int, q_len: int, fp8: bool, dtype: torch.dtype = torch.bfloat16) -> _Batch:
    """A step of ``num_seqs`` sequences of ``q_len`` new tokens over a 16-token-block cache, in
    the model's ``dtype`` (``--dtype``: bf16, fp16 or fp32)."""
    heads, kv_heads, d = QWEN3_8B["heads"], QWEN3_8B["kv_heads"], QWEN3_8B["head_dim"]
    t = num_seqs * q_len
    cache_dtype = torch.float8_e4m3fn if fp8 else dtype
    return _Batch(
        q=_e(t, heads, d, dtype=dtype),
        k=_e(t, kv_heads, d, dtype=dtype),
        v=_e(t, kv_heads, d, dtype=dtype),
        k_cache=_e(64, 16, kv_heads, d, dtype=cache_dtype),
        v_cache=_e(64, 16, kv_heads, d, dtype=cache_dtype),
        query_start_loc=_i32(num_seqs + 1),
        seq_lens=_i32(num_seqs),
        block_table=_i32(num_seqs, 8),
        slot_mapping=torch.zeros(t, dtype=torch.int64),
        positions=torch.zeros(t, dtype=torch.int64),
    )


def _rope_tables(dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d = QWEN3_8B["head_dim"]
    return _e(4096, d // 2, dtype=torch.float32), _e(4096, d // 2, dtype=torch.float32), _e(d, dtype=dtype)


def _decode(fp8: bool, splits: int, inline: bool, rope: bool, dtype: torch.dtype = torch.bfloat16) -> None:
    """The decode grid (``max_query_len == 1``) as ``TritonAttentionBackend.forward`` calls it:
    split counters on (inline merge) or off (the reduce kernel), the q/k norm, rotary and K/V
    write fused (``rope``) or not."""
    from surge.kernels.kv_write import RopeKvWrite
    from surge.kernels.paged_attention import paged_attention

    b = _batch(4, 1, fp8, dtype)
    rkw = None
    if rope:
        cos, sin, norm_w = _rope_tables(dtype)
        rkw = RopeKvWrite(b.k, b.v, b.positions, cos, sin, b.slot_mapping, norm_w, norm_w, 1e-6)
    counters = _i32(4 * QWEN3_8B["kv_heads"]) if inline else None
    paged_attention(
        b.q,
        b.k_cache,
        b.v_cache,
        b.query_start_loc,
        b.seq_lens,
        b.block_table,
        0.088,
        num_splits=splits,
        max_query_len=1,
        k_scale=0.5,
        v_scale=0.5,
        rope=rkw,
        split_counters=counters,
    )


def _mixed(fp8: bool, skip: bool, dtype: torch.dtype = torch.bfloat16) -> None:
    """The mixed grid (chunked prefill with decodes); ``skip``: the short sequences of a step
    whose long ones went to the prefill kernel."""
    from surge.kernels.paged_attention import paged_attention

    b = _batch(4, 8, fp8, dtype)
    paged_attention(
        b.q,
        b.k_cache,
        b.v_cache,
        b.query_start_loc,
        b.seq_lens,
        b.block_table,
        0.088,
        max_query_len=8,
        k_scale=0.5,
        v_scale=0.5,
        skip_query_len=64 if skip else None,
    )


def _prefill(fp8: bool, dtype: torch.dtype = torch.bfloat16) -> None:
    from surge.kernels.prefill_attention import prefill_attention

    b = _batch(2, 64, fp8, dtype)
    prefill_attention(
        b.q,
        b.k,
        b.v,
        b.k_cache,
        b.v_cache,
        b.query_start_loc,
        b.seq_lens,
        b.block_table,
        0.088,
        min_query_len=64,
        k_scale=0.5,
        v_scale=0.5,
    )


def _kv_write(fp8: bool, rope: bool, norm: bool) -> None:
    """:func:`write_kv_cache` (``rope`` off) or :func:`fused_qk_norm_rope_kv_write` (the
    unfused path of ``RopeKvWrite.apply``)."""
    from surge.kernels.kv_write import fused_qk_norm_rope_kv_write, write_kv_cache

    b = _batch(4, 8, fp8)
    if not rope:
        write_kv_cache(b.k, b.v, b.k_cache, b.v_cache, b.slot_mapping, 0.5, 0.5)
        return
    cos, sin, w = _rope_tables()
    fused_qk_norm_rope_kv_write(
        b.q,
        b.k,
        b.v,
        b.positions,
        cos,
        sin,
        b.k_cache,
        b.v_cache,
        b.slot_mapping,
        w if norm else None,
        w if norm else None,
        1e-6,
        0.5,
        0.5,
    )


# --- sampling -------------------------------------------------------------------------------


def _bitmask() -> None:
    from surge.kernels.token_bitmask import apply_token_bitmask

    vocab = 151936
    apply_token_bitmask(_e(4, vocab, dtype=torch.float32), _i32(4, triton.cdiv(vocab, 32)), _i32(4))


def _topk(rows: int) -> None:
    from surge.kernels.topk import topk_rows

    topk_rows(_e(rows, 151936, dtype=torch.float32), 64)


def _window_sample() -> None:
    from surge.kernels.window_sample import window_sample

    b, w = 4, 64
    f32 = torch.float32
    window_sample(
        _e(b, w, dtype=f32),
        torch.zeros(b, w, dtype=torch.int64),
        _e(b, 151936, dtype=f32),
        _e(b, dtype=f32),
        torch.ones(b, dtype=torch.int64),
        _e(b, dtype=f32),
        _e(b, dtype=f32),
        _e(b, w + 2, dtype=f32),
        1e-5,
    )


def _bad() -> None:
    x = _e(64, dtype=torch.float32)
    _bad_shape_kernel[(1,)](x, x, 64, BLOCK=64)


def _bind(fn: Callable[..., None], *args: object) -> Callable[[], None]:
    return lambda: fn(*args)


def _variants() -> list[Variant]:
    ar, sar = "add_rmsnorm:_add_rmsnorm_kernel", "add_rmsnorm:_splitk_add_rmsnorm_kernel"
    gemm, quant = "fp8_gemm_splitk:_fp8_splitk_kernel", "fp8_quant:_per_token_quant_kernel"
    pa, red = "paged_attention:_paged_attention_kernel", "attention_reduce:_attention_reduce_kernel"
    kvw, pf = "kv_write:_kv_write_kernel", "prefill_attention:_prefill_attention_kernel"
    w8, sk = "fp8_gemm:_fp8_gemm_kernel", "skinny_gemm:_skinny_gemm_kernel"
    f32 = torch.float32
    v = [
        Variant("add_rmsnorm bf16 no-residual", (ar,), _bind(_add_rmsnorm, False, False)),
        Variant("add_rmsnorm bf16 residual", (ar,), _bind(_add_rmsnorm, False, True)),
        Variant("add_rmsnorm fp8-out residual", (ar,), _bind(_add_rmsnorm, True, True)),
        Variant("norm partials bf16 w8a16", (gemm, sar), _bind(_norm_partials, False, False, False)),
        Variant("norm partials fp8-out w8a8", (gemm, quant, sar), _bind(_norm_partials, True, True, False)),
        Variant(
            "norm partials fp8-out w8a8 block", (gemm, quant, sar), _bind(_norm_partials, True, True, True)
        ),
        Variant("silu_and_mul bf16", ("silu_and_mul:_silu_and_mul_kernel",), _bind(_silu, False)),
        Variant("silu_and_mul fp8-out", ("silu_and_mul:_silu_and_mul_fp8_kernel",), _bind(_silu, True)),
        Variant("per_token_quant", (quant,), _per_token_quant),
        Variant("group_quant", ("fp8_group_quant:_group_quant_kernel",), _group_quant),
        Variant("fp8_gemm m1 channel", (w8,), _bind(_fp8_gemm, 1, False, False)),
        Variant("fp8_gemm m200 block bias", (w8,), _bind(_fp8_gemm, 200, True, True)),
        Variant("fp8_gemm m1 fp32 (IEEE dot)", (w8,), _bind(_fp8_gemm, 1, False, False, f32)),
        *_splitk_variants(),
        Variant("skinny m1", (sk,), _bind(_skinny, 1, False)),
        Variant("skinny m16 bias", (sk,), _bind(_skinny, 16, True)),
        Variant("skinny m1 fp32 (IEEE dot)", (sk,), _bind(_skinny, 1, False, f32)),
        Variant("decode bf16", (pa,), _bind(_decode, False, 1, False, False)),
        Variant("decode bf16 splits reduce-kernel", (pa, red), _bind(_decode, False, 4, False, False)),
        Variant("decode bf16 splits inline rope", (pa,), _bind(_decode, False, 4, True, True)),
        Variant("decode fp8-kv splits inline rope", (pa,), _bind(_decode, True, 4, True, True)),
        Variant("decode fp8-kv", (pa,), _bind(_decode, True, 1, False, False)),
        Variant("mixed bf16", (pa,), _bind(_mixed, False, False)),
        Variant("mixed fp8-kv skip", (pa,), _bind(_mixed, True, True)),
        Variant("decode fp16 splits inline rope", (pa,), _bind(_decode, False, 4, True, True, torch.float16)),
        Variant("decode fp32 splits reduce-kernel", (pa, red), _bind(_decode, False, 4, False, False, f32)),
        Variant("mixed fp32", (pa,), _bind(_mixed, False, False, f32)),
        Variant("prefill bf16", (pf,), _bind(_prefill, False)),
        Variant("prefill fp8-kv", (pf,), _bind(_prefill, True)),
        Variant("prefill fp32", (pf,), _bind(_prefill, False, f32)),
        Variant("kv_write bf16", (kvw,), _bind(_kv_write, False, False, False)),
        Variant("kv_write fp8", (kvw,), _bind(_kv_write, True, False, False)),
        Variant("qk_norm_rope_kv_write bf16", (kvw,), _bind(_kv_write, False, True, True)),
        Variant("rope_kv_write fp8 no-norm", (kvw,), _bind(_kv_write, True, True, False)),
        Variant("token_bitmask", ("token_bitmask:_token_bitmask_kernel",), _bitmask),
        Variant("topk 4 rows", ("topk:_chunk_kernel", "topk:_merge_kernel"), _bind(_topk, 4)),
        Variant("topk 64 rows", ("topk:_chunk_kernel", "topk:_merge_kernel"), _bind(_topk, 64)),
        # top_p/min_p on or off is a run-time flag (do_not_specialize): one binary for both
        Variant("window_sample top_p min_p", ("window_sample:_kernel",), _window_sample),
        Variant("bad shape (must fail)", ("sm90_compile:_bad_shape_kernel",), _bad, expect_fail=True),
    ]
    return v


def declared_kernels() -> set[str]:
    """``"module:function"`` of every kernel the variants compile (the broken one excepted),
    for the test that every launched kernel of ``surge/kernels`` is in the list. Needs no GPU
    and no compile."""
    return {k for v in _variants() if not v.expect_fail for k in v.kernels}


def _install_sm90() -> dict[str, dict[str, object]]:
    """Make the stand-in sm90 driver active and route every JIT compile into the returned
    record (``"module:function" -> {"cubin", "pdl_wait", "tma", "shared", "error", "secs"}``: a
    non-empty cubin, ``griddepcontrol.wait`` and TMA loads in the PTX, the shared memory the
    kernel asks for per block (bytes; the largest over the variant's compiles of it), the
    compiler's error, the time; the last compile of each otherwise)."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    import surge.kernels.fp8_gemm_splitk as splitk_mod
    import surge.kernels.pdl as pdl_mod

    class Sm90Driver(DriverBase):
        """Reports an sm90 device 0 and stream 0; nothing is ever launched through it."""

        @classmethod
        def is_active(cls) -> bool:
            return False

        def map_python_to_cpp_type(self, ty: str) -> str:
            raise NotImplementedError

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self) -> torch.device:
            return torch.device("cpu")

        def get_benchmarker(self) -> Callable[..., object]:
            raise NotImplementedError

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

    driver.set_active(Sm90Driver())
    record: dict[str, dict[str, object]] = {}
    original = JITFunction._do_compile

    def compile_only(self, key, signature, device, constexprs, options, attrs, warmup):
        module = self.fn.__module__.rsplit(".", 1)[-1]
        name = f"{'sm90_compile' if module == '__main__' else module}:{self.fn.__name__}"
        start = time.perf_counter()
        result: dict[str, object] = {
            "cubin": False,
            "pdl_wait": False,
            "tma": False,
            "shared": 0,
            "error": None,
        }
        try:
            kernel = original(self, key, signature, device, constexprs, options, attrs, True)
            ptx = kernel.asm.get("ptx", "")
            result["cubin"] = len(kernel.asm.get("cubin", b"")) > 0
            result["pdl_wait"] = "griddepcontrol.wait" in ptx
            result["tma"] = "cp.async.bulk.tensor" in ptx
            result["shared"] = int(kernel.metadata.shared)
        except Exception as exc:  # every compile failure is a result
            result["error"] = f"{type(exc).__name__}: {exc}".strip()[-1500:]
        finally:
            # forget the in-memory entry, or the next launch of this key would run the kernel
            self.device_caches[device][0].pop(key, None)
        result["secs"] = round(time.perf_counter() - start, 2)
        if name in record:  # another config of the same kernel in this variant
            result["shared"] = max(int(record[name]["shared"]), int(result["shared"]))  # type: ignore[call-overload]
        record[name] = result
        return None  # run() returns before launching

    JITFunction._do_compile = compile_only  # type: ignore[method-assign]
    # what an sm90 GPU turns on (the launchers look these up at call time)
    for mod in list(sys.modules.values()):
        if (
            mod is not None
            and getattr(mod, "__name__", "").startswith("surge.kernels.")
            and hasattr(mod, "use_pdl")
        ):
            mod.use_pdl = lambda x: True  # type: ignore[attr-defined]
    pdl_mod.use_pdl = lambda x: True  # type: ignore[assignment]
    splitk_mod.tma_supported = lambda device: True  # type: ignore[assignment]
    return record


def main() -> int:
    """Compile every variant, print one JSON line each; exit 0 (failures are in the JSON)."""
    if os.environ.get("TRITON_INTERPRET"):
        print("sm90_compile: unset TRITON_INTERPRET (this compiles for the GPU)", file=sys.stderr)
        return 2
    # import every kernel module first so that their use_pdl names get replaced
    import importlib
    import pkgutil

    import surge.kernels

    for info in pkgutil.iter_modules(surge.kernels.__path__):
        if info.name != "stream_decode":
            importlib.import_module(f"surge.kernels.{info.name}")
    variants = _variants()
    only = set(sys.argv[1:])
    record = _install_sm90()
    for v in variants:
        if only and v.name not in only:
            continue
        record.clear()
        errors = []
        try:
            v.run()
        except Exception:  # a launcher that raises fails its variant
            errors.append(traceback.format_exc()[-1500:])
        errors += [f"{k}: {r['error']}" for k, r in record.items() if r["error"]]
        print(json.dumps({"variant": v.name, "kernels": record, "errors": errors}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
