"""Logprobs of generated and prompt tokens against ``torch.log_softmax`` of Hugging Face logits.

A tiny fp32 random Qwen3 on CPU, through the offline ``LLM``: values, ranks and top-k must
match HF's within 1e-4 under chunked prefill (a 16-token budget), preemption (a tiny KV
pool), asynchronous scheduling, prefix caching, sampling with temperature and penalties
(logprobs are of the raw logits), and ``n > 1``. A request without logprobs next to one
with them gets the same tokens as alone.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from surge import LLM, SamplingParams
from surge.core.logprobs import PositionLogprobs
from tests.engine.tiny_models import hf_logprobs, make_tiny_model

TOL = 1e-4
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3_lp"))


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 512) for _ in range(n)] for n in lengths]


def _check_position(entry: PositionLogprobs, token: int, ref: torch.Tensor, k: int) -> None:
    """One position: exactly ``token`` and HF's top-k, each with HF's logprob and rank."""
    top = set(torch.topk(ref, k).indices.tolist()) if k else set()
    assert set(entry) == top | {token}
    for t, lp in entry.items():
        assert lp.logprob == pytest.approx(float(ref[t]), abs=TOL)
        assert lp.rank == int((ref > ref[t]).sum()) + 1


def _check(
    hf: torch.nn.Module, prompt: list[int], out_ids: list[int], out_lps, prompt_lps, k: int, pk: int
) -> None:  # noqa: ANN001
    ref = hf_logprobs(hf, prompt + out_ids)
    if out_lps is not None:
        assert len(out_lps) == len(out_ids)
        for i, (token, entry) in enumerate(zip(out_ids, out_lps, strict=True)):
            _check_position(entry, token, ref[len(prompt) - 1 + i], k)
    if prompt_lps is not None:
        assert len(prompt_lps) == len(prompt) and prompt_lps[0] is None
        for j in range(1, len(prompt)):
            _check_position(prompt_lps[j], prompt[j], ref[j - 1], pk)


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        {},
        {"max_num_batched_tokens": 16},
        {"max_num_batched_tokens": 16, "async_scheduling": True},
    ],
    ids=["default", "chunked", "chunked_async"],
)
def test_generated_and_prompt_logprobs_match_hf(
    model_dir: Path, hf: torch.nn.Module, engine_kwargs: dict[str, object]
) -> None:
    llm = LLM(model_dir, device="cpu", dtype="float32", **engine_kwargs)  # type: ignore[arg-type]
    prompts = _prompts(1, (1, 5, 17, 40))
    params = [
        SamplingParams(
            temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=3, prompt_logprobs=2
        ),
        # Sampled with temperature and penalties: logprobs are still those of the raw logits.
        SamplingParams(
            temperature=1.3,
            top_k=20,
            repetition_penalty=1.5,
            presence_penalty=0.5,
            seed=7,
            max_tokens=NEW_TOKENS,
            ignore_eos=True,
            logprobs=0,
            prompt_logprobs=0,
        ),
        SamplingParams(temperature=0.7, top_p=0.9, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=20),
        SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, prompt_logprobs=20),
    ]
    outs = llm.generate(prompts, params)
    for prompt, p, out in zip(prompts, params, outs, strict=True):
        c = out.outputs[0]
        assert len(c.token_ids) == NEW_TOKENS
        assert (c.logprobs is None) == (p.logprobs is None)
        assert (out.prompt_logprobs is None) == (p.prompt_logprobs is None)
        _check(
            hf, prompt, c.token_ids, c.logprobs, out.prompt_logprobs, p.logprobs or 0, p.prompt_logprobs or 0
        )
        if c.logprobs is not None:
            assert all(e[t].decoded_token is not None for e, t in zip(c.logprobs, c.token_ids, strict=True))


def test_prompt_logprobs_under_preemption_and_prefix_cache(model_dir: Path, hf: torch.nn.Module) -> None:
    # Prompts just under a block boundary and a 6-block pool force preemptions (recompute).
    prompts = _prompts(3, (14, 13, 12, 11, 30, 29))
    llm = LLM(model_dir, device="cpu", dtype="float32", num_kv_blocks=6, max_num_batched_tokens=16)
    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=2, prompt_logprobs=3
    )
    outs = llm.generate(prompts, params)
    assert llm.engine.get_stats().num_preemptions_total > 0
    for prompt, out in zip(prompts, outs, strict=True):
        c = out.outputs[0]
        _check(hf, prompt, c.token_ids, c.logprobs, out.prompt_logprobs, 2, 3)

    # A prompt whose prefix is cached still gets every prompt position scored.
    llm = LLM(model_dir, device="cpu", dtype="float32")
    shared = _prompts(4, (40,))[0]
    llm.generate([shared], SamplingParams(max_tokens=2))
    out = llm.generate([shared + [7, 8]], SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=1))[0]
    _check(hf, shared + [7, 8], out.outputs[0].token_ids, None, out.prompt_logprobs, 0, 1)


def test_n_choices_each_get_logprobs(model_dir: Path, hf: torch.nn.Module) -> None:
    llm = LLM(model_dir, device="cpu", dtype="float32")
    prompt = _prompts(5, (9,))[0]
    params = SamplingParams(
        n=3, temperature=1.0, seed=3, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=4, prompt_logprobs=1
    )
    out = llm.generate([prompt], params)[0]
    assert len(out.outputs) == 3
    for c in out.outputs:
        _check(hf, prompt, c.token_ids, c.logprobs, out.prompt_logprobs, 4, 1)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_logprobs_neighbour_changes_no_tokens(model_dir: Path, async_scheduling: bool) -> None:
    llm = LLM(model_dir, device="cpu", dtype="float32", async_scheduling=async_scheduling)
    prompts = _prompts(6, (3, 20, 8))
    plain = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, plain)]
    asking = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=5, prompt_logprobs=5
    )
    mixed = llm.generate(prompts + prompts, [plain] * 3 + [asking] * 3)
    assert [o.outputs[0].token_ids for o in mixed[:3]] == alone
    assert [o.outputs[0].token_ids for o in mixed[3:]] == alone
    assert all(o.outputs[0].logprobs is None and o.prompt_logprobs is None for o in mixed[:3])
    assert all(o.outputs[0].logprobs is not None and o.prompt_logprobs is not None for o in mixed[3:])


def test_logprobs_limits() -> None:
    for field in ("logprobs", "prompt_logprobs"):
        for bad in (-1, 21):
            with pytest.raises(ValueError, match=field):
                SamplingParams(**{field: bad})
        assert getattr(SamplingParams(**{field: 20}), field) == 20


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_logprobs_on_cuda_with_graphs_and_async(model_dir: Path, hf: torch.nn.Module) -> None:
    """CUDA graphs + asynchronous scheduling: decode steps replay graphs while logprobs are
    computed from their logits; values against HF (fp32; Triton's dots may use TF32: 2e-3)."""
    tol = 2e-3
    llm = LLM(model_dir, device="cuda", dtype="float32", max_num_batched_tokens=16, async_scheduling=True)
    assert llm.engine.runner.graph_runner is not None
    prompts = _prompts(7, (1, 5, 17, 40))
    asking = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=5, prompt_logprobs=5
    )
    plain = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate(prompts + prompts, [asking] * 4 + [plain] * 4)
    for prompt, out in zip(prompts, outs[:4], strict=True):
        c = out.outputs[0]
        ref = hf_logprobs(hf, prompt + c.token_ids)
        assert c.logprobs is not None and out.prompt_logprobs is not None
        for i, (token, entry) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
            assert entry[token].logprob == pytest.approx(float(ref[len(prompt) - 1 + i][token]), abs=tol)
            assert len(entry) in (5, 6)
        for j in range(1, len(prompt)):
            got = out.prompt_logprobs[j][prompt[j]].logprob
            assert got == pytest.approx(float(ref[j - 1][prompt[j]]), abs=tol)
    assert [o.outputs[0].token_ids for o in outs[:4]] == [o.outputs[0].token_ids for o in outs[4:]]
