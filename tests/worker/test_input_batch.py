"""Host input preparation: incremental block tables, decode padding, layout vs a fresh build."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from surge.config import CacheConfig, SchedulerConfig
from surge.core.outputs import ModelOutput, ScheduledRequest, SchedulerOutput
from surge.core.scheduler import Scheduler
from surge.request import Request
from surge.sampling_params import SamplingParams
from surge.worker.cuda_graph import decode_buckets, pick_bucket
from surge.worker.input_batch import BlockTableRows, InputPreparer, PreparedInputs

CPU = torch.device("cpu")


def _expected_block_table(so: SchedulerOutput, block_size: int) -> np.ndarray:
    """The step's block table built from scratch from each request's ``block_ids``."""
    need = [-(-(s.request.num_computed_tokens + s.num_new_tokens) // block_size) for s in so.scheduled]
    table = np.zeros((len(need), max(need)), dtype=np.int32)
    for i, (s, n) in enumerate(zip(so.scheduled, need, strict=True)):
        table[i, :n] = s.request.block_ids[:n]
    return table


def _check_step(inputs: PreparedInputs, so: SchedulerOutput, block_size: int) -> None:
    """Every tensor of ``inputs`` against a per-token Python build of the same step."""
    table = _expected_block_table(so, block_size)
    assert np.array_equal(inputs.block_table.numpy(), table)
    ids, pos, slots, cu, seq_lens = [], [], [], [0], []
    for i, s in enumerate(so.scheduled):
        r = s.request
        for p in range(r.num_computed_tokens, r.num_computed_tokens + s.num_new_tokens):
            ids.append(r.token_id_at(p))
            pos.append(p)
            slots.append(int(table[i, p // block_size]) * block_size + p % block_size)
        cu.append(cu[-1] + s.num_new_tokens)
        seq_lens.append(r.num_computed_tokens + s.num_new_tokens)
    n, b = len(ids), len(seq_lens)
    pad_t, pad_s = inputs.padded_tokens - n, inputs.padded_seqs - b
    assert inputs.input_ids.tolist() == ids + [0] * pad_t
    assert inputs.positions.tolist() == pos + [0] * pad_t
    assert inputs.slot_mapping.tolist() == slots + [-1] * pad_t
    assert inputs.query_start_loc.tolist() == inputs.query_start_loc_cpu == cu + [n] * pad_s
    assert inputs.seq_lens.tolist() == inputs.seq_lens_cpu == seq_lens + [0] * pad_s
    sampled = [i for i, s in enumerate(so.scheduled) if s.sample]
    assert inputs.logits_indices.tolist() == [cu[i + 1] - 1 for i in sampled]
    assert [r.request_id for r in inputs.sample_requests] == [
        so.scheduled[i].request.request_id for i in sampled
    ]
    assert (inputs.num_tokens, inputs.num_seqs) == (n, b)
    assert inputs.max_seq_len == max(seq_lens)
    for t in (
        inputs.input_ids,
        inputs.slot_mapping,
        inputs.query_start_loc,
        inputs.seq_lens,
        inputs.block_table,
    ):
        assert t.data_ptr() % 16 == 0  # kernel arguments start 16-byte aligned


def test_buckets_and_padding_choice() -> None:
    assert decode_buckets(256) == [1, 2, 4] + list(range(8, 257, 8))
    assert decode_buckets(12) == [1, 2, 4, 8, 12]
    assert decode_buckets(5) == [1, 2, 4, 5]
    assert decode_buckets(1) == [1]
    assert decode_buckets(64, max_num_tokens=20) == [1, 2, 4, 8, 16, 20]
    b = decode_buckets(256)
    assert [pick_bucket(b, n) for n in (1, 2, 3, 5, 8, 9, 17, 250, 256)] == [1, 2, 4, 8, 8, 16, 24, 256, 256]
    assert pick_bucket(b, 257) is None


def _decode_requests(num: int, block_size: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    reqs = []
    for i in range(num):
        r = Request(f"r{i}", [rng.randrange(100) for _ in range(rng.randrange(1, 40))], SamplingParams())
        r.output_token_ids = [rng.randrange(100) for _ in range(rng.randrange(0, 5))]
        r.num_computed_tokens = r.num_tokens - 1
        r.block_ids = rng.sample(range(500), -(-r.num_tokens // block_size))
        reqs.append(r)
    return reqs


def test_decode_step_padded_to_bucket() -> None:
    prep = InputPreparer(CPU, 64, 16, 8, 128)
    reqs = _decode_requests(5, 8)
    so = SchedulerOutput([ScheduledRequest(r, 1, True) for r in reqs], 5)
    buckets = decode_buckets(16)
    inputs = prep.prepare(so, lambda n: pick_bucket(buckets, n))
    assert (inputs.padded_tokens, inputs.padded_seqs) == (8, 8)
    assert inputs.all_rows_sample and inputs.max_query_len == 1
    _check_step(inputs, so, 8)
    # The same step without padding.
    inputs = prep.prepare(so)
    assert (inputs.padded_tokens, inputs.padded_seqs) == (5, 5)
    _check_step(inputs, so, 8)


def test_mixed_step_is_never_padded() -> None:
    prep = InputPreparer(CPU, 64, 16, 8, 128)
    reqs = _decode_requests(3, 8)
    p = Request("p", list(range(30)), SamplingParams())
    p.block_ids = [40, 41, 42]
    so = SchedulerOutput([ScheduledRequest(r, 1, True) for r in reqs] + [ScheduledRequest(p, 20, False)], 23)
    inputs = prep.prepare(so, lambda n: 8)
    assert (inputs.padded_tokens, inputs.padded_seqs) == (23, 4)
    assert not inputs.all_rows_sample
    _check_step(inputs, so, 8)
    # An odd token count still leaves every token row 16-byte aligned (Triton specialises
    # kernels on pointer alignment).
    for row in (inputs.input_ids, inputs.positions, inputs.slot_mapping):
        assert row.data_ptr() % 16 == 0 and row.is_contiguous()


def test_pending_tokens_are_gathered_from_the_previous_step() -> None:
    prep = InputPreparer(CPU, 64, 16, 8, 128)
    reqs = _decode_requests(3, 8, seed=1)
    pending = reqs[1]
    pending.num_computed_tokens = pending.num_tokens  # its next token is still in flight
    pending.block_ids = list(range(200, 200 + -(-(pending.num_tokens + 1) // 8)))
    so = SchedulerOutput([ScheduledRequest(r, 1, True) for r in reqs], 3)
    inputs = prep.prepare(so, None, {pending.request_id: 5})
    assert inputs.pending_idx is not None and inputs.pending_idx.tolist() == [[1], [5]]
    assert not inputs.pending_identity
    assert inputs.input_ids[1].item() == 0  # filled on the device by the runner
    with pytest.raises(ValueError, match="neither known nor pending"):
        prep.prepare(so)


def test_block_table_rows_rebuild_on_new_list_and_eviction() -> None:
    rows = BlockTableRows(capacity=2, max_blocks_per_seq=4)
    a, b, c = (Request(x, [1], SamplingParams()) for x in "abc")
    a.block_ids, b.block_ids, c.block_ids = [3], [5, 6], [7]
    slots, known = rows.slots([a, b])
    assert known.tolist() == [1, 2] and rows.pool[slots[1], :2].tolist() == [5, 6]
    a.block_ids.append(9)  # appended in place: copied incrementally
    b.block_ids = [8]  # replaced (freed and re-allocated): rebuilt
    slots, _ = rows.slots([a, b])
    assert rows.pool[slots[0], :2].tolist() == [3, 9] and rows.pool[slots[1], 0] == 8
    slots, _ = rows.slots([c])  # pool full: rows not in this step are evicted
    assert rows.pool[slots[0], 0] == 7
    with pytest.raises(ValueError, match="max_model_len"):
        c.block_ids = [1, 2, 3, 4, 5]
        rows.slots([c])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incremental_block_table_matches_fresh_build_under_preemption(seed: int) -> None:
    """Drive the real scheduler with a KV pool small enough to preempt; every step's
    incrementally built inputs equal a from-scratch build (a fresh preparer)."""
    bs = 8
    rng = random.Random(seed)
    sched_cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=48, max_model_len=128)
    scheduler = Scheduler(sched_cfg, CacheConfig(block_size=bs, enable_prefix_caching=seed != 1), 24)
    prep = InputPreparer(CPU, 48, 8, bs, 128)
    buckets = decode_buckets(8)
    for i in range(14):
        prompt = [rng.randrange(50) for _ in range(rng.randrange(4, 40))]
        if i % 4 == 3:  # shared prefixes exercise prefix caching
            prompt = [1] * 16 + prompt
        params = SamplingParams(temperature=0.0, max_tokens=rng.randrange(5, 40), ignore_eos=True)
        scheduler.add_request(Request(f"q{i}", prompt, params))
    preempted = finished = steps = 0
    while scheduler.has_unfinished_requests():
        so = scheduler.schedule()
        preempted += len(so.preempted_request_ids)
        finished += len(so.finished_request_ids)
        if so.is_empty:
            break
        prep.drop(so.finished_request_ids)
        prep.drop(so.preempted_request_ids)
        pad = (lambda n: pick_bucket(buckets, n)) if steps % 2 else None
        inputs = prep.prepare(so, pad)
        _check_step(inputs, so, bs)
        fresh = InputPreparer(CPU, 48, 8, bs, 128).prepare(so, pad)
        for name in ("token_i64", "seq_i32", "block_table", "logits_indices"):
            assert torch.equal(getattr(inputs, name), getattr(fresh, name)), name
        tokens = {s.request.request_id: rng.randrange(50) for s in so.scheduled if s.sample}
        scheduler.update(so, ModelOutput(tokens))
        steps += 1
        assert len(prep.rows) <= 2 * 8 + 8
    assert preempted > 0, "the test must exercise preemption"
    assert steps > 20
