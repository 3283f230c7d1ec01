"""The decode grid's output quantized per token inside the attention launch (``quant_out`` of
:func:`surge.kernels.paged_attention.paged_attention`, for a w8a8 o projection): bit for bit
:func:`surge.kernels.fp8_quant.per_token_quant_fp8` of the attention output, with and without KV
splits, over bf16 and FP8 caches, whichever KV head finishes a token last; padding rows hold the
quantization of a zero row; the counters come back zero for the next launch. Then the Triton
backend's choice (:meth:`TritonAttentionBackend.quantizes_output`). On the GPU when present, else
under the Triton interpreter."""

from __future__ import annotations

import pytest
import torch

from surge.kernels.fp8_quant import per_token_quant_fp8
from surge.kernels.kv_write import RopeKvWrite
from surge.kernels.paged_attention import AttentionTileConfig, OutputQuant, paged_attention
from surge.layers.torch_attention import write_kv_cache as torch_write_kv_cache
from surge.layers.triton_attention import TritonAttentionBackend
from surge.quant.fp8 import Fp8Activations, quantize_kv
from tests.kernels.attn_utils import (
    PagedBatch,
    make_batch,
    reverse_interpreter_programs,
    split_major_interpreter_programs,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL_TILE = AttentionTileConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)
HEAD_DIM = 32
# A graph bucket: real decodes over one-tile to several-split contexts, then padding sequences
# (q_len 0, seq_len 0) whose rows are padding rows.
Q_LENS = [1, 1, 1, 1, 0, 0]
SEQ_LENS = [40, 2, 90, 161, 0, 0]


def _batch(
    q_lens: list[int], seq_lens: list[int], num_kv_heads: int, group: int, fp8_cache: bool
) -> tuple[PagedBatch, float, float]:
    """A decode batch with its new K/V written, padded to one token row per sequence; an FP8
    cache is the bf16 one quantized with scales (0.05, 0.04)."""
    num_pad = len(q_lens) - sum(q_lens)
    batch = make_batch(
        q_lens,
        seq_lens,
        num_kv_heads * group,
        num_kv_heads,
        HEAD_DIM,
        dtype=torch.bfloat16,
        device=DEVICE,
        num_pad_tokens=num_pad,
    )
    md = batch.metadata
    torch_write_kv_cache(batch.k, batch.v, batch.k_cache, batch.v_cache, md.slot_mapping)
    if not fp8_cache:
        return batch, 1.0, 1.0
    ks, vs = 0.05, 0.04
    batch.k_cache = quantize_kv(batch.k_cache, ks)
    batch.v_cache = quantize_kv(batch.v_cache, vs)
    return batch, ks, vs


def _attend(
    batch: PagedBatch,
    num_splits: int,
    ks: float,
    vs: float,
    split_counters: torch.Tensor | None = None,
    quant_out: OutputQuant | None = None,
) -> torch.Tensor:
    """The decode grid's output; with ``quant_out``, into an output first filled with 7.0 (a row
    quantized before all its KV heads arrive would see those)."""
    md = batch.metadata
    return paged_attention(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        md.query_start_loc,
        md.seq_lens,
        md.block_table,
        HEAD_DIM**-0.5,
        None if quant_out is None else torch.full_like(batch.q, 7.0),
        num_splits=num_splits,
        max_query_len=1,
        config=SMALL_TILE,
        min_kv_per_split=32,
        k_scale=ks,
        v_scale=vs,
        split_counters=split_counters,
        quant_out=quant_out,
    )


def _quant_buffers(batch: PagedBatch) -> OutputQuant:
    """Output buffers full of garbage (NaN scales, 0x7f bytes) and zero counters."""
    t, h, d = batch.q.shape
    data = torch.full((t, h * d), 0x7F, dtype=torch.uint8, device=DEVICE).view(torch.float8_e4m3fn)
    scale = torch.full((t, 1), float("nan"), dtype=torch.float32, device=DEVICE)
    counters = torch.zeros(len(batch.metadata.seq_lens_cpu), dtype=torch.int32, device=DEVICE)
    return OutputQuant(data, scale, counters)


