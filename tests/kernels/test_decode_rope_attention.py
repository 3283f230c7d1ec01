"""The decode grid's own q/k RMSNorm, rotary and K/V write (``paged_attention(..., rope=...)``)
against the two launches it replaces: ``fused_qk_norm_rope_kv_write`` then ``paged_attention``."""

from __future__ import annotations

import pytest
import torch

from surge.kernels.kv_write import RopeKvWrite, fused_qk_norm_rope_kv_write
from surge.kernels.paged_attention import AttentionTileConfig, decode_rope_supported, paged_attention
from tests.kernels.attn_utils import make_batch, reverse_interpreter_programs

SMALL_TILE = AttentionTileConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def _programs_in_reverse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the interpreter, run the grid's programs last to first: a split that read the new
    K/V before the writing split had stored it would then see the stale cache (in grid order
    an early writer would pass by luck). On a GPU the programs race for real."""
    reverse_interpreter_programs(monkeypatch)


def _tables(max_pos: int, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    ang = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return ang.cos().to(DEVICE), ang.sin().to(DEVICE)


def _case(
    q_lens: list[int],
    seq_lens: list[int],
    dtype: torch.dtype,
    cache_dtype: torch.dtype | None,
    norm: bool,
    num_splits: int,
    head_dim: int = 32,
    num_pad_tokens: int = 2,
    num_kv_heads: int = 2,
    config: AttentionTileConfig | None = SMALL_TILE,
    min_kv_per_split: int = 32,
) -> None:
    heads = 4 * num_kv_heads
    batch = make_batch(
        q_lens,
        seq_lens,
        heads,
        num_kv_heads,
        head_dim,
        dtype=dtype,
        device=DEVICE,
        num_pad_tokens=num_pad_tokens,
    )
    md = batch.metadata
    k_scale, v_scale = (0.5, 0.25) if cache_dtype == FP8 else (1.0, 1.0)
    k_cache, v_cache = batch.k_cache, batch.v_cache
    if cache_dtype == FP8:
        k_cache = k_cache.float().clamp(-448, 448).to(FP8)
        v_cache = v_cache.float().clamp(-448, 448).to(FP8)
    gen = torch.Generator().manual_seed(1)
    qn = (1 + 0.1 * torch.randn(head_dim, generator=gen)).to(dtype).to(DEVICE) if norm else None
    kn = (1 + 0.1 * torch.randn(head_dim, generator=gen)).to(dtype).to(DEVICE) if norm else None
    cos, sin = _tables(max(seq_lens) + 1, head_dim // 2)
    total = batch.q.shape[0]
    positions = torch.zeros(total, dtype=torch.int64)
    t = 0
    for ql, sl in zip(q_lens, seq_lens, strict=True):
        for i in range(ql):
            positions[t] = sl - ql + i
            t += 1
    positions = positions.to(DEVICE)
    slots = torch.cat([md.slot_mapping, torch.full((total - md.num_tokens,), -1, device=DEVICE)])

    # the two launches the fused decode replaces
    q_ref, k_ref = batch.q.clone(), batch.k.clone()
    kc_ref, vc_ref = k_cache.clone(), v_cache.clone()
    fused_qk_norm_rope_kv_write(
        q_ref, k_ref, batch.v, positions, cos, sin, kc_ref, vc_ref, slots, qn, kn, 1e-6, k_scale, v_scale
    )
    args = (md.query_start_loc, md.seq_lens, md.block_table, head_dim**-0.5)
    kw = dict(num_splits=num_splits, max_query_len=1, config=config, min_kv_per_split=min_kv_per_split)
    out_ref = paged_attention(q_ref, kc_ref, vc_ref, *args, k_scale=k_scale, v_scale=v_scale, **kw)

    # the fused launch twice over the same cache: the reduce kernel, then the in-kernel merge
    # (the write stores the same bytes again)
    k_cache_in, v_cache_in = k_cache.clone(), v_cache.clone()
    q_in, k_in = batch.q.clone(), batch.k.clone()
    rope = RopeKvWrite(k_in, batch.v, positions, cos, sin, slots, qn, kn, 1e-6)
    out = paged_attention(q_in, k_cache, v_cache, *args, k_scale=k_scale, v_scale=v_scale, rope=rope, **kw)
    counters = torch.zeros(len(q_lens) * num_kv_heads, dtype=torch.int32, device=DEVICE)
    out_inline = paged_attention(
        q_in,
        k_cache_in,
        v_cache_in,
        *args,
        k_scale=k_scale,
        v_scale=v_scale,
        rope=rope,
        split_counters=counters,
        **kw,
    )
    assert torch.equal(out_inline[: md.num_tokens], out[: md.num_tokens]), "the in-kernel merge's bits differ"
    assert torch.all(counters == 0), "counters must be left zero"

    n = md.num_tokens
    as_bits = (lambda c: c.view(torch.uint8)) if cache_dtype == FP8 else (lambda c: c)
    for kc, vc in ((k_cache, v_cache), (k_cache_in, v_cache_in)):
        assert torch.equal(as_bits(kc), as_bits(kc_ref)), "K cache differs"
        assert torch.equal(as_bits(vc), as_bits(vc_ref)), "V cache differs"
    assert torch.equal(q_in, batch.q) and torch.equal(k_in, batch.k), "inputs must be left as they are"
    if DEVICE == "cpu":  # the interpreter contracts nothing: the same bits
        assert torch.equal(out[:n], out_ref[:n])
    else:  # the fused launch rounds softmax without multiply-add contraction
        torch.testing.assert_close(out[:n].float(), out_ref[:n].float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("cache_dtype", [None, FP8])
def test_decode_rope_matches_kv_write_then_attention(
    num_splits: int, norm: bool, cache_dtype: torch.dtype | None
) -> None:
    """Short and long contexts (1 to 4 splits of 32 positions), a block boundary, a one-token
    context, bf16 or FP8 cache, with and without Qwen3's q/k norms: same cache bytes, same
    output, and q/k untouched."""
    _case([1] * 7, [5, 16, 17, 40, 100, 161, 1], torch.bfloat16, cache_dtype, norm, num_splits)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_rope_padding_sequences_write_nothing(num_splits: int) -> None:
    """A CUDA-graph bucket's padding sequences (q_len 0) and padding rows (slot -1)."""
    _case([1, 1, 1, 0, 0], [40, 2, 90, 0, 0], torch.bfloat16, None, True, num_splits)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_rope_token_not_at_its_sequence_index(num_splits: int) -> None:
    """A q_len-0 sequence before real ones: the kernel reloads the query, position, slot and
    K/V rows from ``query_start_loc`` instead of its speculative row."""
    _case([1, 0, 1, 1], [20, 0, 70, 5], torch.bfloat16, FP8, True, num_splits)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Qwen3-8B shapes: GPU only")
