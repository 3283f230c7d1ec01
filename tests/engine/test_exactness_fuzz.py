"""Differential fuzzing of the engine's exactness on CPU (float32), a bounded version.

Each workload is a seeded random mix of requests (prompts sharing prefixes, ``max_tokens``
including 0 and None, ``min_tokens``, ``n``, stop token ids, the model's EOS, ``ignore_eos``,
seeded sampling, penalties, logit rules, logprobs, prompt logprobs, priorities, cache salts)
that arrive between steps, some aborted mid-run, on an engine with a tiny KV pool
(preemption), a tiny token budget (chunked prefill), block sizes 8 to 32, prefix caching and
asynchronous scheduling on or off, FCFS or priority policy, prefix-cache resets. Every request
must get exactly what it gets alone on a generous engine: the same tokens, finish reason,
stop token and logprobs; an aborted request a prefix of them. Afterwards every KV block is
free and no request is left.

The references run one at a time on one engine under one request id, taken again as soon as
the previous reference finished, as ``LLMEngine.add_request`` allows.

Batch shapes change the float summation order, so a greedy token may legitimately differ
where the reference's two best logprobs are within ``_TIE`` of each other; such a workload
stops comparing that request there (none of the seeds below has one today).

A fixed workload (``test_shared_blocks_under_preemption_and_chunks``) adds what the random
prompts rarely make: requests that share one prompt's blocks in every way (a whole-block
prefix, a prefix ending mid-block, ``n`` choices, an abort mid-prefill, an extension up to
``max_model_len``, a prompt differing from it in one block's last token) on a pool just large
enough, with a budget of 8 tokens.

A longer run of the same workloads: ``run_workload`` over more seeds.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field

import msgspec
import pytest

from surge.core.outputs import EngineOutput
from surge.engine.llm_engine import LLMEngine, build_engine_config, choice_ids, choice_params
from surge.sampling_params import SamplingParams
from tests.engine.tiny_models import make_tiny_model

_MAX_LEN = 160
_TOL = 2e-4  # logprob tolerance (float32, different batch shapes)
_TIE = 2e-3  # a greedy choice closer than this may flip with the batch shape


@dataclass(frozen=True)
class _Model:
    path: str
    eos: frozenset[int]  # every id that ends a request: the configs' EOS and the tokenizer's
    frequent: list[int]  # tokens the model often generates: stop ids, logit rules


@dataclass
class _Spec:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    arrival_step: int
    abort_step: int | None
    priority: int
    cache_salt: str | None


@dataclass
class _Got:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[tuple[list[int], list[float], int]] = field(default_factory=list)
    prompt_logprobs: list[tuple[list[int], list[float], int]] | None = None
    finish_reason: str | None = None
    stop_token_id: int | None = None
    aborted: bool = False
    late_outputs: int = 0  # outputs after it finished or was aborted


def _engine(model: str, **kwargs: object) -> LLMEngine:
    return LLMEngine(
        build_engine_config(model, device="cpu", dtype="float32", max_model_len=_MAX_LEN, **kwargs)  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> _Model:
    """A tiny Qwen3 whose EOS is the token it generates most (so requests do stop on EOS)."""
    path = make_tiny_model("qwen3", tmp_path_factory.mktemp("fuzz"), max_position_embeddings=512)
    engine = _engine(str(path), num_kv_blocks=64, async_scheduling=False)
    rng = random.Random(0)
    counts: Counter[int] = Counter()
    for i in range(6):
        prompt = [1] + [rng.randrange(3, 500) for _ in range(rng.randrange(1, 30))]
        engine.add_request(f"p{i}", prompt, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
        while engine.has_unfinished_requests():
            for out in engine.step():
                counts.update(out.new_token_ids)
    frequent = [t for t, _ in counts.most_common(9)]
    for name in ("config.json", "generation_config.json"):
        config = json.loads((path / name).read_text())
        config["eos_token_id"] = frequent[0]
        (path / name).write_text(json.dumps(config))
    eos = frozenset(build_engine_config(str(path), device="cpu").model.eos_token_ids)
    assert frequent[0] in eos
    return _Model(str(path), eos, frequent[1:])


def _world(rng: random.Random) -> dict[str, object]:
    world: dict[str, object] = {
        "block_size": rng.choice([8, 16, 32]),
        "enable_prefix_caching": rng.random() < 0.7,
        "async_scheduling": rng.random() < 0.5,
        "scheduling_policy": rng.choice(["fcfs", "priority"]),
    }
    budget = rng.choice([8, 16, 33, 2048])
    # more sequences than the budget has tokens is refused (as vLLM): a tiny budget takes as many
    world.update(max_num_batched_tokens=budget, max_num_seqs=min(rng.choice([1, 3, 256]), budget))
    return world


def _params(rng: random.Random, frequent: list[int]) -> SamplingParams:
    max_tokens: int | None = rng.choice([0, 1, 5, 17, 30, 45])
    kw: dict[str, object] = {"n": rng.choice([1, 1, 1, 2, 3]), "ignore_eos": rng.random() < 0.3}
    kw["min_tokens"] = rng.randrange(0, max_tokens + 1) if rng.random() < 0.3 else 0
    if rng.random() < 0.08:
        max_tokens, kw["min_tokens"] = None, 0  # all the room the context leaves
    if rng.random() < 0.4:
        kw["stop_token_ids"] = rng.sample(frequent, rng.randrange(1, 3))
    if rng.random() < 0.4:
        kw["logprobs"] = rng.randrange(0, 4)
    if rng.random() < 0.25:
        kw["prompt_logprobs"] = rng.randrange(0, 3)
    if rng.random() < 0.25:
        kw.update(
            temperature=rng.choice([0.5, 1.0, 2.0]), seed=rng.randrange(1000), top_k=rng.choice([None, 5])
        )
    else:
        kw["temperature"] = 0.0
    if rng.random() < 0.15:
        kw[rng.choice(["repetition_penalty", "presence_penalty", "frequency_penalty"])] = rng.choice(
            [0.5, 1.3]
        )
    rule = rng.random()
    if rule < 0.06:
        kw["logit_bias"] = {t: rng.choice([-5.0, 5.0]) for t in rng.sample(frequent, 3)}
    elif rule < 0.12:
        kw["allowed_token_ids"] = rng.sample(range(3, 512), rng.choice([20, 300])) + frequent[:2]
    elif rule < 0.18:
        kw["bad_words_token_ids"] = [(rng.choice(frequent),), tuple(rng.sample(frequent, 2))]
    return SamplingParams(max_tokens=max_tokens, **kw)  # type: ignore[arg-type]


def _specs(rng: random.Random, model: _Model, policy: object) -> list[_Spec]:
    prefixes = [
        [rng.randrange(3, 500) for _ in range(rng.randrange(0, 70))] for _ in range(rng.randrange(1, 4))
    ]
    specs: list[_Spec] = []
    for i in range(rng.randrange(4, 11)):
        if specs and rng.random() < 0.1:
            prompt = list(rng.choice(specs).prompt)  # the same prompt again
        else:
            prompt = [1] + rng.choice(prefixes) + [rng.randrange(3, 500) for _ in range(rng.randrange(0, 40))]
        arrival = 0 if rng.random() < 0.4 else rng.randrange(40)
        abort = arrival + rng.randrange(30) if rng.random() < 0.12 else None
        priority = rng.randrange(4) if policy == "priority" else 0
        salt = rng.choice([None, None, "a"])
        specs.append(_Spec(f"r{i}", prompt, _params(rng, model.frequent), arrival, abort, priority, salt))
    return specs


def _record(got: dict[str, _Got], outputs: list[EngineOutput]) -> None:
    for out in outputs:
        g = got.setdefault(out.request_id, _Got())
        if g.finish_reason is not None or g.aborted:
            g.late_outputs += 1
            continue
        g.tokens += out.new_token_ids
        if out.logprobs is not None:
            rows = out.logprobs
            g.logprobs += list(zip(rows.token_ids, rows.logprobs, rows.ranks, strict=True))
        if out.prompt_logprobs is not None:
            assert g.prompt_logprobs is None, f"{out.request_id}: prompt logprobs sent twice"
            rows = out.prompt_logprobs
            g.prompt_logprobs = list(zip(rows.token_ids, rows.logprobs, rows.ranks, strict=True))
        if out.finish_reason is not None:
            g.finish_reason, g.stop_token_id = out.finish_reason, out.stop_token_id


def _alone(ref: LLMEngine, prompt: list[int], params: SamplingParams) -> _Got:
    """The request alone on ``ref``, with 2 more top logprobs and prompt logprobs than it asks
    for (at least 4: the tie margin, and the entries a near tie may swap in)."""
    wider = {"logprobs": max(params.logprobs or 0, 2) + 2}
    if params.prompt_logprobs is not None:
        wider["prompt_logprobs"] = params.prompt_logprobs + 2
    ref.add_request("ref", prompt, msgspec.structs.replace(params, **wider))
    got: dict[str, _Got] = {}
    while ref.has_unfinished_requests():
        _record(got, ref.step())
    return got["ref"]


def _row_problem(row: tuple, ref: tuple, k: int) -> str | None:
    """Why a logprob row differs from the reference's (None when it matches). The reference
    lists more entries: an entry swapped with its near tie must be found there."""
    (ids, lps, rank), (ref_ids, ref_lps, ref_rank) = row, ref
    if ids[0] != ref_ids[0] or abs(lps[0] - ref_lps[0]) > _TOL:
        return f"token {ids[0]} {lps[0]} vs {ref_ids[0]} {ref_lps[0]}"
    if len(ids) != k + 1 or len(ref_ids) < k + 3:
        return f"{len(ids) - 1} top entries (alone {len(ref_ids) - 3} + 2) for {k} asked"
    # A rank past the listed entries may move by one: its neighbours are not listed, so a near
    # tie there (1e-6 apart at rank 140 of a prompt token, seen in longer runs) cannot be told.
    unlisted = min(rank, ref_rank) >= len(ref_ids) and abs(rank - ref_rank) == 1
    if rank != ref_rank and not unlisted and min(abs(lps[0] - x) for x in ref_lps[1:]) > _TIE:
        return f"rank {rank} vs {ref_rank}"
    listed = dict(zip(ref_ids[1:], ref_lps[1:], strict=True))
    for j in range(1, k + 1):
        swapped = ids[j] != ref_ids[j] and abs(listed.get(ids[j], -1e9) - ref_lps[j]) > _TIE
        if swapped or abs(lps[j] - ref_lps[j]) > _TOL:
            return f"top {j}: {ids[j]} {lps[j]} vs {ref_ids[j]} {ref_lps[j]}"
    return None


def _problems(
    rid: str, spec: _Spec, params: SamplingParams, g: _Got, ref: _Got, eos: frozenset[int]
) -> list[str]:
    """Every way a request's result differs from its reference alone."""
    problems = [f"{rid}: {g.late_outputs} outputs after its end"] if g.late_outputs else []
    for j, (a, b) in enumerate(zip(g.tokens, ref.tokens, strict=False)):
        if a != b:
            margin = ref.logprobs[j][1][1] - ref.logprobs[j][1][2]
            if params.temperature == 0 and (margin < _TIE or j < params.min_tokens):
                return problems  # a near tie: the batch's summation order may flip it
            return [*problems, f"{rid}: token {j} is {a}, alone {b} (margin {margin:.3g})"]
    if g.aborted:
        if len(g.tokens) > len(ref.tokens):
            problems.append(
                f"{rid}: aborted after {len(g.tokens)} tokens, alone it ends at {len(ref.tokens)}"
            )
    else:
        if len(g.tokens) != len(ref.tokens):
            problems.append(f"{rid}: {len(g.tokens)} tokens, alone {len(ref.tokens)}")
        if (g.finish_reason, g.stop_token_id) != (ref.finish_reason, ref.stop_token_id):
            problems.append(
                f"{rid}: ends {g.finish_reason}/{g.stop_token_id}, alone {ref.finish_reason}/{ref.stop_token_id}"
            )
        room = _MAX_LEN - len(spec.prompt)
        if g.finish_reason == "length" and len(g.tokens) not in (params.max_tokens, room):
            problems.append(f"{rid}: 'length' after {len(g.tokens)} tokens of max_tokens {params.max_tokens}")
        if g.finish_reason == "stop":
            last = g.tokens[-1]
            if len(g.tokens) < params.min_tokens and params.allowed_token_ids is None:
                problems.append(f"{rid}: stopped before min_tokens")
            if last not in params.stop_token_ids and (last not in eos or params.ignore_eos):
                problems.append(f"{rid}: stopped on {last}")
    if params.logprobs is None and g.logprobs:
        problems.append(f"{rid}: logprobs not asked for")
    if params.logprobs is not None:
        if len(g.logprobs) != len(g.tokens):
            problems.append(f"{rid}: {len(g.logprobs)} logprob rows for {len(g.tokens)} tokens")
        for j, row in enumerate(g.logprobs[: len(g.tokens)]):
            if (why := _row_problem(row, ref.logprobs[j], params.logprobs)) is not None:
                problems.append(f"{rid}: logprobs of token {j}: {why}")
                break
    if (params.prompt_logprobs is None) != (g.prompt_logprobs is None) and not g.aborted:
        problems.append(
            f"{rid}: prompt logprobs {'missing' if g.prompt_logprobs is None else 'not asked for'}"
        )
    if (
        params.prompt_logprobs is not None
        and g.prompt_logprobs is not None
        and ref.prompt_logprobs is not None
    ):
        if len(g.prompt_logprobs) != len(spec.prompt) - 1:
            problems.append(
                f"{rid}: {len(g.prompt_logprobs)} prompt rows for {len(spec.prompt)} prompt tokens"
            )
        for j, (row, ref_row) in enumerate(zip(g.prompt_logprobs, ref.prompt_logprobs, strict=False)):
            if (why := _row_problem(row, ref_row, params.prompt_logprobs)) is not None:
                problems.append(f"{rid}: prompt logprobs of position {j + 1}: {why}")
                break
    return problems


