"""Decode form on CPU: small prefill and mixed steps laid out as one decode row per token and
run through the decode-graph path (static buffers, run eagerly: ``use_graphs=False``).

Greedy tokens must equal those of the same engine with decode form off (pure decodes still
take the graph path there) for a prompt found in the prefix cache, short prompts one at a
time, mixed steps, chunked prefill and preemption, with asynchronous scheduling; logits must
be close to the eager layout's; and with the Triton backend (interpreter on CPU) the split-KV
decode grid must give the rows of one sequence their own contexts."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from surge import LLM, SamplingParams
from surge.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from surge.core.outputs import ScheduledRequest, SchedulerOutput
from surge.layers.attention_backend import AttentionBackend
from surge.layers.torch_attention import TorchAttentionBackend
from surge.request import Request
from surge.worker.cuda_graph import DecodeGraphRunner, decode_buckets
from surge.worker.decode_form import DecodeFormPolicy
from surge.worker.input_batch import InputPreparer, PreparedInputs
from surge.worker.model_runner import ModelRunner
from tests.models.helpers import make_hf_model, make_runner
from tests.worker.helpers import drive, randomize, tiny_long_qwen3

# ----------------------------------------------------------------------------- the layout


def _req(rid: str, prompt: list[int], computed: int, blocks: list[int]) -> Request:
    r = Request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=4))
    r.num_computed_tokens = computed
    r.block_ids = blocks
    return r


def test_layout_is_one_decode_row_per_token() -> None:
    prep = InputPreparer(torch.device("cpu"), 64, 16, 4, 64)
    policy = DecodeFormPolicy(kv_bytes_per_token=1)
    a = _req("a", list(range(10, 20)), 7, [5, 2, 9])  # 3 new tokens at 7..9, samples
    b = _req("b", list(range(30, 36)), 0, [4, 1])  # a chunk of 4 at 0..3, samples nothing
    so = SchedulerOutput([ScheduledRequest(a, 3, True), ScheduledRequest(b, 4, False)], 7)
    eager = prep.prepare(so)
    e_tok = eager.token_i64.clone()
    e_logits = eager.logits_indices.clone()
    assert not eager.decode_form

    got = prep.prepare(so, lambda n: 8 if n <= 8 else None, None, policy)
    assert got.decode_form and got.num_tokens == 7 and got.num_seqs == 7
    assert got.padded_tokens == got.padded_seqs == 8
    assert got.max_query_len == 1 and not got.all_rows_sample
    assert torch.equal(got.token_i64[:, :7], e_tok)  # ids, positions, slots unchanged
    assert got.token_i64[:, 7].tolist() == [0, 0, -1]
    assert torch.equal(got.logits_indices, e_logits) and got.logits_indices.tolist() == [2]
    assert got.query_start_loc.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 7]
    assert got.seq_lens.tolist() == [8, 9, 10, 1, 2, 3, 4, 0]
    assert got.block_table.tolist() == [[5, 2, 9]] * 3 + [[4, 0, 0]] * 4
    assert got.query_start_loc_cpu == got.query_start_loc.tolist()
    assert got.seq_lens_cpu == got.seq_lens.tolist()

    # Over the token cap, or no bucket for the tokens: the ordinary (eager) layout.
    assert not prep.prepare(
        so, lambda n: 8 if n <= 8 else None, None, DecodeFormPolicy(1, max_tokens=6)
    ).decode_form
    assert not prep.prepare(so, lambda n: 4 if n <= 4 else None, None, policy).decode_form
    assert not prep.prepare(so, lambda n: 8, None, None).decode_form


def test_independent_rows_only_where_no_row_can_read_another_rows_new_kv() -> None:
    """``independent_rows`` (a backend may write K/V inside attention): a pure decode step of
    one sequence, or of several of which none completes a block (block size 4 here). A row
    completing a block may share it with a request admitted in the same step through the
    prefix cache, so such a step is not; neither is decode form nor a prefill."""
    prep = InputPreparer(torch.device("cpu"), 64, 16, 4, 64)

    def decode(*computed: int) -> bool:
        reqs = [
            _req(f"r{i}", list(range(1, c + 2)), c, [7 + 3 * i, 8 + 3 * i, 9 + 3 * i])
            for i, c in enumerate(computed)
        ]
        so = SchedulerOutput([ScheduledRequest(r, 1, True) for r in reqs], len(reqs))
        return prep.prepare(so).independent_rows

    assert decode(5) and decode(5, 9) and decode(4, 8)  # new tokens at positions 5/9, 4/8: no block ends
    assert decode(3)  # one sequence: its own program writes, then reads
    assert not decode(3, 5) and not decode(5, 7)  # position 3 or 7 completes a 4-token block
    a = _req("a", list(range(10, 20)), 7, [5, 2, 9])
    b = _req("b", list(range(30, 36)), 0, [4, 1])
    mixed = SchedulerOutput([ScheduledRequest(a, 3, True), ScheduledRequest(b, 4, False)], 7)
    assert not prep.prepare(mixed).independent_rows
    form = prep.prepare(mixed, lambda n: 8 if n <= 8 else None, None, DecodeFormPolicy(kv_bytes_per_token=1))
    assert form.decode_form and not form.independent_rows


def test_policy_bounds_tokens_and_kv_reads() -> None:
    q = np.array([16, 1], dtype=np.int64)
    s = np.array([4096, 100], dtype=np.int64)
    reads = 16 * 4096 - 16 * 15 // 2  # the decode row is not counted
    assert DecodeFormPolicy(kv_bytes_per_token=2, max_kv_read_bytes=2 * reads).allows(q, s)
    assert not DecodeFormPolicy(kv_bytes_per_token=2, max_kv_read_bytes=2 * reads - 1).allows(q, s)
    assert not DecodeFormPolicy(kv_bytes_per_token=1, max_tokens=16).allows(q, s)
    qwen3_8b = DecodeFormPolicy(kv_bytes_per_token=36 * 2 * 8 * 128 * 2)
    assert qwen3_8b.allows(np.array([16]), np.array([4096]))  # a cached 4096-token prompt
    assert not qwen3_8b.allows(np.array([16]), np.array([32768]))


# ----------------------------------------------------------------------------- the engine


def _uncaptured_graphs(runner: ModelRunner, **kw: Any) -> DecodeGraphRunner:
    """``runner``'s decode-graph path over static buffers, run eagerly (no capture)."""
    sc = runner.config.scheduler
    return DecodeGraphRunner(
        runner._forward,
        runner.device,
        decode_buckets(sc.max_num_seqs, sc.max_num_batched_tokens),
        runner.max_blocks_per_seq,
        sc.max_model_len,
        use_graphs=False,
        **kw,
    )


