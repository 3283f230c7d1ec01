"""Exact lengths, EOS, min_tokens, stop strings and seeds through the offline LLM API."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from surge import LLM, SamplingParams
from tests.conftest import STORIES

PROMPTS = ["Once upon a time", "Lily and Tim", "The dog", "One day, a big"]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(device="cpu")


@pytest.mark.parametrize("n", [1, 7, 33, 200])
def test_ignore_eos_gives_exact_length(llm: LLM, n: int) -> None:
    params = SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.8, seed=3)
    for out in llm.generate(PROMPTS, params):
        assert len(out.outputs[0].token_ids) == n
        assert out.outputs[0].finish_reason == "length"


@pytest.fixture(scope="module")
def comma_eos_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """stories260K whose EOS is ',' (id 432), the first greedy token after 'Once upon a time'."""
    path = tmp_path_factory.mktemp("stories_comma_eos")
    for f in STORIES.iterdir():
        shutil.copy(f, path / f.name)
    for name in ("config.json", "generation_config.json"):
        cfg = json.loads((path / name).read_text())
        cfg["eos_token_id"] = 432
        (path / name).write_text(json.dumps(cfg))
    return path


def test_eos_stops_with_stop_and_min_tokens_is_honoured(comma_eos_model: Path) -> None:
    llm = LLM(comma_eos_model, device="cpu")
    out = llm.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=20))[0].outputs[0]
    assert out.token_ids == [432]
    assert out.finish_reason == "stop"
    assert out.text == ""
    out = llm.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=40, min_tokens=10))[
        0
    ].outputs[0]
    assert len(out.token_ids) >= 10
    assert 432 not in out.token_ids[:10]
    if out.finish_reason == "stop":
        assert out.token_ids[-1] == 432
    else:
        assert len(out.token_ids) == 40


def test_min_tokens_bans_eos_under_ignore_eos(comma_eos_model: Path) -> None:
    """As vLLM 0.26 (its min-tokens processor bans ``all_stop_token_ids``, which hold the EOS
    ids under ``ignore_eos`` too): no EOS among the first ``min_tokens`` tokens, then EOS may
    come (and does not end the request)."""
    llm = LLM(comma_eos_model, device="cpu")
    params = SamplingParams(
        temperature=0.0, max_tokens=12, min_tokens=5, ignore_eos=True, logit_bias={432: 100.0}
    )
    out = llm.generate("Once upon a time", params)[0].outputs[0]
    assert len(out.token_ids) == 12
    assert 432 not in out.token_ids[:5]
    assert out.token_ids[5:] == [432] * 7
    assert out.finish_reason == "length"


def test_stop_token_ids_and_stop_strings(llm: LLM) -> None:
    greedy = llm.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=64))[0]
    text = greedy.outputs[0].text
    assert "Lily" in text
    out = llm.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=64, stop=["Lily"]))[
        0
    ].outputs[0]
    assert out.finish_reason == "stop"
    assert out.stop_reason == "Lily"
    assert out.text == text[: text.index("Lily")]
    stop_id = greedy.outputs[0].token_ids[5]
    out = llm.generate(
        "Once upon a time", SamplingParams(temperature=0.0, max_tokens=64, stop_token_ids=[stop_id])
    )[0].outputs[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == greedy.outputs[0].token_ids[:6]


def test_seed_is_independent_of_the_batch(llm: LLM) -> None:
    seeded = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=24, seed=1234, ignore_eos=True)
    alone = llm.generate(["Lily and Tim"], seeded)[0].outputs[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)
    batch = llm.generate(
        ["The dog", "Lily and Tim", "One day, a big", "Once upon a time"],
        [others, seeded, others, SamplingParams(temperature=0.0, max_tokens=5)],
    )
    assert batch[1].outputs[0].token_ids == alone
    again = llm.generate(["Lily and Tim"], seeded)[0].outputs[0].token_ids
    assert again == alone
    different = llm.generate(
        ["Lily and Tim"], SamplingParams(temperature=1.0, top_p=0.95, max_tokens=24, seed=99, ignore_eos=True)
    )
    assert different[0].outputs[0].token_ids != alone


def test_seeded_and_greedy_tokens_survive_preemption_and_prefix_hits() -> None:
    """docs/openai-api.md (`seed`): on CPU a seeded or greedy request gives the same tokens alone
    and in a batch whose small KV pool preempts it (recompute) and serves prefix-cache hits."""
    small = LLM(device="cpu", num_kv_blocks=6, block_size=16, max_num_batched_tokens=32, max_num_seqs=8)
    params = [
        SamplingParams(temperature=1.0, top_p=0.9, max_tokens=40, seed=7, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0.8, max_tokens=30, seed=11, n=2, ignore_eos=True),
    ]
    # The prompts share their first 16-token block: a prefix-cache hit for all but the first.
    base = "Once upon a time, there was a little girl named Sue."
    prompts = [base + " Lily", base + " Tim", base + " the dog"]
    alone = [small.generate([p], [sp])[0] for p, sp in zip(prompts, params, strict=True)]
    before = small.engine.get_stats()
    loaded = small.generate(prompts * 2, params * 2)
    stats = small.engine.get_stats()
    assert stats.num_preemptions_total > before.num_preemptions_total
    assert stats.prefix_cache_hit_tokens > before.prefix_cache_hit_tokens
    assert stats.num_free_blocks == stats.num_total_blocks
    for i, out in enumerate(loaded):
        want = [c.token_ids for c in alone[i % 3].outputs]
        assert [c.token_ids for c in out.outputs] == want, i


def test_n_returns_n_completions(llm: LLM) -> None:
    out = llm.generate(
        "Lily and Tim", SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=16, ignore_eos=True)
    )[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert all(len(o.token_ids) == 16 for o in out.outputs)
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1


def test_impossible_request_is_rejected(llm: LLM) -> None:
    """A prompt that alone fills the context can never run (a max_tokens past the context only
    ends the output there, as in vLLM's offline API: test_llm_api_edges.py)."""
    limit = llm.engine.config.scheduler.max_model_len
    with pytest.raises(ValueError, match="context length"):
        llm.generate([[1] * (limit + 1)], SamplingParams(max_tokens=4))
    # The engine is still usable afterwards.
    assert llm.generate("Once", SamplingParams(max_tokens=3, ignore_eos=True))[0].outputs[0].token_ids


def _surge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "surge.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_generate_cli_prints_golden_text() -> None:
    golden = json.loads((STORIES / "golden_greedy.json").read_text())["cases"][0]
    proc = _surge("generate", "--prompt", golden["prompt"], "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == golden["generated_text"] + "\n"


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "--model", "/nonexistent/model", "--prompt", "x"],
        ["generate", "--prompt", "x", "--max-tokens", "zero"],
        ["generate", "--prompt", "x", "--max-tokens", "0"],  # printed an empty line, exit 0
        ["generate", "--prompt", "x", "--temperature", "-1"],
        ["generate"],
    ],
)
def test_generate_cli_bad_input_is_one_line(args: list[str]) -> None:
    proc = _surge(*args)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2  # argparse may print a usage line first
    assert "error" in proc.stderr


def test_chat_returns_one_output_per_conversation(llm: LLM) -> None:
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    one = llm.chat([{"role": "user", "content": "Tell me a story"}], params)
    assert len(one) == 1 and len(one[0].outputs[0].token_ids) == 4
    two = llm.chat([[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Bye"}]], params)
    assert len(two) == 2 and two[0].prompt_token_ids != two[1].prompt_token_ids
