"""The decode-graph path on CPU: static-buffer filling, padding and the runner's graph
branch, run eagerly over the static buffers (``use_graphs=False``) with the torch backend."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from surge.config import EngineConfig
from surge.core.outputs import ScheduledRequest, SchedulerOutput
from surge.layers.attention_backend import AttentionBackend, AttentionMetadata
from surge.layers.torch_attention import TorchAttentionBackend
from surge.request import Request
from surge.sampling_params import SamplingParams
from surge.worker.cuda_graph import DecodeGraphRunner, backend_is_graph_safe, decode_buckets, use_cuda_graphs
from surge.worker.input_batch import PreparedInputs
from surge.worker.model_runner import ModelRunner, default_attention_backend
from tests.models.helpers import BlockAllocator, greedy_requests, make_runner, run_loop


class _FakeTriton(TorchAttentionBackend):
    name = "triton"
    cuda_graph_safe = True


def _eager_static_runner(runner: ModelRunner) -> DecodeGraphRunner:
    sc = runner.config.scheduler
    return DecodeGraphRunner(
        runner._forward,
        runner.device,
        decode_buckets(sc.max_num_seqs, sc.max_num_batched_tokens),
        runner.max_blocks_per_seq,
        sc.max_model_len,
        use_graphs=False,
    )


def test_graphs_only_on_cuda_without_enforce_eager() -> None:
    runner = make_runner(None)
    assert runner.graph_runner is None  # CPU: always eager
    assert isinstance(runner.attn_backend, TorchAttentionBackend)
    assert isinstance(default_attention_backend(torch.device("cpu")), TorchAttentionBackend)
    cpu_cfg = runner.config
    cuda_cfg = dataclasses.replace(cpu_cfg, device="cuda")
    eager_cfg = dataclasses.replace(cpu_cfg, device="cuda", enforce_eager=True)
    fake = _FakeTriton()
    assert backend_is_graph_safe(fake) and not backend_is_graph_safe(TorchAttentionBackend())
    assert use_cuda_graphs(cuda_cfg, fake)
    assert not use_cuda_graphs(eager_cfg, fake)
    assert not use_cuda_graphs(cpu_cfg, fake)
    assert not use_cuda_graphs(cuda_cfg, TorchAttentionBackend())

    class Declared(TorchAttentionBackend):
        cuda_graph_safe = True

    backend: AttentionBackend = Declared()
    assert use_cuda_graphs(cuda_cfg, backend)


def _prefill(runner: ModelRunner, requests: list[Request], alloc: BlockAllocator) -> None:
    scheduled = []
    for r in requests:
        alloc.grow(r, r.num_tokens, runner.block_size)
        scheduled.append(ScheduledRequest(r, r.num_tokens, True))
    out = runner.execute(SchedulerOutput(scheduled, sum(r.num_tokens for r in requests)))
    for r in requests:
        r.num_computed_tokens = r.num_tokens
        r.output_token_ids.append(out.sampled_token_ids[r.request_id])


def test_static_buffers_equal_eager_inputs_and_hidden() -> None:
    runner = make_runner(None, max_num_seqs=16)
    runner.init_kv_cache(64)
    graphs = _eager_static_runner(runner)
    alloc = BlockAllocator(64)
    reqs = greedy_requests([[1 + i, 20 + i, 30, 40 + 2 * i][: 2 + i % 3] * (i + 1) for i in range(5)], 8)
    _prefill(runner, reqs, alloc)
    for r in reqs:
        alloc.grow(r, r.num_tokens, runner.block_size)
    so = SchedulerOutput([ScheduledRequest(r, 1, True) for r in reqs], len(reqs))

    eager = runner.prepare_inputs(so)
    with torch.inference_mode():
        hidden_eager = runner._forward(eager.input_ids, eager.positions, eager.metadata).clone()
    # Prepared tensors are views of a buffer the next prepare reuses: keep copies.
    md = dataclasses.replace(
        eager.metadata,
        **{
            k: getattr(eager.metadata, k).clone()
            for k in ("query_start_loc", "seq_lens", "block_table", "slot_mapping")
        },
    )
    eager_ids, eager_pos = eager.input_ids.clone(), eager.positions.clone()
    inputs = runner.inputs.prepare(so, graphs.bucket_for)
    assert inputs.padded_seqs == 8
    with torch.inference_mode():
        hidden = graphs.run(inputs)
    assert hidden.shape[0] == 8
    torch.testing.assert_close(hidden[:5], hidden_eager, rtol=1e-5, atol=1e-5)

    assert torch.equal(graphs.token_i64[0, :5], eager_ids)
    assert torch.equal(graphs.token_i64[1, :5], eager_pos)
    assert torch.equal(graphs.token_i64[2, :5], md.slot_mapping)
    assert graphs.token_i64[:, 5:8].tolist() == [[0] * 3, [0] * 3, [-1] * 3]
    assert torch.equal(graphs.seq_i32[0, :6], md.query_start_loc)
    assert graphs.seq_i32[0, 6:9].tolist() == [5, 5, 5]  # padding sequences: q_len 0
    assert torch.equal(graphs.seq_i32[1, :5], md.seq_lens)
    assert graphs.seq_i32[1, 5:8].tolist() == [0, 0, 0]
    width = md.block_table.shape[1]
    assert torch.equal(graphs.block_table[:5, :width], md.block_table)
    assert graphs.block_table.shape[1] == runner.max_blocks_per_seq  # full width


def test_fill_rejects_unpadded_inputs() -> None:
    runner = make_runner(None, max_num_seqs=16)
    graphs = _eager_static_runner(runner)
    reqs = greedy_requests([[1, 2, 3]] * 3, 4)
    for r in reqs:
        r.block_ids = [0]
        r.num_computed_tokens = 2
    inputs = runner.inputs.prepare(SchedulerOutput([ScheduledRequest(r, 1, True) for r in reqs], 3))
    with pytest.raises(ValueError, match="bucket"):
        graphs.fill(inputs)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_runner_graph_branch_generates_like_eager(temperature: float) -> None:
    """The runner's decode-graph branch (padding, hidden row selection, sampling) gives the
    same tokens as the eager path, greedy and seeded sampling, with arrivals mid-decode."""
    prompts = [[3, 4, 5, 6], [7, 8], [9] * 20, [11, 12, 13], [5] * 9, [2, 4, 8, 16, 32]]
    arrivals = [0, 0, 1, 3, 3, 6]

    replays: list[int] = []

    def generate(with_graphs: bool) -> list[list[int]]:
        runner = make_runner(None, max_num_seqs=16, max_num_batched_tokens=64)
        if with_graphs:
            graphs = runner.graph_runner = _eager_static_runner(runner)
            run = graphs.run

            def counting_run(inputs: PreparedInputs) -> torch.Tensor:
                replays.append(inputs.padded_seqs)
                return run(inputs)

            graphs.run = counting_run  # type: ignore[method-assign]
        sp = SamplingParams(temperature=temperature, seed=7, max_tokens=12, ignore_eos=True)
        reqs = [Request(f"r{i}", p, sp) for i, p in enumerate(prompts)]
        return run_loop(runner, reqs, 64, arrivals)

    assert generate(True) == generate(False)
    assert len(replays) > 5 and {4, 8} <= set(replays)


def test_sampling_fast_paths_match_full_sampler() -> None:
    runner = make_runner(None, max_num_seqs=8)
    sampler = runner.step_sampler
    logits = torch.randn(3, runner.vocab_size)
    greedy = greedy_requests([[1], [2], [3]], 4)
    assert sampler.sample(logits, greedy).tolist() == logits.argmax(-1).tolist()
    assert sampler.greedy and sampler.cached is None
    mixed = [Request("a", [1], SamplingParams(temperature=1.0, top_k=1)), *greedy[1:]]
    assert sampler.sample(logits, mixed).tolist() == logits.argmax(-1).tolist()  # top_k=1 is argmax
    md = sampler.cached
    assert md is not None and not sampler.greedy
    sampler.sample(logits, mixed)
    assert sampler.cached is md  # same composition: tensors reused
    penal = [Request("p", [1], SamplingParams(temperature=0.0, repetition_penalty=1.5)), *greedy[1:]]
    sampler.sample(logits, penal)
    assert sampler.fresh and sampler.cached is None
    assert "p" in runner._penalty_states  # the runner's view of the same state
    runner.execute(SchedulerOutput(finished_request_ids=["p"]))
    assert runner._penalty_states == {}


def test_enforce_eager_config_reaches_runner() -> None:
    runner = make_runner(None)
    cfg: EngineConfig = dataclasses.replace(runner.config, enforce_eager=True)
    assert ModelRunner(cfg).graph_runner is None


def test_short_context_graph_is_chosen_by_the_longest_context() -> None:
    """A bucket with a short-context length replays (here: runs eagerly) its short form exactly
    when the step's longest context fits it; other buckets, and a length not below
    ``max_model_len``, get none."""
    runner = make_runner(None, max_num_seqs=16)
    sc = runner.config.scheduler
    seen: list[int] = []

    def forward(ids: torch.Tensor, pos: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        seen.append(md.max_seq_len)
        return torch.zeros(ids.shape[0], 4)

    buckets = decode_buckets(sc.max_num_seqs, sc.max_num_batched_tokens)
    graphs = DecodeGraphRunner(
        forward, runner.device, buckets, runner.max_blocks_per_seq, sc.max_model_len, use_graphs=False,
        short_context=lambda b: 16 if b == 1 else None,
    )  # fmt: skip
    graphs.capture()
    assert graphs.short == {1: 16}

    def step(context: int, seqs: int = 1) -> int:
        reqs = greedy_requests([[1] * (context + 1)] * seqs, 4)
        for r in reqs:
            r.block_ids = list(range(-(-context // runner.block_size) + 1))
            r.num_computed_tokens = context
        so = SchedulerOutput([ScheduledRequest(r, 1, True) for r in reqs], seqs)
        with torch.inference_mode():
            graphs.run(runner.inputs.prepare(so, graphs.bucket_for))
        return seen.pop()

    assert step(15) == 16  # context 16: the short form
    assert step(16) == sc.max_model_len  # 17 tokens
    assert step(3, seqs=2) == sc.max_model_len  # bucket 2 has no short form
    never = DecodeGraphRunner(
        forward, runner.device, buckets, runner.max_blocks_per_seq, sc.max_model_len, use_graphs=False,
        short_context=lambda b: sc.max_model_len,
    )  # fmt: skip
    never.capture()
    assert never.short == {}