def _static_graphs(runner: ModelRunner, log: list[tuple[bool, int, int]]) -> DecodeGraphRunner:
    """The decode-graph path without capture; ``log`` gets (decode form?, tokens, pending
    tokens) of every step it runs."""
    graphs = _uncaptured_graphs(runner)
    run = graphs.run

    def logged_run(inputs: PreparedInputs) -> torch.Tensor:
        log.append((inputs.decode_form, inputs.num_tokens, inputs.num_pending))
        return run(inputs)

    graphs.run = logged_run  # type: ignore[method-assign]
    return graphs


def _generate(
    model: Path | None,
    batches: list[list[list[int]]],
    max_tokens: int,
    decode_form: bool,
    **kw: Any,
) -> tuple[list[list[int]], list[tuple[bool, int, int]], LLM]:
    """Each batch of prompts through ``LLM.generate`` in turn (one engine): their greedy
    tokens, the graph path's log (see :func:`_static_graphs`) and the engine."""
    llm = LLM(model, device="cpu", dtype="float32", **{"async_scheduling": True, **kw})
    runner = llm.engine.runner
    log: list[tuple[bool, int, int]] = []
    runner.graph_runner = _static_graphs(runner, log)
    if not decode_form:
        runner.decode_form = None
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    tokens = [o.outputs[0].token_ids for batch in batches for o in llm.generate(batch, sp)]
    return tokens, log, llm


def _prompts(seed: int, lengths: list[int], vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, vocab) for _ in range(n - 1)] for n in lengths]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    return make_hf_model("qwen3", tmp_path_factory.mktemp("decode_form") / "qwen3")


