"""Attention phases of the stream kernel (:class:`surge.kernels.stream_decode.StreamAttention`):
their torch reference against the model's attention layer on CPU, their packing, and the
kernel against the reference on an sm89+ GPU."""

from __future__ import annotations

import pytest
import torch

from surge.kernels.stream_decode import (
    HEAD_DIM,
    HEADS_DONE,
    MIN_SPLIT_TOKENS,
    OP_ATTEND,
    StreamAttention,
    StreamMeta,
    check_attention,
    pack_phases,
    stream_reference,
)
from surge.layers.attention import Attention
from surge.layers.attention_backend import AttentionMetadata
from surge.layers.norm import RMSNorm
from surge.layers.rotary import RotaryEmbedding
from surge.layers.torch_attention import TorchAttentionBackend

BF = torch.bfloat16
FP8 = torch.float8_e4m3fn
GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


class Case:
    """One sequence of ``length`` tokens (the last one new) over a shuffled paged cache."""

    def __init__(
        self,
        heads: int,
        kv_heads: int,
        length: int,
        block_size: int,
        qk_norm: bool,
        splits: int,
        dev: str,
        kv_dtype: torch.dtype = BF,
        kv_scales: tuple[float, float] = (1.0, 1.0),
    ) -> None:
        g = torch.Generator().manual_seed(length * 31 + heads)
        hd = HEAD_DIM
        blocks = -(-length // block_size) + 3
        self.rotary = RotaryEmbedding(hd, max(8192, length), base=1_000_000.0).to(dev)
        self.q_norm = self.k_norm = None
        if qk_norm:
            self.q_norm, self.k_norm = RMSNorm(hd, 1e-6, BF), RMSNorm(hd, 1e-6, BF)
            self.q_norm.weight.data = (torch.rand(hd, generator=g) + 0.5).to(BF)
            self.k_norm.weight.data = (torch.rand(hd, generator=g) + 0.5).to(BF)
            self.q_norm, self.k_norm = self.q_norm.to(dev), self.k_norm.to(dev)
        shape = (blocks, block_size, kv_heads, hd)
        # each cache a view behind a guard region of one slot's width, which nothing may write
        self.guard = kv_heads * hd
        n = blocks * block_size * kv_heads * hd
        # an FP8 cache holds values of about the size the scales give stored K/V (qkv's * 2 / scale)
        self.k_scale, self.v_scale = kv_scales
        k_vals = torch.randn(self.guard + n, generator=g) * (2 / self.k_scale if kv_dtype == FP8 else 1.0)
        v_vals = torch.randn(self.guard + n, generator=g) * (2 / self.v_scale if kv_dtype == FP8 else 1.0)
        self.k_store = k_vals.to(kv_dtype).to(dev)
        self.v_store = v_vals.to(kv_dtype).to(dev)
        self.k_cache = self.k_store[self.guard :].view(shape)
        self.v_cache = self.v_store[self.guard :].view(shape)
        self.qkv = (torch.randn((heads + 2 * kv_heads) * hd, generator=g) * 2).to(BF).to(dev)
        table = torch.randperm(blocks, generator=g).to(torch.int32)
        pos = length - 1
        slot = int(table[pos // block_size]) * block_size + pos % block_size
        self.meta = StreamMeta(
            torch.tensor([length], dtype=torch.int32, device=dev),
            table[None].contiguous().to(dev),
            torch.tensor([slot], dtype=torch.int64, device=dev),
            torch.tensor([pos], dtype=torch.int64, device=dev),
        )
        self.heads, self.kv_heads, self.length = heads, kv_heads, length
        self.y = torch.zeros(heads * hd, dtype=BF, device=dev)
        self.part = torch.zeros(heads * splits * (hd + 2), dtype=torch.float32, device=dev)
        self.splits = splits

    def phases(self, k_cache: torch.Tensor, v_cache: torch.Tensor, layers: int = 1) -> list[StreamAttention]:
        common = dict(
            qkv=self.qkv, y=self.y, k_cache=k_cache, v_cache=v_cache, cos=self.rotary.cos_cache,
            sin=self.rotary.sin_cache, q_norm_w=None if self.q_norm is None else self.q_norm.weight.data,
            k_norm_w=None if self.k_norm is None else self.k_norm.weight.data, part=self.part, heads=self.heads,
            kv_heads=self.kv_heads, splits=self.splits, scale=HEAD_DIM**-0.5, qk_eps=1e-6,
            k_scale=self.k_scale, v_scale=self.v_scale,
        )  # fmt: skip
        return [StreamAttention(**common)] * layers  # type: ignore[arg-type]

    def layer_output(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """The model's attention layer (torch norms, rotary and backend) on the same step."""
        hd, h, hk = HEAD_DIM, self.heads, self.kv_heads
        attn = Attention(h, hk, hd, self.rotary, self.q_norm, self.k_norm)
        attn.k_scale, attn.v_scale = self.k_scale, self.v_scale
        md = AttentionMetadata(
            num_tokens=1,
            num_seqs=1,
            query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
            seq_lens=self.meta.seq_lens.cpu(),
            block_table=self.meta.block_table.cpu(),
            slot_mapping=self.meta.slot_mapping.cpu(),
            max_query_len=1,
            max_seq_len=self.length,
            query_start_loc_cpu=[0, 1],
            seq_lens_cpu=[self.length],
        )
        qkv = self.qkv.cpu()[None]
        q, k, v = qkv[:, : h * hd].clone(), qkv[:, h * hd : (h + hk) * hd].clone(), qkv[:, (h + hk) * hd :]
        with torch.inference_mode():
            return attn(self.meta.positions.cpu(), q, k, v, (k_cache, v_cache), md, TorchAttentionBackend())[
                0
            ]


@pytest.mark.parametrize(
    "heads, kv_heads, length, block_size, qk_norm, kv_dtype",
    [
        (8, 2, 37, 16, True, BF),
        (4, 4, 1, 16, False, BF),
        (8, 2, 300, 32, False, BF),
        (8, 2, 37, 16, True, FP8),
        (4, 4, 1, 16, False, FP8),
        (8, 2, 300, 32, False, FP8),
    ],
    ids=["qwen3-like", "first-token", "llama-like", "qwen3-like-fp8", "first-token-fp8", "llama-like-fp8"],
)
def test_reference_is_the_models_attention_layer(
    heads: int, kv_heads: int, length: int, block_size: int, qk_norm: bool, kv_dtype: torch.dtype
) -> None:
    """The reference writes the new K/V where the layer does, bit for bit (an FP8 cache: the
    same e4m3 bytes, with scales other than 1), and its output is the layer's (torch backend) up
    to float32 summation order."""
    scales = (0.5, 0.25) if kv_dtype == FP8 else (1.0, 1.0)
    case = Case(
        heads, kv_heads, length, block_size, qk_norm, splits=3, dev="cpu", kv_dtype=kv_dtype, kv_scales=scales
    )
    k_ref, v_ref = case.k_cache.clone(), case.v_cache.clone()
    want = case.layer_output(k_ref, v_ref)
    stream_reference(case.phases(case.k_cache, case.v_cache), meta=case.meta)
    assert torch.equal(case.k_cache.view(torch.uint8), k_ref.view(torch.uint8))
    assert torch.equal(case.v_cache.view(torch.uint8), v_ref.view(torch.uint8))
    torch.testing.assert_close(case.y.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_packing_and_checks() -> None:
    case = Case(8, 2, 5, 16, True, splits=4, dev="cpu")
    (attend,) = case.phases(case.k_cache, case.v_cache)
    rows = pack_phases([attend])
    assert rows.shape == (1, 29)
    (a,) = rows.tolist()
    assert a[2] == case.qkv.data_ptr() and a[6] == case.y.data_ptr()
    assert a[14] == case.k_cache.data_ptr() and a[20] == case.part.data_ptr()
    assert a[21] == OP_ATTEND | (8 << 32)
    assert a[22] == 2 | (16 << 32) and a[23] == 4 | (1 << 32)
    one = 0x3F800000  # float32 1.0: a bf16 cache's scales and their inverses, whatever the phase says
    assert a[25:] == [one | (one << 32), one | (one << 32), 0, 0]  # no weight blocks
    fp8 = Case(8, 2, 5, 16, True, splits=4, dev="cpu", kv_dtype=FP8, kv_scales=(0.5, 4.0))
    (b,) = pack_phases(fp8.phases(fp8.k_cache, fp8.v_cache)).tolist()
    half, two, four, quarter = 0x3F000000, 0x40000000, 0x40800000, 0x3E800000
    assert b[25:] == [half | (four << 32), two | (quarter << 32), 1, 0]
    with pytest.raises(ValueError, match="both caches of one dtype"):
        check_attention(StreamAttention(**{**attend.__dict__, "v_cache": fp8.v_cache}))
    with pytest.raises(ValueError, match="k_scale and v_scale must be positive"):
        (f,) = fp8.phases(fp8.k_cache, fp8.v_cache)
        check_attention(StreamAttention(**{**f.__dict__, "v_scale": 0.0}))
    with pytest.raises(ValueError, match="heads / kv_heads"):
        check_attention(StreamAttention(**{**attend.__dict__, "heads": 16}))  # 8 per KV head
    with pytest.raises(ValueError, match="k_cache"):
        check_attention(StreamAttention(**{**attend.__dict__, "k_cache": case.k_cache.float()}))
    with pytest.raises(ValueError, match="part"):
        check_attention(StreamAttention(**{**attend.__dict__, "part": case.part[:10]}))
    with pytest.raises(ValueError, match="StreamMeta"):
        stream_reference([attend])


@pytest.mark.skipif(not GPU, reason="needs an sm89+ CUDA GPU")
@pytest.mark.parametrize(
    "heads, kv_heads, length, block_size, qk_norm, kv_dtype",
    [
        (32, 8, 37, 16, True, BF),
        (32, 8, 1, 16, True, BF),
        (32, 8, 300, 16, True, BF),
        (32, 8, 8191, 16, True, BF),
        (8, 8, 130, 32, False, BF),
        (16, 8, 2000, 16, False, BF),
        (32, 8, 1, 16, True, BF),
        (4, 1, 100, 16, False, BF),
        (4, 1, 8500, 16, False, BF),
        (32, 8, 37, 16, True, FP8),
        (32, 8, 1, 16, True, FP8),
        (32, 8, 300, 16, True, FP8),
        (32, 8, 2000, 16, True, FP8),
        (16, 8, 130, 32, False, FP8),
        (4, 1, 8500, 16, False, FP8),
    ],
    ids=[
        "qwen3-8b-short",
        "first-token",
        "qwen3-8b-300",
        "qwen3-8b-8k",
        "mha",
        "group2-2k",
        "padding-slot",
        "mqa-100",
        "mqa-8500",  # one KV head over every block: splits the context does not reach write nothing
        "fp8-qwen3-8b-short",
        "fp8-first-token",
        "fp8-qwen3-8b-300",
        "fp8-qwen3-8b-2k",
        "fp8-group2-130",
        "fp8-mqa-8500",
    ],
)
def test_kernel_attention_matches_reference(
    heads: int,
    kv_heads: int,
    length: int,
    block_size: int,
    qk_norm: bool,
    kv_dtype: torch.dtype,
    request: pytest.FixtureRequest,
) -> None:
    """The kernel against the reference: output (cosine > 0.9999), the new K/V at its slot and
    nothing else of the caches written; an FP8 cache (scales 0.5 and 0.25) on the FP8 build."""
    from surge.kernels.stream_decode import StreamDecodeKernel

    fp8 = kv_dtype == FP8
    kern = StreamDecodeKernel.compile(torch.device("cuda"), kv_fp8=fp8)
    scales = (0.5, 0.25) if fp8 else (1.0, 1.0)
    case = Case(
        heads, kv_heads, length, block_size, qk_norm, kern.num_sms // kv_heads, "cuda", kv_dtype, scales
    )
    if request.node.callspec.id.startswith("padding-slot"):  # warm-up rows: slot -1, nothing written
        case.meta.slot_mapping.fill_(-1)
    guards = (case.k_store[: case.guard].clone(), case.v_store[: case.guard].clone())
    k_ref, v_ref = case.k_cache.clone(), case.v_cache.clone()
    stream_reference(case.phases(k_ref, v_ref), meta=case.meta)
    want = case.y.clone()
    case.y.fill_(float("nan"))
    case.part.fill_(float("nan"))  # a partial the kernel did not write would poison the merge
    kern.reset()
    kern.launch(pack_phases(case.phases(case.k_cache, case.v_cache)), 0, meta=case.meta)
    torch.cuda.synchronize()
    assert not kern.hung()
    if fp8:  # the q/k norm's summation order may move a K value by one e4m3 step
        torch.testing.assert_close(case.k_cache.float(), k_ref.float(), atol=0.0, rtol=0.13)
        assert torch.equal(case.v_cache.view(torch.uint8), v_ref.view(torch.uint8))
    else:
        torch.testing.assert_close(case.k_cache, k_ref, atol=2e-2, rtol=1e-2)  # q/k norm: summation order
        assert torch.equal(case.v_cache, v_ref)
    assert torch.equal(case.k_store[: case.guard].view(torch.uint8), guards[0].view(torch.uint8))
    assert torch.equal(case.v_store[: case.guard].view(torch.uint8), guards[1].view(torch.uint8))
    cos = torch.nn.functional.cosine_similarity(case.y.float(), want.float(), dim=0)
    assert cos.item() > 0.9999, cos
    torch.testing.assert_close(case.y.float(), want.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not GPU, reason="needs an sm89+ CUDA GPU")
@pytest.mark.parametrize("length", [20, 37, 300, 2000])
def test_kernel_attention_in_consecutive_layers_and_steps(length: int) -> None:
    """Three layers' attention in one launch, each with its own qkv, caches and output but one
    partials buffer (as in a step), over three launches (after a reset, after another, and one
    continuing the step without a reset): each layer merges only once all its shares have
    written (a merge of another layer's or a NaN partial would show) and leaves its KV heads'
    counts at zero. 20 tokens: one share (no partials, no counting) when MIN_SPLIT_TOKENS >= 20."""
    import dataclasses

    from surge.kernels.stream_decode import StreamDecodeKernel

    kern = StreamDecodeKernel.compile(torch.device("cuda"))
    case = Case(32, 8, length, 16, True, kern.num_sms // 8, "cuda")
    g = torch.Generator().manual_seed(length)
    base = case.phases(case.k_cache, case.v_cache)[0]
    layers = [base] + [
        dataclasses.replace(
            base,
            qkv=(torch.randn(case.qkv.numel(), generator=g) * 2).to(BF).cuda(),
            k_cache=torch.randn(case.k_cache.shape, generator=g).to(BF).cuda(),
            v_cache=torch.randn(case.v_cache.shape, generator=g).to(BF).cuda(),
            y=torch.zeros_like(case.y),
        )
        for _ in range(2)
    ]
    wants = []
    for ph in layers:
        ref = dataclasses.replace(ph, k_cache=ph.k_cache.clone(), v_cache=ph.v_cache.clone(), y=ph.y.clone())
        stream_reference([ref], meta=case.meta)
        wants.append(ref.y)
    table = pack_phases(layers)
    for step, (reset, phase_base) in enumerate([(True, 0), (True, 0), (False, 3)]):
        for ph in layers:
            ph.y.fill_(float("nan"))
        case.part.fill_(float("nan"))
        if reset:
            kern.reset()
        kern.launch(table, phase_base, meta=case.meta)
        torch.cuda.synchronize()
        assert not kern.hung()
        for i, (ph, want) in enumerate(zip(layers, wants, strict=True)):
            cos = torch.nn.functional.cosine_similarity(ph.y.float(), want.float(), dim=0)
            assert cos.item() > 0.9999, (step, i, cos)
            torch.testing.assert_close(ph.y.float(), want.float(), atol=2e-2, rtol=2e-2)
        assert kern.counter[HEADS_DONE : HEADS_DONE + 8].tolist() == [0] * 8
    used = max(1, min(kern.num_sms // 8, -(-length // MIN_SPLIT_TOKENS)))
    assert (used == 1) == (length <= MIN_SPLIT_TOKENS)


@pytest.mark.skipif(not GPU, reason="needs an sm89+ CUDA GPU")
def test_kernel_of_the_other_cache_dtype_computes_nothing_and_says_so() -> None:
    """A build reads one cache dtype: an attention phase over the other marks the launch hung
    and leaves the output and caches untouched, rather than reading bytes as the wrong type."""
    from surge.kernels.stream_decode import StreamDecodeKernel

    kern = StreamDecodeKernel.compile(torch.device("cuda"))  # bf16
    case = Case(32, 8, 300, 16, True, kern.num_sms // 8, "cuda", FP8, (0.5, 0.25))
    k0 = case.k_cache.clone()
    case.y.fill_(float("nan"))
    kern.reset()
    kern.launch(pack_phases(case.phases(case.k_cache, case.v_cache)), 0, meta=case.meta)
    torch.cuda.synchronize()
    assert kern.hung()
    assert torch.isnan(case.y.float()).all()
    assert torch.equal(case.k_cache.view(torch.uint8), k0.view(torch.uint8))