def _assert_quantized(batch: PagedBatch, want_out: torch.Tensor, quant: OutputQuant) -> None:
    """Real rows: per_token_quant_fp8 of the unfused output, bytes and scales; padding rows: its
    quantization of a zero row."""
    n = batch.metadata.num_tokens
    t, h, d = batch.q.shape
    want_q, want_s = per_token_quant_fp8(want_out[:n].reshape(n, h * d))
    assert torch.equal(quant.data[:n].view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(quant.scale[:n], want_s)
    zero_q, zero_s = per_token_quant_fp8(torch.zeros(t - n, h * d, dtype=want_out.dtype, device=DEVICE))
    assert torch.equal(quant.data[n:].view(torch.uint8), zero_q.view(torch.uint8))
    assert torch.equal(quant.scale[n:], zero_s)
    assert torch.all(quant.token_counters == 0)


@pytest.mark.parametrize("order", ["grid", "reverse", "split_major"])
@pytest.mark.parametrize("num_splits", [1, 8])
@pytest.mark.parametrize("num_kv_heads,group", [(2, 4), (3, 2), (4, 1)])
def test_output_quantized_in_the_launch_is_per_token_quant_fp8(
    num_kv_heads: int, group: int, num_splits: int, order: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bit for bit per_token_quant_fp8 of the unfused output, whichever KV head (and split)
    finishes a token last: the interpreter's programs in grid order, reversed and split-major.
    With 8 splits of 32 tokens the sequences use 2, 1, 3 and 6 splits, merged in the launch; the
    bf16 output itself is unchanged."""
    if order == "reverse":
        reverse_interpreter_programs(monkeypatch)
    elif order == "split_major":
        split_major_interpreter_programs(monkeypatch)
    batch, ks, vs = _batch(Q_LENS, SEQ_LENS, num_kv_heads, group, fp8_cache=False)
    split_counters = torch.zeros(len(Q_LENS) * num_kv_heads, dtype=torch.int32, device=DEVICE)
    want = _attend(batch, num_splits, ks, vs, split_counters)
    quant = _quant_buffers(batch)
    out = _attend(batch, num_splits, ks, vs, split_counters, quant)
    n = batch.metadata.num_tokens
    assert torch.equal(out[:n], want[:n])
    _assert_quantized(batch, want, quant)
    assert torch.all(split_counters == 0)


@pytest.mark.parametrize("num_splits", [1, 8])
def test_fp8_cache_and_two_launches_on_the_same_counters(num_splits: int) -> None:
    """Over an FP8 cache; a second launch on the same counters (a graph replay) after the first
    reset them gives the same bits again."""
    batch, ks, vs = _batch(Q_LENS, SEQ_LENS, 2, 4, fp8_cache=True)
    split_counters = torch.zeros(len(Q_LENS) * 2, dtype=torch.int32, device=DEVICE)
    want = _attend(batch, num_splits, ks, vs, split_counters)
    quant = _quant_buffers(batch)
    for _ in range(2):
        quant.data.view(torch.uint8).fill_(0x7F)
        quant.scale.fill_(float("nan"))
        _attend(batch, num_splits, ks, vs, split_counters, quant)
        _assert_quantized(batch, want, quant)


@pytest.mark.parametrize("num_splits", [1, 8])
def test_sequence_without_token_in_the_middle(num_splits: int) -> None:
    """A q_len-0 sequence before real ones: tokens sit off their sequence's index, a real
    sequence's index is a padding row (written by that program), and counters are per sequence."""
    q_lens, seq_lens = [1, 0, 1, 1, 0, 0], [20, 0, 70, 5, 0, 0]
    batch, ks, vs = _batch(q_lens, seq_lens, 2, 2, fp8_cache=False)
    split_counters = torch.zeros(len(q_lens) * 2, dtype=torch.int32, device=DEVICE)
    want = _attend(batch, num_splits, ks, vs, split_counters)
    quant = _quant_buffers(batch)
    _attend(batch, num_splits, ks, vs, split_counters, quant)
    _assert_quantized(batch, want, quant)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_with_rope_inside_the_launch(num_splits: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the q/k norm, rotary and K/V write inside the same launch (``rope``, small decode
    steps), programs last to first: the quantized rows are per_token_quant_fp8 of that launch's
    own output."""
    reverse_interpreter_programs(monkeypatch)
    q_lens, seq_lens = [1, 1, 0], [40, 90, 0]
    batch, ks, vs = _batch(q_lens, seq_lens, 2, 4, fp8_cache=False)
    md = batch.metadata
    half = HEAD_DIM // 2
    ang = torch.arange(128, dtype=torch.float32)[:, None] / (10000 ** (torch.arange(half) / half))[None, :]
    positions = torch.tensor([39, 89, 0], device=DEVICE)
    slots = md.slot_mapping.clone()
    norm_w = (1 + 0.1 * torch.randn(HEAD_DIM, generator=torch.Generator().manual_seed(2))).to(torch.bfloat16)
    rope = RopeKvWrite(
        batch.k,
        batch.v,
        positions,
        ang.cos().to(DEVICE),
        ang.sin().to(DEVICE),
        slots,
        norm_w.to(DEVICE),
        norm_w.to(DEVICE),
        1e-6,
    )
    split_counters = torch.zeros(len(q_lens) * 2, dtype=torch.int32, device=DEVICE)
    md_args = (md.query_start_loc, md.seq_lens, md.block_table, HEAD_DIM**-0.5)
    kw = dict(num_splits=num_splits, max_query_len=1, config=SMALL_TILE, min_kv_per_split=32, rope=rope)
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    want = paged_attention(batch.q, k_cache, v_cache, *md_args, split_counters=split_counters, **kw)
    quant = _quant_buffers(batch)
    out = torch.full_like(batch.q, 7.0)
    paged_attention(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        *md_args,
        out,
        split_counters=split_counters,
        quant_out=quant,
        **kw,
    )
    assert torch.equal(batch.k_cache, k_cache) and torch.equal(batch.v_cache, v_cache)
    _assert_quantized(batch, want, quant)


def test_quant_out_refused_where_it_cannot_run() -> None:
    batch, ks, vs = _batch([1, 1], [40, 90], 2, 2, fp8_cache=False)
    md = batch.metadata
    quant = _quant_buffers(batch)
    args = (batch.q, batch.k_cache, batch.v_cache, md.query_start_loc, md.seq_lens, md.block_table, 0.1)
    with pytest.raises(ValueError, match="decode grid"):
        paged_attention(*args, max_query_len=2, quant_out=quant)
    with pytest.raises(ValueError, match="merged in the launch"):  # splits left to the reduce kernel
        paged_attention(*args, num_splits=4, max_query_len=1, quant_out=quant)
    with pytest.raises(ValueError, match="token_counters"):
        bad = OutputQuant(quant.data, quant.scale, torch.zeros(1, dtype=torch.int32, device=DEVICE))
        paged_attention(*args, max_query_len=1, quant_out=bad)
    with pytest.raises(ValueError, match="quant_out.data"):
        bad = OutputQuant(quant.data.view(torch.uint8), quant.scale, quant.token_counters)
        paged_attention(*args, max_query_len=1, quant_out=bad)
    with pytest.raises(ValueError, match="quant_out.scale"):
        bad = OutputQuant(quant.data, quant.scale[:1], quant.token_counters)
        paged_attention(*args, max_query_len=1, quant_out=bad)
    with pytest.raises(ValueError, match="side by side"):
        out = torch.empty(2, 4, 2, HEAD_DIM, dtype=batch.q.dtype, device=DEVICE)[:, :, 0]
        paged_attention(*args, out, max_query_len=1, quant_out=quant)
    padded = make_batch(
        [1, 1], [40, 90], 4, 2, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE, num_pad_tokens=1
    )
    pmd = padded.metadata
    with pytest.raises(ValueError, match="a program for every row"):
        paged_attention(
            padded.q,
            padded.k_cache,
            padded.v_cache,
            pmd.query_start_loc,
            pmd.seq_lens,
            pmd.block_table,
            0.1,
            max_query_len=1,
            quant_out=_quant_buffers(padded),
        )


def test_backend_quantizes_decode_output_once_reserved() -> None:
    """:meth:`TritonAttentionBackend.quantizes_output`: only on decode steps, once reserved, with
    the splits merged in the launch (one split, or split counters too), when turned on; forward
    then returns the Fp8Activations of per_token_quant_fp8 of its own bf16 output, and refuses
    ``quantize_out`` elsewhere."""
    batch, _, _ = _batch(Q_LENS, SEQ_LENS, 2, 4, fp8_cache=False)
    md = batch.metadata
    md.max_seq_len = 1024  # as a graph is captured: the split-KV grid (small batch, long context)
    args = (batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache, md, HEAD_DIM**-0.5, False)

    backend = TritonAttentionBackend(num_sms=132)
    assert backend.num_splits(md, 2) > 1
    assert not backend.quantizes_output(batch.q, batch.k_cache, md)  # nothing reserved yet
    with pytest.raises(ValueError, match="quantize_out"):
        backend.forward(*args, quantize_out=True)
    backend.reserve(8, 2, torch.device(DEVICE))
    assert backend.quantizes_output(batch.q, batch.k_cache, md)
    want = backend.forward(*args)
    got = backend.forward(*args, quantize_out=True)
    assert isinstance(got, Fp8Activations) and isinstance(want, torch.Tensor)
    assert got.dtype == torch.bfloat16
    n, (h, d) = md.num_tokens, batch.q.shape[1:]
    want_q, want_s = per_token_quant_fp8(want[:n].reshape(n, h * d))
    assert torch.equal(got.data[:n].view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(got.scale[:n], want_s)

    # too few counters reserved for the step's sequences
    small = TritonAttentionBackend(num_sms=132)
    small.reserve(4, 2, torch.device(DEVICE))
    assert not small.quantizes_output(batch.q, batch.k_cache, md)
    # split-KV decode with the reduce kernel: no; one split: yes
    no_inline = TritonAttentionBackend(num_sms=132, inline_split_reduce=False)
    no_inline.reserve(8, 2, torch.device(DEVICE))
    assert not no_inline.quantizes_output(batch.q, batch.k_cache, md)
    one_split = TritonAttentionBackend(num_sms=132, inline_split_reduce=False, split_kv=False)
    one_split.reserve(8, 2, torch.device(DEVICE))
    assert one_split.quantizes_output(batch.q, batch.k_cache, md)
    off = TritonAttentionBackend(num_sms=132, quantize_decode_output=False)
    off.reserve(8, 2, torch.device(DEVICE))
    assert not off.quantizes_output(batch.q, batch.k_cache, md)
    assert off._token_counters is None
    # not a pure decode step
    mixed = make_batch([2, 1], [40, 90], 8, 2, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE)
    assert not backend.quantizes_output(mixed.q, mixed.k_cache, mixed.metadata)
    # more token rows than sequences
    assert not backend.quantizes_output(torch.cat([batch.q, batch.q]), batch.k_cache, md)


_PTX_SCRIPT = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from surge.kernels.paged_attention import _paged_attention_kernel as k

inline = sys.argv[1] == "inline"
const = dict(GROUP=4, GROUP_PAD=4, BLOCK_Q=1, BLOCK_M=16, BLOCK_N=64, HEAD_DIM=128, HEAD_DIM_PAD=128,
             BLOCK_SIZE=16, NUM_SPLITS=16 if inline else 1, SPLITS_PAD=16 if inline else 1, MIN_TILES_PER_SPLIT=4,
             DECODE=True, INLINE_REDUCE=inline, IEEE=False, FP8_KV=False, ASM_CVT=False, ROPE_KV=False,
             QK_NORM=False, HALF=64, QUANT_OUT=True, QBLOCK=4096, PDL=True)
ptr = {"part_out_ptr": "*fp32", "part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "cnt_ptr": "*i32",
       "block_table_ptr": "*i32", "seq_lens_ptr": "*i32", "query_start_loc_ptr": "*i32", "slot_ptr": "*i64",
       "pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "qo_ptr": "*fp8e4nv", "qs_ptr": "*fp32",
       "tok_cnt_ptr": "*i32"}
floats = ("scale_log2", "v_scale", "eps", "k_inv_scale", "v_inv_scale")
sig = {n: "constexpr" if n in const else ptr.get(n, "*bf16") if n.endswith("_ptr") else "fp32" if n in floats else "i32"
       for n in k.arg_names}
src = ASTSource(fn=k, signature=sig, constexprs={(k.arg_names.index(n),): v for n, v in const.items()})
opts = {"num_warps": 4, "num_stages": 2, "launch_pdl": True}
print(triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"])
"""


@pytest.mark.parametrize("merge", ["one_split", "inline"])
def test_quantized_output_compiles_for_sm90_in_order(merge: str) -> None:
    """Compiled for sm90 outside the interpreter (no GPU needed) at Qwen3-8B's head size, one
    split or the in-kernel merge: the last arrival (a block barrier, the GPU-scope acquire-release
    add on the token's counter, a second barrier) comes before the row's L2 (``.cg``) loads and
    the e4m3 conversion, with IEEE divisions; the merge adds its own arrival (three adds: the
    split merge's, and the token's after a one-split or a merged store)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "-c", _PTX_SCRIPT, merge],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    ptx = res.stdout
    assert ptx.count("atom.global.gpu.acq_rel.add") == (3 if merge == "inline" else 1)
    atom = ptx.rindex("atom.global.gpu.acq_rel.add")
    assert "bar.sync" in ptx[:atom], "no block barrier before the arrival"
    after = ptx[atom:]
    assert after.index("bar.sync") < after.index("ld.global.cg") < after.index("cvt.rn.satfinite.e4m3x2.f32")
    assert "div.rn.f32" in after