def _same_tokens(
    model: Path | None, batches: list[list[list[int]]], max_tokens: int, **kw: Any
) -> tuple[list[int], int, LLM]:
    """Greedy tokens with decode form on == off; returns the decode-form steps' token counts,
    their pending tokens (asynchronous scheduling) and the engine with decode form on."""
    on, log_on, llm = _generate(model, batches, max_tokens, True, **kw)
    off, log_off, _ = _generate(model, batches, max_tokens, False, **kw)
    assert on == off
    assert not any(form for form, _, _ in log_off)
    forms = [n for form, n, _ in log_on if form]
    assert forms, log_on
    return forms, sum(p for form, _, p in log_on if form), llm


def test_cached_prompt_computes_its_last_block_in_decode_form(qwen3: Path) -> None:
    prompt = _prompts(0, [64], 512)[0]  # 4 full blocks: 48 tokens hit, the last block recomputes
    forms, _, llm = _same_tokens(qwen3, [[prompt], [prompt], [prompt + [7, 9, 11]]], 6, max_num_seqs=32)
    assert forms.count(16) == 1  # the second round's only prefill step: its last block
    assert forms == [16, 3]  # then 64 hit, 3 new; the first 64-token prompt is eager (bucket 32)
    assert llm.engine.scheduler.get_stats().prefix_cache_hit_tokens == 48 + 64


def test_short_prompts_one_at_a_time(qwen3: Path) -> None:
    prompts = _prompts(1, [5, 12, 1, 31, 2], 512)
    forms, _, _ = _same_tokens(qwen3, [[p] for p in prompts], 5, max_num_seqs=32)
    assert sorted(n for n in forms if n in (5, 12, 31, 2)) == [2, 5, 12, 31]


def test_mixed_steps_chunked_prefill_and_preemption(qwen3: Path) -> None:
    prompts = _prompts(2, [9, 40, 3, 27, 60, 14, 22, 5], 512)
    # A budget of 24 tokens (and so at most 24 sequences): prompt chunks next to running decodes;
    # 12 blocks of 16 for sequences of up to 80 tokens: preemption and recompute.
    forms, pending, llm = _same_tokens(
        qwen3, [prompts], 20, max_num_seqs=24, max_num_batched_tokens=24, num_kv_blocks=12
    )
    assert any(n > 4 for n in forms), forms  # prompt chunks (mixed or not), not just decodes
    assert pending > 0  # asynchronous scheduling: decodes of mixed steps take their ids on the device
    assert llm.engine.scheduler.get_stats().num_preemptions_total > 0


def test_default_model_sync_and_async(tmp_path: Path) -> None:
    batches = [[p] for p in _prompts(3, [7, 12, 2, 15], 500)]
    for mode in (False, True):
        on, log_on, _ = _generate(None, batches, 8, True, max_num_seqs=16, async_scheduling=mode)
        off, _, _ = _generate(None, batches, 8, False, max_num_seqs=16, async_scheduling=mode)
        assert on == off
        assert any(form for form, _, _ in log_on)


# ----------------------------------------------------------------------------- logits


def test_logits_close_to_the_eager_layout(qwen3: Path) -> None:
    form = make_runner(qwen3, max_num_seqs=16)
    eager = make_runner(qwen3, max_num_seqs=16)
    for r in (form, eager):
        r.init_kv_cache(1024)
    log: list[tuple[bool, int, int]] = []
    form.graph_runner = _static_graphs(form, log)
    prompts = _prompts(4, [5, 3, 9, 1, 7, 2], 512)

    def close(a: torch.Tensor, b: torch.Tensor) -> None:
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

    drive([form, eager], prompts, [0, 0, 1, 2, 4, 4], 6, close)
    assert any(f and n > 1 for f, n, _ in log), log


def _triton_runner(path: Path, backend: AttentionBackend, static: bool) -> ModelRunner:
    mc = ModelConfig.from_pretrained(path, dtype="float32", load_format="dummy", max_model_len=1024)
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(block_size=16, num_kv_blocks=1024),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=1024),
        device="cuda" if torch.cuda.is_available() else "cpu",  # Triton's interpreter on CPU
        enforce_eager=True,
    )
    runner = ModelRunner(cfg, backend)
    randomize(runner)
    runner.init_kv_cache(1024)
    if static:
        runner.graph_runner = DecodeGraphRunner(
            runner._forward, runner.device, decode_buckets(8), runner.max_blocks_per_seq, 1024, False
        )
    return runner


