"""The model runner with the prefill attention kernel on (chunked prefill, a prefix shared
through the block table, mixed with decodes) against the torch reference backend, and the LM
head over the sampled rows only. On CPU the kernels run under the Triton interpreter."""

from __future__ import annotations

from pathlib import Path

import torch

from surge.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from surge.core.outputs import ScheduledRequest, SchedulerOutput
from surge.kernels.prefill_attention import PrefillTileConfig
from surge.layers.attention_backend import AttentionBackend
from surge.layers.torch_attention import TorchAttentionBackend
from surge.request import Request
from surge.sampling_params import SamplingParams
from surge.worker.model_runner import ModelRunner
from tests.worker.helpers import randomize, tiny_long_qwen3

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _runner(path: Path, backend: AttentionBackend) -> ModelRunner:
    mc = ModelConfig.from_pretrained(path, dtype="float32", load_format="dummy", max_model_len=512)
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(block_size=16, num_kv_blocks=64),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512),
        device=DEVICE,
        enforce_eager=True,
    )
    runner = ModelRunner(cfg, backend)
    randomize(runner)
    runner.init_kv_cache(64)
    return runner


def _blocks(free: list[int], n: int) -> list[int]:
    return [free.pop() for _ in range(n)]


def test_chunked_prefill_prefix_and_decodes_match_reference(tmp_path: Path) -> None:
    from surge.layers.triton_attention import PrefillKernelChoice, TritonAttentionBackend

    path = tiny_long_qwen3(tmp_path / "qwen3")
    choice = PrefillKernelChoice(min_query_len=8, tile=PrefillTileConfig(16, 16, 4, 1))
    runners = [
        _runner(path, TritonAttentionBackend(num_sms=132, prefill=choice)),
        _runner(path, TorchAttentionBackend()),
    ]
    sp = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    free = list(range(63, -1, -1))
    a = Request("a", [(7 * j + 3) % 512 for j in range(70)], sp)
    b = Request("b", [5, 9, 11], sp)
    a.block_ids, b.block_ids = _blocks(free, 5), _blocks(free, 1)

    def step(scheduled: list[ScheduledRequest]) -> None:
        so = SchedulerOutput(scheduled, sum(s.num_new_tokens for s in scheduled))
        results = [r.compute_logits(so) for r in runners]
        (got, got_reqs), (ref, ref_reqs) = results
        assert [r.request_id for r in got_reqs] == [r.request_id for r in ref_reqs]
        assert got is not None and ref is not None
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
        for s in scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
        for r, t in zip(ref_reqs, ref.argmax(-1).tolist(), strict=True):
            r.output_token_ids.append(t)

    # 1: a's first 24-token chunk (prefill kernel, samples nothing) and b's whole 3-token
    #    prompt (paged kernel).
    step([ScheduledRequest(a, 24, False), ScheduledRequest(b, 3, True)])
    # 2: a's other 46 tokens over its 24-token paged prefix, next to b's decode.
    step([ScheduledRequest(a, 46, True), ScheduledRequest(b, 1, True)])
    # 3: c shares a's first four blocks (a prefix-cache hit of 64 tokens) and prefills 12
    #    tokens after them; a and b decode.
    c = Request("c", a.prompt_token_ids[:64] + [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], sp)
    c.block_ids = a.block_ids[:4] + _blocks(free, 1)
    c.num_computed_tokens = 64
    step([ScheduledRequest(a, 1, True), ScheduledRequest(b, 1, True), ScheduledRequest(c, 12, True)])


def test_lm_head_runs_only_for_sampled_rows(tmp_path: Path) -> None:
    """A 40-token prompt and a 20-token chunk that samples nothing: the LM head sees one row."""
    runner = _runner(tiny_long_qwen3(tmp_path / "qwen3"), TorchAttentionBackend())
    rows: list[int] = []
    head = runner.model.compute_logits

    def counting(hidden: torch.Tensor, *, upcast: bool = True) -> torch.Tensor:
        rows.append(hidden.shape[0])
        return head(hidden, upcast=upcast)

    runner.model.compute_logits = counting  # type: ignore[method-assign]
    sp = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    a, b = Request("a", list(range(3, 43)), sp), Request("b", list(range(50, 90)), sp)
    a.block_ids, b.block_ids = [0, 1, 2], [3, 4, 5]
    out = runner.execute(SchedulerOutput([ScheduledRequest(a, 40, True), ScheduledRequest(b, 20, False)], 60))
    assert list(out.sampled_token_ids) == ["a"]
    assert rows == [1]
