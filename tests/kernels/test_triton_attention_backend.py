"""TritonAttentionBackend vs the torch reference backend (cache writes and outputs)."""

from __future__ import annotations

import pytest
import torch

from surge.kernels.prefill_attention import PrefillTileConfig
from surge.layers import triton_attention
from surge.layers.torch_attention import TorchAttentionBackend
from surge.layers.triton_attention import PrefillKernelChoice, TritonAttentionBackend
from tests.kernels.attn_utils import make_batch, reference_attention


def _compare(
    q_lens: list[int],
    seq_lens: list[int],
    backend: TritonAttentionBackend,
    dtype: torch.dtype,
    device: str,
    num_kv_heads: int = 2,
    group: int = 2,
    head_dim: int = 64,
    tol: float = 2e-3,
    max_seq_len: int | None = None,
    min_query_len: int | None = None,
) -> None:
    batch = make_batch(
        q_lens,
        seq_lens,
        num_kv_heads * group,
        num_kv_heads,
        head_dim,
        dtype=dtype,
        device=device,
        num_pad_tokens=3,
    )
    md = batch.metadata
    if max_seq_len is not None:
        md.max_seq_len = max_seq_len  # as a decode graph is captured: the longest context it may see
    if min_query_len is not None:
        md.min_query_len = min_query_len
    kc_ref, vc_ref = batch.k_cache.clone(), batch.v_cache.clone()
    scale = head_dim**-0.5
    ref = TorchAttentionBackend().forward(batch.q, batch.k, batch.v, kc_ref, vc_ref, md, scale)
    out = backend.forward(batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache, md, scale)
    assert torch.equal(batch.k_cache, kc_ref) and torch.equal(batch.v_cache, vc_ref)
    n = md.num_tokens
    torch.testing.assert_close(out[:n].float(), ref[:n].float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("split_kv", [False, True])
def test_mixed_prefill_and_decode(split_kv: bool) -> None:
    _compare(
        [6, 1, 1, 3],
        [22, 40, 2, 3],
        TritonAttentionBackend(num_sms=132, split_kv=split_kv),
        torch.float16,
        "cpu",
    )


SMALL_PREFILL = PrefillKernelChoice(
    min_query_len=4, tile=PrefillTileConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)
)


@pytest.mark.parametrize("known_min", [True, False])
def test_prefill_rows_on_the_prefill_kernel_and_the_rest_on_the_paged_one(known_min: bool) -> None:
    """Chunks of 6, 19 and 4 tokens (two over a cached prefix) take the prefill kernel; the
    decodes and the 3-token chunk take the paged kernel; every row matches the reference,
    whether the runner told the backend the shortest q_len (1) or not (0)."""
    backend = TritonAttentionBackend(num_sms=132, prefill=SMALL_PREFILL)
    q_lens, seq_lens = [6, 1, 19, 1, 3, 4], [22, 40, 19, 2, 3, 37]
    _compare(q_lens, seq_lens, backend, torch.float16, "cpu", min_query_len=1 if known_min else 0)


def test_cached_prompt_step_splits_the_kv_and_matches() -> None:
    """The last block of a prompt found in the prefix cache: 16 new tokens over a 1040-token
    context (and a decode) run split on the mixed grid."""
    backend = TritonAttentionBackend(num_sms=132)
    batch = make_batch([16, 1], [1040, 300], 4, 2, 64)
    assert backend.num_splits(batch.metadata, 2) == 16
    _compare([16, 1], [1040, 300], backend, torch.float16, "cpu")


def test_all_prefill_step_launches_only_the_prefill_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_paged(*args: object, **kwargs: object) -> None:
        raise AssertionError("the paged kernel ran")

    monkeypatch.setattr(triton_attention, "paged_attention", no_paged)
    backend = TritonAttentionBackend(num_sms=132, prefill=SMALL_PREFILL)
    _compare([5, 17], [21, 17], backend, torch.float32, "cpu", tol=1e-4, min_query_len=5)