def test_triton_split_kv_rows_sharing_a_block_table(tmp_path: Path) -> None:
    """Rows of one sequence over a 512-token prefix (three KV splits of up to 256 tokens
    each, then the reduce), next to a new short prompt, on the Triton decode grid."""
    from surge.layers.triton_attention import TritonAttentionBackend

    path = tiny_long_qwen3(tmp_path / "qwen3")
    backend = TritonAttentionBackend(num_sms=132)
    triton_runner = _triton_runner(path, backend, static=True)
    reference = _triton_runner(path, TorchAttentionBackend(), static=False)
    log: list[bool] = []
    graphs = triton_runner.graph_runner
    assert graphs is not None
    # Bucket 8 as captured (max_model_len decides the split count): split-KV is on.
    assert backend.num_splits(graphs._metadata(8, 1024, list(range(9)), [1] * 8), 2) > 1
    run = graphs.run

    def logged_run(inputs: PreparedInputs) -> torch.Tensor:
        log.append(inputs.decode_form)
        return run(inputs)

    graphs.run = logged_run  # type: ignore[method-assign]

    def close(a: torch.Tensor, b: torch.Tensor) -> None:
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

    # Step 0: 512 tokens of the first prompt (eager); step 1: its last 5 tokens over the
    # 512-token prefix + the second prompt's 2 tokens = 7 rows in decode form (bucket 8).
    prompts = [[(5 * j + 3) % 512 for j in range(517)], [11, 12]]
    drive([triton_runner, reference], prompts, [0, 1], 3, close)
    assert log[0] is True and log.count(True) == 1, log
    for (k, v), (k_ref, v_ref) in zip(triton_runner.kv_caches, reference.kv_caches, strict=True):
        torch.testing.assert_close(k, k_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v, v_ref, rtol=1e-5, atol=1e-5)


def test_true_decode_steps_replay_their_own_graph_variant(qwen3: Path) -> None:
    """A backend that fuses work into decode attention up to 2 sequences
    (:meth:`AttentionBackend.fuses_decode_rope`) gets ``independent_rows`` on the decode steps of
    buckets 1 and 2 only; decode-form steps (rows of one request read each other's new K/V) and
    larger buckets never see it, and the tokens do not change."""
    llm = LLM(qwen3, device="cpu", dtype="float32", max_num_seqs=8, async_scheduling=True)
    runner = llm.engine.runner
    graphs = _uncaptured_graphs(runner, independent_buckets=lambda bucket: bucket <= 2)
    assert graphs.independent == [1, 2]
    runner.graph_runner = graphs
    seen: list[tuple[bool, int, bool]] = []
    forward, run = runner._forward, graphs.run
    form = {"now": False, "independent": False}

    def logged_run(inputs: PreparedInputs) -> torch.Tensor:
        form["now"] = inputs.decode_form
        form["independent"] = inputs.independent_rows
        return run(inputs)

    def logged_forward(ids: torch.Tensor, pos: torch.Tensor, md: Any) -> torch.Tensor:
        assert not md.independent_rows or form["independent"]
        seen.append((form["now"], md.num_seqs, md.independent_rows))
        return forward(ids, pos, md)

    graphs.run = logged_run  # type: ignore[method-assign]
    graphs.forward = logged_forward
    sp = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    prompts = _prompts(3, [2, 9, 3], 512)
    fused = [o.outputs[0].token_ids for o in llm.generate(prompts[:1], sp)]
    fused += [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    assert (True, 2, False) in seen, seen  # the 2-token prompt: decode form in bucket 2
    for form_step, bucket, independent in seen:
        assert not independent or (not form_step and bucket <= 2), seen
    assert any(ind for _, _, ind in seen) and any(b > 2 and not f for f, b, _ in seen), seen
    plain = LLM(qwen3, device="cpu", dtype="float32", max_num_seqs=8, enforce_eager=True)
    expect = [o.outputs[0].token_ids for o in plain.generate(prompts[:1], sp)]
    expect += [o.outputs[0].token_ids for o in plain.generate(prompts, sp)]
    assert fused == expect
