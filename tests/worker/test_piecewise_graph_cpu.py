"""The piecewise-graph path on CPU: buckets, static-buffer padding, the attention calls run
between the pieces over the step's own metadata, and the runner's branch, all run eagerly
over the static buffers (``use_graphs=False``) with the torch backend. The capture itself is
tested on a GPU (``test_piecewise_graph_gpu.py``)."""

from __future__ import annotations

import pytest
import torch

from surge.core.outputs import ScheduledRequest, SchedulerOutput
from surge.request import Request
from surge.sampling_params import SamplingParams
from surge.worker.input_batch import PreparedInputs
from surge.worker.model_runner import ModelRunner
from surge.worker.piecewise_graph import PIECEWISE_MAX_TOKENS, PiecewiseGraphRunner, piecewise_buckets
from tests.models.helpers import BlockAllocator, greedy_requests, make_runner, run_loop


def _attach(
    runner: ModelRunner, buckets: list[int] | None = None, num_heads: int | None = None
) -> PiecewiseGraphRunner:
    mc = runner.config.model
    pw = PiecewiseGraphRunner(
        runner._forward_with,
        runner.attn_backend,
        runner.device,
        piecewise_buckets(runner.max_num_tokens) if buckets is None else buckets,
        num_heads or mc.num_attention_heads,
        mc.num_key_value_heads,
        mc.head_dim,
        mc.torch_dtype,
        use_graphs=False,
    )
    runner.piecewise = pw
    return pw


def test_buckets() -> None:
    full = piecewise_buckets(8192)
    assert full[:6] == [16, 32, 64, 128, 192, 256]
    assert full[-3:] == [768, 896, PIECEWISE_MAX_TOKENS] == [768, 896, 1024]
    assert full == sorted(set(full))
    assert piecewise_buckets(300) == [16, 32, 64, 128, 192, 256, 300]  # the budget itself tops them
    assert piecewise_buckets(256) == [16, 32, 64, 128, 192, 256]
    assert piecewise_buckets(8192, max_tokens=512)[-1] == 512
    # A step of more than 192 tokens pads by less than a quarter of its bucket.
    for lo, hi in zip(full, full[1:], strict=False):
        if lo >= 192:
            assert (hi - lo - 1) / hi < 1 / 4


def test_runner_needs_a_bucket() -> None:
    runner = make_runner(None)
    with pytest.raises(ValueError, match="bucket"):
        _attach(runner, buckets=[])


def test_cpu_runner_has_no_piecewise_graphs() -> None:
    assert make_runner(None).piecewise is None  # CPU: always eager


def _prefill_step(runner: ModelRunner, prompts: list[list[int]]) -> tuple[SchedulerOutput, list[Request]]:
    alloc = BlockAllocator(64)
    reqs = greedy_requests(prompts, 4)
    for r in reqs:
        alloc.grow(r, r.num_tokens, runner.block_size)
    so = SchedulerOutput(
        [ScheduledRequest(r, r.num_tokens, True) for r in reqs], sum(len(p) for p in prompts)
    )
    return so, reqs


def test_hidden_equals_eager_with_padding() -> None:
    """A 47-token prefill of three prompts pads to the 64-token bucket: the real rows' hidden
    states equal those of an eager runner with its own cache (so the K/V the pieces write are
    the ones attention reads), the padding rows have id 0, position 0 and slot -1, the
    attention calls see the step's 47 rows, and the cache holds the eager runner's K/V."""
    eager_runner, runner = make_runner(None), make_runner(None)
    eager_runner.init_kv_cache(64)
    runner.init_kv_cache(64)
    pw = _attach(runner)
    so, _ = _prefill_step(runner, [[1 + i, 5, 9, 13][: 2 + i % 3] * (4 + i) for i in range(3)])
    assert so.num_scheduled_tokens == 47
    eager = eager_runner.prepare_inputs(so)
    with torch.inference_mode():
        hidden_eager = eager_runner._forward(eager.input_ids, eager.positions, eager.metadata).clone()
    slots = eager.metadata.slot_mapping.clone()
    seen: list[int] = []
    attend = pw._attend

    def spy(call, md):  # type: ignore[no-untyped-def]
        seen.append(md.num_tokens)
        attend(call, md)

    pw._attend = spy  # type: ignore[method-assign]
    inputs = runner.inputs.prepare(so)
    assert runner._piecewise_step(inputs)
    with torch.inference_mode():
        hidden = runner._hidden(inputs)
    assert hidden.shape[0] == 64 and pw.replays == 1
    torch.testing.assert_close(hidden[:47], hidden_eager, rtol=1e-5, atol=1e-5)
    assert seen == [47] * runner.config.model.num_hidden_layers
    assert torch.equal(pw.token_i64[2, :47], slots)
    assert pw.token_i64[:, 47:64].tolist() == [[0] * 17, [0] * 17, [-1] * 17]
    for (k, v), (k_ref, v_ref) in zip(runner.kv_caches, eager_runner.kv_caches, strict=True):
        torch.testing.assert_close(k, k_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v, v_ref, rtol=1e-5, atol=1e-5)


