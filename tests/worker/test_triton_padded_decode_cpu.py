"""The Triton backend over padded decode inputs, as a captured graph runs them: padding
sequences (q_len 0, seq_len 0) and padding tokens (slot -1) are harmless, with the split
count fixed by ``max_model_len``. On CPU this runs under the Triton interpreter, on a GPU
host compiled."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surge.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from surge.layers.attention_backend import AttentionBackend
from surge.layers.torch_attention import TorchAttentionBackend
from surge.worker.cuda_graph import DecodeGraphRunner, decode_buckets
from surge.worker.model_runner import ModelRunner
from tests.worker.helpers import count_replays, drive, randomize, tiny_long_qwen3

MAX_MODEL_LEN = 1024
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # interpreter on CPU (see conftest)


def _runner(path: Path, backend: AttentionBackend, static_decode: bool) -> ModelRunner:
    mc = ModelConfig.from_pretrained(path, dtype="float32", load_format="dummy", max_model_len=MAX_MODEL_LEN)
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(block_size=16, num_kv_blocks=128),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=MAX_MODEL_LEN),
        device=DEVICE,
        enforce_eager=True,  # the static-buffer path below runs without capture
    )
    runner = ModelRunner(cfg, backend)
    randomize(runner)
    runner.init_kv_cache(128)
    if static_decode:
        runner.graph_runner = DecodeGraphRunner(
            runner._forward, runner.device, decode_buckets(8), runner.max_blocks_per_seq, MAX_MODEL_LEN, False
        )
    return runner


@pytest.mark.parametrize("prompt_lens", [(40, 3, 70), (300, 3, 200)])
def test_padded_decode_with_triton_backend_matches_reference(
    tmp_path: Path, prompt_lens: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short contexts (one KV split each) and a context over 256 tokens (two splits, merged
    in the attention launch through the counters the runner reserved: no reduce launch)."""
    from surge.kernels import paged_attention as pa
    from surge.layers.triton_attention import TritonAttentionBackend

    decode_reduces: list[int] = []
    reduce = pa.attention_reduce

    def recording_reduce(*args: object, **kwargs: object) -> torch.Tensor:
        if kwargs.get("decode_seq_lens") is not None:
            decode_reduces.append(1)
        return reduce(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pa, "attention_reduce", recording_reduce)
    path = tiny_long_qwen3(tmp_path / "qwen3")
    backend = TritonAttentionBackend(num_sms=132)
    triton_runner = _runner(path, backend, static_decode=True)
    reference = _runner(path, TorchAttentionBackend(), static_decode=False)
    graphs = triton_runner.graph_runner
    assert graphs is not None
    # The split count a bucket-4 graph would be captured with (max_model_len decides it).
    md = graphs._metadata(4, MAX_MODEL_LEN, list(range(5)), [1] * 4)
    assert backend.num_splits(md, 2) > 1
    replays = count_replays(triton_runner)

    def close(a: torch.Tensor, b: torch.Tensor) -> None:
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

    drive(
        [triton_runner, reference],
        [[(5 * j + i) % 512 for j in range(n)] for i, n in enumerate(prompt_lens)],
        [0, 0, 0],
        4,
        close,
    )
    assert replays == [4, 4, 4]  # three decode steps of 3 sequences, padded to 4
    assert not decode_reduces, "a decode step launched the reduce kernel"
    counters = backend._split_counters
    assert counters is not None and torch.all(counters == 0)
    for (k, v), (k_ref, v_ref) in zip(triton_runner.kv_caches, reference.kv_caches, strict=True):
        torch.testing.assert_close(k, k_ref, rtol=1e-5, atol=1e-5)  # padding wrote nothing
        torch.testing.assert_close(v, v_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_seqs", [1, 3])
def test_capture_metadata_is_fixed_per_bucket(num_seqs: int) -> None:
    """Capture-time metadata: bucket-sized views of the static buffers, q_len 1 each."""
    graphs = DecodeGraphRunner(lambda i, p, m: i, torch.device("cpu"), decode_buckets(8), 64, 1024, False)
    bucket = graphs.bucket_for(num_seqs)
    assert bucket is not None
    graphs._reset_static(bucket)
    md = graphs._metadata(bucket, 1024, list(range(bucket + 1)), [1] * bucket)
    assert md.block_table.shape == (bucket, 64) and md.block_table.stride(0) == 64
    assert md.query_start_loc.tolist() == list(range(bucket + 1))
    assert md.slot_mapping.tolist() == [-1] * bucket
    assert (md.num_tokens, md.num_seqs, md.max_query_len, md.max_seq_len) == (bucket, bucket, 1, 1024)