@pytest.mark.parametrize("cache_dtype", [None, FP8])
def test_gpu_decode_rope_qwen3_8b_shapes(cache_dtype: torch.dtype | None) -> None:
    """32 query / 8 KV heads of 128, the default decode tiles and 256-position splits, 48
    sequences from 1 to 3000 positions: the K/V bytes equal the two-launch path's, and
    every split reads the new position only after its writer stored it."""
    seq_lens = [1 + (i * 613) % 3000 for i in range(48)]
    _case([1] * 48, seq_lens, torch.bfloat16, cache_dtype, True, 16, 128, 0, 8, None, 256)


def test_decode_rope_fp32_model() -> None:
    _case([1, 1, 1], [3, 33, 64], torch.float32, None, True, 4)


def test_decode_rope_rejects_other_grids_and_head_sizes() -> None:
    batch = make_batch([2, 1], [10, 5], 8, 2, 32, device=DEVICE)
    md = batch.metadata
    cos, sin = _tables(64, 16)
    rope = RopeKvWrite(
        batch.k,
        batch.v,
        torch.zeros(3, dtype=torch.int64, device=DEVICE),
        cos,
        sin,
        md.slot_mapping,
        None,
        None,
        1e-6,
    )
    args = (batch.q, batch.k_cache, batch.v_cache, md.query_start_loc, md.seq_lens, md.block_table, 0.1)
    with pytest.raises(ValueError, match="decode grid"):
        paged_attention(*args, max_query_len=2, rope=rope)
    q48 = torch.zeros(3, 8, 48, device=DEVICE)
    c48 = torch.zeros(4, 16, 2, 48, device=DEVICE)
    assert not decode_rope_supported(q48, c48) and decode_rope_supported(batch.q, batch.k_cache)
    with pytest.raises(ValueError, match="power-of-two"):
        paged_attention(
            q48, c48, c48, md.query_start_loc, md.seq_lens, md.block_table, 0.1, max_query_len=1, rope=rope
        )


