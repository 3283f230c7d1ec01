"""ModelRunner: input layout, KV sizing, sampling state, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surge.core.outputs import ScheduledRequest, SchedulerOutput
from surge.layers.sampler import penalty_tensors_from_ids
from surge.request import Request
from surge.sampling_params import SamplingParams
from tests.models.helpers import make_runner, run_loop

GREEDY = SamplingParams(temperature=0.0)


def test_kv_sizing_and_cache_shapes() -> None:
    runner = make_runner(None, max_num_seqs=4)  # stories260K: 5 layers, 4 KV heads of 8
    assert runner.bytes_per_block == 2 * 5 * 16 * 4 * 8 * 4
    # 4 sequences of at most 256 tokens never need more than 4 * 16 blocks.
    assert runner.determine_num_kv_blocks() == 64
    big = make_runner(None, max_num_seqs=16 * 1024, max_num_batched_tokens=16 * 1024)
    assert big.determine_num_kv_blocks() == big.config.cache.cpu_kv_cache_bytes // big.bytes_per_block
    runner.init_kv_cache(10)
    assert len(runner.kv_caches) == 5
    for k, v in runner.kv_caches:
        assert k.shape == v.shape == (10, 16, 4, 8) and k.dtype == torch.float32
    runner.profile_run()  # the CUDA sizing pass also runs on CPU


def test_prepare_inputs_layout() -> None:
    runner = make_runner(None, block_size=16)
    a = Request("a", list(range(3, 23)), GREEDY)  # 20 prompt tokens, 16 cached
    a.num_computed_tokens, a.block_ids = 16, [7, 2]
    b = Request("b", [5, 6, 7], GREEDY)  # decode of its 5th token
    b.output_token_ids = [8, 9]
    b.num_computed_tokens, b.block_ids = 4, [4]
    c = Request("c", list(range(40)), GREEDY)  # first chunk of 10, no sample
    c.block_ids = [9, 1, 3]
    so = SchedulerOutput(
        [ScheduledRequest(b, 1, True), ScheduledRequest(a, 4, True), ScheduledRequest(c, 10, False)], 15
    )
    batch = runner.prepare_inputs(so)
    md = batch.metadata
    assert batch.input_ids.tolist() == [9, 19, 20, 21, 22] + list(range(10))
    assert batch.positions.tolist() == [4, 16, 17, 18, 19] + list(range(10))
    assert md.query_start_loc.tolist() == md.query_start_loc_cpu == [0, 1, 5, 15]
    assert md.seq_lens.tolist() == md.seq_lens_cpu == [5, 20, 10]
    assert md.block_table.tolist() == [[4, 0], [7, 2], [9, 0]]
    assert md.slot_mapping.tolist() == [4 * 16 + 4] + [2 * 16 + i for i in range(4)] + [
        9 * 16 + i for i in range(10)
    ]
    assert (md.num_tokens, md.num_seqs, md.max_query_len, md.max_seq_len) == (15, 3, 10, 20)
    assert batch.logits_indices.tolist() == [0, 4]
    assert [r.request_id for r in batch.sample_requests] == ["b", "a"]


def test_execute_errors_and_non_sampling_chunks() -> None:
    runner = make_runner(None, max_num_batched_tokens=32)
    r = Request("r", list(range(1, 41)), GREEDY)
    r.block_ids = [0]
    so = SchedulerOutput([ScheduledRequest(r, 20, False)], 20)
    with pytest.raises(RuntimeError, match="init_kv_cache"):
        runner.execute(so)
    runner.init_kv_cache(8)
    with pytest.raises(ValueError, match="has 1 KV block, needs 2 for 20 tokens"):
        runner.execute(so)
    r.block_ids = [0, 1, 2]
    assert runner.execute(so).sampled_token_ids == {}
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        runner.execute(SchedulerOutput([ScheduledRequest(r, 40, True)], 40))
    assert runner.execute(SchedulerOutput()).sampled_token_ids == {}


def test_penalty_state_is_incremental_and_dropped(tiny_models: dict[str, Path]) -> None:
    runner = make_runner(tiny_models["qwen2"])
    params = SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5, max_tokens=12)
    reqs = [
        Request("p", [5, 6, 7, 5], params),
        Request("q", [9, 9], GREEDY),
    ]
    run_loop(runner, reqs, 64)
    state = runner._penalty_states["p"]
    counts, mask = penalty_tensors_from_ids(
        [reqs[0].prompt_token_ids], [reqs[0].output_token_ids[:-1]], runner.vocab_size, "cpu"
    )
    assert torch.equal(state.counts, counts[0]) and torch.equal(state.prompt_mask, mask[0])
    assert "q" not in runner._penalty_states
    runner.execute(SchedulerOutput(finished_request_ids=["p"]))
    assert runner._penalty_states == {}
    # The penalty is in effect: greedy with a strong repetition penalty never repeats early.
    strong = SamplingParams(temperature=0.0, repetition_penalty=100.0, max_tokens=8)
    r = Request("s", [3, 4], strong)
    (out,) = run_loop(make_runner(tiny_models["qwen2"]), [r], 64)
    assert len(set(out + [3, 4])) == 10


def test_seeded_requests_ignore_the_rest_of_the_batch(tiny_models: dict[str, Path]) -> None:
    path = tiny_models["qwen3"]
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=8)
    alone = run_loop(make_runner(path, seed=0), [Request("x", [3, 4, 5], seeded)], 64)[0]
    others = [
        Request(f"o{i}", [7 + i] * (i + 2), SamplingParams(temperature=1.0, max_tokens=8)) for i in range(3)
    ]
    together = run_loop(
        make_runner(path, seed=1), [others[0], Request("x", [3, 4, 5], seeded), *others[1:]], 8, [0, 1, 0, 2]
    )
    assert together[1] == alone
