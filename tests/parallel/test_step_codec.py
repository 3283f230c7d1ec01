"""The step broadcast's deltas rebuild, on a worker, exactly the requests the scheduler holds."""

from __future__ import annotations

import random

from surge.config import CacheConfig, SchedulerConfig
from surge.core.outputs import ModelOutput
from surge.core.scheduler import Scheduler
from surge.parallel.step_codec import StepDecoder, StepEncoder
from surge.request import Request
from surge.sampling_params import SamplingParams


def test_mirror_follows_chunks_preemption_and_finishes() -> None:
    rng = random.Random(0)
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=24, max_model_len=128),
        CacheConfig(block_size=8, enable_prefix_caching=False),
        10,
    )
    eos = frozenset({2})
    for i in range(8):
        prompt = [1] + [rng.randrange(3, 500) for _ in range(rng.randrange(3, 30))]
        params = SamplingParams(max_tokens=rng.randrange(4, 20), ignore_eos=True)
        sched.add_request(Request(f"r{i}", prompt, params, eos))
    enc, dec = StepEncoder(), StepDecoder(eos)
    preempted = 0
    for _ in range(200):
        so = sched.schedule()
        if so.is_empty and not so.finished_request_ids and not sched.has_unfinished_requests():
            break
        preempted += len(so.preempted_request_ids)
        mirror = dec.decode(enc.encode(so))
        assert [s.request.request_id for s in mirror.scheduled] == [
            s.request.request_id for s in so.scheduled
        ]
        for theirs, ours in zip(mirror.scheduled, so.scheduled, strict=True):
            a, b = theirs.request, ours.request
            assert (a.prompt_token_ids, a.output_token_ids, a.block_ids) == (
                b.prompt_token_ids,
                b.output_token_ids,
                b.block_ids,
            )
            assert (a.num_computed_tokens, theirs.num_new_tokens, theirs.sample) == (
                b.num_computed_tokens,
                ours.num_new_tokens,
                ours.sample,
            )
            assert a.sampling_params == b.sampling_params
        sampled = {s.request.request_id: rng.randrange(3, 500) for s in so.scheduled if s.sample}
        sched.update(so, ModelOutput(sampled))
    assert not sched.has_unfinished_requests()
    assert preempted > 0, "the pool is small enough to preempt"
    so = sched.schedule()  # delivers the last finished ids
    dec.decode(enc.encode(so))
    assert len(dec) == len(enc) == 0


def test_ranks_and_replicas_land_on_their_gpus() -> None:
    import dataclasses

    from surge.config import EngineConfig, ModelConfig, ParallelConfig
    from surge.parallel.dp_client import replica_config
    from surge.parallel.launch import endpoints, rank_device

    model = ModelConfig.from_pretrained(None)  # bundled: 8 heads
    base = EngineConfig(
        model=model,
        scheduler=SchedulerConfig(max_model_len=512),
        device="cuda",
        parallel=ParallelConfig(tensor_parallel_size=2, data_parallel_size=2),
    )
    r1 = replica_config(base, 1)
    assert r1.device == "cuda:2" and [rank_device(r1, r) for r in range(2)] == ["cuda:2", "cuda:3"]
    assert [rank_device(replica_config(base, 0), r) for r in range(2)] == ["cuda:0", "cuda:1"]
    two_hosts = ParallelConfig(
        tensor_parallel_size=4, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29500
    )
    node1 = dataclasses.replace(base, parallel=two_hosts)
    assert list(two_hosts.local_ranks) == [2, 3]
    assert [rank_device(node1, r) for r in two_hosts.local_ranks] == ["cuda:0", "cuda:1"]
    ep = endpoints(node1, None)
    assert (ep.dist_init_method, ep.step_connect, ep.result_connect) == (
        "tcp://10.0.0.1:29500",
        "tcp://10.0.0.1:29501",
        "tcp://10.0.0.1:29502",
    )
    cpu = replica_config(dataclasses.replace(base, device="cpu"), 1)
    assert cpu.device == "cpu" and rank_device(cpu, 1) == "cpu"