def run_workload(model: _Model, ref: LLMEngine, seed: int) -> tuple[list[str], Counter[str]]:
    """Run workload ``seed`` and compare it with each request alone on ``ref``.

    Returns:
        (the problems found, counts of what it covered).
    """
    rng = random.Random(seed)
    world = _world(rng)
    specs = _specs(rng, model, world["scheduling_policy"])
    bs = world["block_size"]
    assert isinstance(bs, int)
    tiny = rng.random() < 0.6
    largest = max(
        _MAX_LEN if s.params.max_tokens is None else len(s.prompt) + s.params.max_tokens for s in specs
    )
    num_blocks = -(-largest // bs) + rng.choice([0, 1, 2, 4]) if tiny else 1024
    return run_specs(model, ref, f"seed {seed}", world, specs, num_blocks, rng)


def run_specs(
    model: _Model,
    ref: LLMEngine,
    label: str,
    world: dict[str, object],
    specs: list[_Spec],
    num_blocks: int,
    rng: random.Random,
) -> tuple[list[str], Counter[str]]:
    """Run ``specs`` on an engine of ``world`` and ``num_blocks`` KV blocks (``rng`` decides the
    prefix-cache resets) and compare each request with it alone on ``ref``.

    Returns:
        (the problems found, each prefixed by ``label``; counts of what it covered).
    """
    engine = _engine(model.path, num_kv_blocks=num_blocks, **world)
    got: dict[str, _Got] = {}
    children = {s.request_id: choice_ids(s.request_id, s.params.n) for s in specs}
    waiting = sorted(specs, key=lambda s: s.arrival_step)
    step = 0
    while waiting or engine.has_unfinished_requests():
        while waiting and waiting[0].arrival_step <= step:
            s = waiting.pop(0)
            refused = engine.add_choices(
                children[s.request_id], s.prompt, s.params, priority=s.priority, cache_salt=s.cache_salt
            )
            assert not refused, refused
        for s in specs:
            if s.abort_step == step and s.arrival_step <= step:
                live = [c for c in children[s.request_id] if got.setdefault(c, _Got()).finish_reason is None]
                for c in live:
                    got[c].aborted = True
                engine.abort_requests(live)
        if rng.random() < 0.03:
            engine.reset_prefix_cache()
        _record(got, engine.step())
        step += 1
        assert step < 5000, f"{label}: no progress"
    stats = engine.get_stats()
    problems = []
    if stats.num_free_blocks != stats.num_total_blocks or any(engine.scheduler.kv.pool.ref_counts):
        problems.append(f"{stats.num_free_blocks} of {stats.num_total_blocks} KV blocks free at the end")
    if engine.scheduler.requests:
        problems.append(f"requests left: {sorted(engine.scheduler.requests)}")
    covered: Counter[str] = Counter(workloads=1, preemptions=stats.num_preemptions_total)
    for s in specs:
        for rid, params in zip(children[s.request_id], choice_params(s.params), strict=True):
            g = got.get(rid, _Got())
            covered["requests"] += 1
            covered["aborted" if g.aborted else (g.finish_reason or "unfinished")] += 1
            if not g.aborted and g.finish_reason is None:
                problems.append(f"{rid}: never finished")
                continue
            problems += _problems(rid, s, params, g, _alone(ref, s.prompt, params), model.eos)
    return [f"{label} {world}: {p}" for p in problems], covered


_SEEDS = range(16)  # about 8 s of CPU; 4 of them preempt, 8 abort requests


def test_each_request_gets_what_it_gets_alone(model: _Model) -> None:
    ref = _engine(model.path, num_kv_blocks=512, enable_prefix_caching=False, async_scheduling=False)
    problems: list[str] = []
    covered: Counter[str] = Counter()
    for seed in _SEEDS:
        found, counts = run_workload(model, ref, seed)
        problems += found
        covered += counts
    assert not problems, "\n".join(problems[:20])
    for what in ("preemptions", "aborted", "stop", "length"):
        assert covered[what] > 0, f"the seeds no longer cover {what}: {dict(covered)}"


def _shared_prefix_specs(model: _Model, bs: int, policy: str) -> list[_Spec]:
    """Requests that share the blocks of one prompt ``whole`` (3 blocks exactly) in every way
    that touches the prefix cache: ``n`` = 3 choices of it, its first 2 blocks, a prefix ending
    mid-block, an extension up to ``max_model_len``, a copy aborted mid-prefill (the others hit
    its blocks), a copy under ``min_tokens`` with stop ids, one with prompt logprobs (no cache
    lookup), one of another salt, one that differs from it in the last token of a block; most
    arrive at once, some a few steps later; under the ``priority`` policy, priorities 0 to 2."""
    rng = random.Random(1)
    whole = [1] + [rng.randrange(3, 500) for _ in range(3 * bs - 1)]
    longer = whole + [rng.randrange(3, 500) for _ in range(5)]
    other = list(whole)
    other[2 * bs - 1] = whole[2 * bs - 1] % 499 + 1  # differs from whole in one token, a block's last
    greedy = {"temperature": 0.0}
    stops = {"stop_token_ids": model.frequent[:2], **greedy}
    table: list[tuple[list[int], SamplingParams, int, int | None, str | None]] = [
        (whole, SamplingParams(n=3, max_tokens=20, **greedy), 0, None, None),
        (whole[: 2 * bs], SamplingParams(max_tokens=17, ignore_eos=True, **greedy), 0, None, None),
        (whole, SamplingParams(max_tokens=30, **greedy), 0, 1, None),
        (whole[: bs + 5], SamplingParams(max_tokens=12, min_tokens=8, **stops), 0, None, None),
        (longer, SamplingParams(max_tokens=_MAX_LEN - len(longer), **greedy), 2, None, None),
        (whole, SamplingParams(max_tokens=9, prompt_logprobs=1, **greedy), 3, None, None),
        (whole, SamplingParams(n=2, max_tokens=6, **stops), 4, None, "a"),
        (whole[: 2 * bs] + longer[-3:], SamplingParams(max_tokens=25, **greedy), 6, None, None),
        (other, SamplingParams(max_tokens=15, **greedy), 7, None, None),
    ]
    return [
        _Spec(f"s{i}", prompt, params, arrival, abort, i % 3 if policy == "priority" else 0, salt)
        for i, (prompt, params, arrival, abort, salt) in enumerate(table)
    ]


def test_shared_blocks_under_preemption_and_chunks(model: _Model) -> None:
    """The requests of :func:`_shared_prefix_specs` on a pool just large enough for the
    longest (preemption, eviction), a budget of 8 tokens (chunked prefill: choices hit blocks
    registered in the same step), synchronous under the priority policy and asynchronous under
    fcfs: each gets what it gets alone."""
    ref = _engine(model.path, num_kv_blocks=512, enable_prefix_caching=False, async_scheduling=False)
    bs = 16
    problems: list[str] = []
    covered: Counter[str] = Counter()
    for async_scheduling, policy in ((False, "priority"), (True, "fcfs")):
        world: dict[str, object] = {
            "block_size": bs,
            "enable_prefix_caching": True,
            "async_scheduling": async_scheduling,
            "scheduling_policy": policy,
            "max_num_batched_tokens": 8,
            "max_num_seqs": 4,
        }
        specs = _shared_prefix_specs(model, bs, policy)
        found, counts = run_specs(model, ref, policy, world, specs, -(-_MAX_LEN // bs), random.Random(0))
        problems += found
        covered += counts
    assert not problems, "\n".join(problems[:20])
    for what in ("preemptions", "aborted", "length"):
        assert covered[what] > 0, f"the workload no longer covers {what}: {dict(covered)}"