_PTX_SCRIPT = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from surge.kernels.paged_attention import _paged_attention_kernel as k

fp8 = sys.argv[1] == "fp8"
inline = sys.argv[2] == "inline"
rope = len(sys.argv) < 4 or sys.argv[3] == "rope"
cache = "*fp8e4nv" if fp8 else "*bf16"
const = dict(GROUP=4, GROUP_PAD=4, BLOCK_Q=1, BLOCK_M=16, BLOCK_N=64, HEAD_DIM=128, HEAD_DIM_PAD=128,
             BLOCK_SIZE=16, NUM_SPLITS=16, SPLITS_PAD=16, MIN_TILES_PER_SPLIT=4, DECODE=True,
             INLINE_REDUCE=inline, IEEE=False, FP8_KV=fp8, ASM_CVT=fp8, ROPE_KV=rope, QK_NORM=rope, HALF=64,
             PDL=True)
ptr = {"part_out_ptr": "*fp32", "part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "cnt_ptr": "*i32", "k_cache_ptr": cache,
       "v_cache_ptr": cache, "block_table_ptr": "*i32", "seq_lens_ptr": "*i32", "query_start_loc_ptr": "*i32",
       "slot_ptr": "*i64", "pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32"}
floats = ("scale_log2", "v_scale", "eps", "k_inv_scale", "v_inv_scale")
sig = {n: "constexpr" if n in const else ptr.get(n, "*bf16") if n.endswith("_ptr") else "fp32" if n in floats else "i32"
       for n in k.arg_names}
src = ASTSource(fn=k, signature=sig, constexprs={(k.arg_names.index(n),): v for n, v in const.items()})
opts = {"num_warps": 4, "num_stages": 2, "launch_pdl": True, "enable_fp_fusion": not rope}
print(triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"])
"""


@pytest.mark.parametrize("merge", ["reduce", "inline"])
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
def test_decode_rope_kernel_compiles_for_sm90(cache: str, merge: str) -> None:
    """Compiled for sm90 outside the interpreter (no GPU needed; the interpreter is lenient about
    globals and shapes): the decode grid with rope builds, with Qwen3-8B's head size, bf16 or
    FP8 cache, with the reduce kernel's partials or the in-kernel merge; rotary rounds each
    product (``mul.rn.bf16``) and nothing is contracted (the merge's explicit ``tl.fma`` aside,
    which the reduce kernel runs too, and its GPU-scope acquire-release arrival)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "-c", _PTX_SCRIPT, cache, merge],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "mul.rn.bf16" in res.stdout
    assert "fma.rn.bf16" not in res.stdout
    if merge == "inline":
        assert "atom.global.gpu.acq_rel.add" in res.stdout
        assert "fma.rn.f32" in res.stdout  # the merge's own
    else:
        assert "fma.rn.f32" not in res.stdout and "atom." not in res.stdout


def test_decode_inline_merge_compiles_for_sm90_in_order() -> None:
    """The plain decode grid (no rope: every decode step of more than two sequences) with the
    in-kernel merge, compiled for sm90: the partial stores, a block barrier, the GPU-scope
    acquire-release arrival, a second barrier, then the merge's L2 (``.cg``) loads, in that
    order in the PTX."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "-c", _PTX_SCRIPT, "bf16", "inline", "plain"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    ptx = res.stdout
    atom = ptx.index("atom.global.gpu.acq_rel.add")
    assert "bar.sync" in ptx[:atom], "no block barrier before the arrival"
    after = ptx[atom:]
    assert "bar.sync" in after and "ld.global.cg" in after
    assert after.index("bar.sync") < after.index("ld.global.cg"), "merge loads before the second barrier"