def test_splitter_rejects_other_head_shapes() -> None:
    runner = make_runner(None)
    runner.init_kv_cache(64)
    _attach(runner, num_heads=runner.config.model.num_attention_heads + 1)
    so, _ = _prefill_step(runner, [[1, 2, 3, 4, 5]])
    inputs = runner.inputs.prepare(so)
    with torch.inference_mode(), pytest.raises(ValueError, match="piecewise buffers"):
        runner._hidden(inputs)


def test_run_refuses_a_step_above_every_bucket() -> None:
    runner = make_runner(None)
    runner.init_kv_cache(64)
    pw = _attach(runner, buckets=[16])
    so, _ = _prefill_step(runner, [[3] * 20])
    inputs = runner.inputs.prepare(so)
    assert not runner._piecewise_step(inputs)  # the runner runs it eagerly instead
    with torch.inference_mode(), pytest.raises(ValueError, match="no piecewise bucket"):
        pw.run(inputs, runner._metadata(inputs))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_runner_piecewise_branch_generates_like_eager(temperature: float) -> None:
    """Chunked prefills, mixed steps and decodes through the piecewise branch (every step up
    to the top bucket) give the tokens of the eager path, greedy and seeded sampling, and a
    step above the top bucket still runs eagerly."""
    prompts = [[3, 4, 5, 6] * 9, [7, 8], [9] * 70, [11, 12, 13] * 5, [5] * 9, [2, 4, 8, 16, 32] * 8]
    arrivals = [0, 0, 1, 3, 3, 6]
    sizes: list[int] = []
    eager_sizes: list[int] = []

    def generate(piecewise: bool) -> list[list[int]]:
        runner = make_runner(None, max_num_seqs=16, max_num_batched_tokens=96)
        if piecewise:
            pw = _attach(runner, buckets=[16, 32, 64])
            run, forward = pw.run, runner._forward

            def counting_run(inputs: PreparedInputs, md):  # type: ignore[no-untyped-def]
                sizes.append(inputs.num_tokens)
                return run(inputs, md)

            def counting_forward(ids, pos, md):  # type: ignore[no-untyped-def]
                eager_sizes.append(ids.shape[0])
                return forward(ids, pos, md)

            pw.run = counting_run  # type: ignore[method-assign]
            runner._forward = counting_forward  # type: ignore[method-assign]
        sp = SamplingParams(temperature=temperature, seed=7, max_tokens=10, ignore_eos=True)
        reqs = [Request(f"r{i}", p, sp) for i, p in enumerate(prompts)]
        return run_loop(runner, reqs, 96, arrivals)

    assert generate(True) == generate(False)
    assert len(sizes) > 5 and max(sizes) <= 64
    assert any(s > 16 for s in sizes)  # padded steps of several prompts
    assert eager_sizes and min(eager_sizes) > 64  # only the steps above the top bucket ran eagerly


def test_step_timing_names_the_piecewise_bucket() -> None:
    runner = make_runner(None)
    runner.init_kv_cache(64)
    _attach(runner)
    runner.set_timing(True)
    so, _ = _prefill_step(runner, [[3, 5, 7] * 7, [2, 4] * 10])
    runner.execute(so)
    timing = runner.last_timing
    assert timing is not None
    assert (timing.num_tokens, timing.piecewise_bucket, timing.graph_bucket) == (41, 64, None)