def test_prefill_kernel_off_stays_on_the_paged_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_prefill(*args: object, **kwargs: object) -> None:
        raise AssertionError("the prefill kernel ran")

    monkeypatch.setattr(triton_attention, "prefill_attention", no_prefill)
    off = PrefillKernelChoice(enabled=False, min_query_len=4)
    _compare([6, 1], [22, 40], TritonAttentionBackend(num_sms=132, prefill=off), torch.float16, "cpu")
    with pytest.raises(ValueError, match="min_query_len"):
        PrefillKernelChoice(min_query_len=1)


@pytest.mark.parametrize("known_min", [True, False])
def test_fp8_cache_mixed_step_on_both_kernels(known_min: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """An FP8 cache (K and V scales of their own) in a mixed step: the long chunks on the prefill
    kernel, the decodes and the short chunk on the paged kernel, both kernels given the layer's
    scales. The cache bytes equal the torch backend's and, in fp32, every row its output to far
    below FP8's rounding, so a scale dropped on either kernel fails."""
    calls: list[str] = []
    for name in ("prefill_attention", "paged_attention"):
        original = getattr(triton_attention, name)

        def counting(*args: object, _name: str = name, _fn: object = original, **kwargs: object) -> object:
            calls.append(_name)
            return _fn(*args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(triton_attention, name, counting)
    q_lens, seq_lens = [6, 1, 19, 1, 3, 4], [22, 40, 19, 2, 3, 37]
    batch = make_batch(q_lens, seq_lens, 4, 2, 32, dtype=torch.float32, num_pad_tokens=3)
    md = batch.metadata
    md.min_query_len = 1 if known_min else 0
    k_cache = (batch.k_cache * 4).to(torch.float8_e4m3fn)
    v_cache = batch.v_cache.to(torch.float8_e4m3fn)
    kc_ref, vc_ref = k_cache.clone(), v_cache.clone()
    scale, scales = 32**-0.5, (0.5, 0.25)
    ref = TorchAttentionBackend().forward(batch.q, batch.k, batch.v, kc_ref, vc_ref, md, scale, True, *scales)
    backend = TritonAttentionBackend(num_sms=132, prefill=SMALL_PREFILL)
    out = backend.forward(batch.q, batch.k, batch.v, k_cache, v_cache, md, scale, True, *scales)
    assert calls == ["prefill_attention", "paged_attention"]
    assert torch.equal(k_cache.view(torch.uint8), kc_ref.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), vc_ref.view(torch.uint8))
    n = md.num_tokens
    torch.testing.assert_close(out[:n], ref[:n].float(), atol=2e-5, rtol=2e-5)


def test_decode_takes_split_path_and_matches() -> None:
    # 8 programs on a 132-SM GPU with 1000-token contexts: the heuristic splits.
    backend = TritonAttentionBackend(num_sms=132)
    batch = make_batch([1, 1], [1000, 300], 4, 2, 64)
    assert backend.num_splits(batch.metadata, 2) > 1
    _compare([1, 1], [300, 17], TritonAttentionBackend(num_sms=132), torch.float16, "cpu")


@pytest.mark.parametrize("split_kv", [False, True])
def test_padded_decode_as_captured_for_a_long_max_model_len(split_kv: bool) -> None:
    """The decode grid with the split count fixed for max_model_len 8192 (32 splits) and a
    padding sequence: the 600-token context uses 3 splits, the short ones write directly."""
    backend = TritonAttentionBackend(num_sms=132, split_kv=split_kv)
    batch = make_batch([1, 1, 1, 0], [600, 17, 1, 0], 4, 2, 64)
    batch.metadata.max_seq_len = 8192
    assert backend.num_splits(batch.metadata, 2) == (32 if split_kv else 1)
    _compare([1, 1, 1, 0], [600, 17, 1, 0], backend, torch.float16, "cpu", max_seq_len=8192)


def test_num_splits_off_and_for_prefill() -> None:
    big = make_batch([129, 1], [1000, 900], 4, 2, 64)
    assert TritonAttentionBackend(num_sms=132).num_splits(big.metadata, 2) == 1
    small = make_batch([5, 1], [1030, 900], 4, 2, 64)
    assert TritonAttentionBackend(num_sms=132).num_splits(small.metadata, 2) == 16
    short = make_batch([5, 1], [1000, 900], 4, 2, 64)
    assert TritonAttentionBackend(num_sms=132).num_splits(short.metadata, 2) == 1
    assert TritonAttentionBackend(num_sms=132, split_kv=False).num_splits(small.metadata, 2) == 1
    decode = make_batch([1], [1000], 4, 2, 64)
    assert TritonAttentionBackend(num_sms=132, split_kv=False).num_splits(decode.metadata, 2) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("split_kv", [False, True])
def test_gpu_qwen3_8b_backend(split_kv: bool) -> None:
    backend = TritonAttentionBackend(split_kv=split_kv)
    _compare([1, 1, 1], [8192, 5000, 33], backend, torch.bfloat16, "cuda", 8, 4, 128, tol=2e-2)
    _compare([512, 1, 1], [2560, 4096, 100], backend, torch.bfloat16, "cuda", 8, 4, 128, tol=2e-2)
    _compare([4096], [4096], backend, torch.bfloat16, "cuda", 8, 4, 128, tol=2e-2, min_query_len=4096)
    _compare([1000, 37, 1], [9192, 37, 50], backend, torch.bfloat16, "cuda", 8, 4, 128, tol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_cuda_graph_replay() -> None:
    """Capture a decode step in a CUDA graph, change the metadata in place, replay."""
    backend = TritonAttentionBackend()
    batch = make_batch([1] * 4, [4096, 3000, 17, 2048], 32, 8, 128, dtype=torch.bfloat16, device="cuda")
    md = batch.metadata
    md.max_seq_len = 8192  # the graph's worst case
    out = backend.forward(batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache, md, 128**-0.5)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache, md, 128**-0.5)
    # New step: contexts grow by one token, new queries.
    new = make_batch([1] * 4, [4096, 3000, 17, 2048], 32, 8, 128, dtype=torch.bfloat16, device="cuda", seed=7)
    batch.q.copy_(new.q)
    md.seq_lens.copy_(torch.tensor([4000, 3001, 18, 1], dtype=torch.int32, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    md.seq_lens_cpu = [4000, 3001, 18, 1]
    ref = reference_attention(batch, 128**-0.5)
    torch.testing.assert_close(out[:4].float(), ref, atol=2e-2, rtol=2e-2)


def test_reserved_counters_merge_split_decode_in_the_attention_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After ``reserve`` a split-KV decode step merges in the attention launch (no reduce
    launch) with the reduce kernel's bits; a step of more sequences than reserved, and a
    backend with ``inline_split_reduce=False``, keep the reduce kernel."""
    from surge.kernels import paged_attention as pa

    calls: list[int] = []
    reduce = pa.attention_reduce

    def counting_reduce(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return reduce(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pa, "attention_reduce", counting_reduce)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    q_lens, seq_lens = [1, 1, 1], [40, 700, 1300]
    batch = make_batch(q_lens, seq_lens, 4, 2, 64, dtype=torch.float16, device=str(device), num_pad_tokens=1)
    md = batch.metadata
    md.max_seq_len = 4096  # as a decode graph is captured
    args = (batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache, md, 0.125)

    plain = TritonAttentionBackend(num_sms=132)
    assert plain.num_splits(md, 2) > 1
    want = plain.forward(*args)
    assert len(calls) == 1

    inline = TritonAttentionBackend(num_sms=132)
    inline.reserve(4, 2, device)
    got = inline.forward(*args)
    assert len(calls) == 1, "the reserved backend launched the reduce kernel"
    assert torch.equal(got[: md.num_tokens], want[: md.num_tokens])
    counters = inline._split_counters
    assert counters is not None and torch.all(counters == 0)
    inline.reserve(3, 2, device)  # covered: the same tensor stays (graphs hold it)
    assert inline._split_counters is counters
    with pytest.raises(ValueError, match="cannot grow"):
        inline.reserve(8, 2, device)
    with pytest.raises(ValueError, match="cannot grow"):
        inline.reserve(2, 2, torch.device("meta"))  # another device, even a smaller request

    small = TritonAttentionBackend(num_sms=132)
    small.reserve(2, 2, device)  # fewer sequences than the step's three
    small.forward(*args)
    off = TritonAttentionBackend(num_sms=132, inline_split_reduce=False)
    off.reserve(4, 2, device)
    off.forward(*args)
    assert len(calls) == 3
    with pytest.raises(ValueError, match="max_num_seqs"):
        inline.reserve(0, 2, device)
