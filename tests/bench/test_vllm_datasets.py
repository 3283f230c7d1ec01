"""vLLM's ``custom`` and ``prefix_repetition`` datasets and ``--random-prefix-len`` in ``bench serve``.

Prompt construction with real tokenizers (the server's own template code for chat prompts), the
one-line refusals of bad combinations, the result's record of the dataset, and one run of each
against ``surge serve`` of the bundled model.
"""

from __future__ import annotations

import json
import random
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import BUNDLED_MODEL, QWEN3_8B, REPO, SHAREGPT, bench_main, serve_argv
from fake_server import CHAT_OVERHEAD, NO_THINK_OVERHEAD, Behaviour, FakeServer, free_port

from surge.bench.compare import compare_points, load_points
from surge.bench.datasets import (
    custom_requests,
    load_custom,
    prefix_repetition_requests,
    random_requests,
    shared_prefix,
    sharegpt_requests,
)
from surge.bench.tokens import HFTokenCounter


@pytest.fixture(scope="module")
def stories() -> HFTokenCounter:
    return HFTokenCounter(str(BUNDLED_MODEL))


@pytest.fixture(scope="module")
def qwen() -> HFTokenCounter:
    return HFTokenCounter(str(QWEN3_8B))


def _server_ids(counter: HFTokenCounter, prompt: str, chat: bool) -> list[int]:
    """The prompt's tokens as the server counts them (chat: Surge's template code)."""
    return counter.encode_chat(prompt) if chat else counter.encode(prompt)


def _common_len(a: list[int], b: list[int]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("name", ["stories", "qwen"])
def test_random_prefix_is_shared_and_the_total_is_exact(
    name: str, chat: bool, request: pytest.FixtureRequest
) -> None:
    """``--random-prefix-len 24 --input-len 40``: every prompt has exactly 24 + 40 tokens as the
    server counts it (template included on the chat endpoint), the prefix's 24 token ids sit at
    the same place in every prompt (after the BOS or the template's header), and the prompts
    differ after it."""
    counter: HFTokenCounter = request.getfixturevalue(name)
    reqs = random_requests(counter, 6, 40, 5, seed=3, chat=chat, prefix_len=24)
    prefix = shared_prefix(counter, np.random.default_rng([3, 2]), 24, chat)
    assert len(prefix.ids) == 24 and counter.encode(prefix.text, add_special_tokens=False) == list(prefix.ids)
    ids = [_server_ids(counter, r.prompt, chat) for r in reqs]
    for r, toks in zip(reqs, ids, strict=True):
        assert len(toks) == r.prompt_len == 64 and r.expected_output_len == 5
        assert tuple(toks[prefix.offset : prefix.offset + 24]) == prefix.ids
        assert r.prompt.startswith(prefix.text)
    shared = prefix.offset + 24
    assert all(_common_len(ids[0], t) >= shared for t in ids[1:]) and len({tuple(t) for t in ids}) == 6
    again = random_requests(counter, 6, 40, 5, seed=3, chat=chat, prefix_len=24)
    assert [r.prompt for r in again] == [r.prompt for r in reqs]


def test_random_prefix_zero_keeps_the_prompts_and_ranges_add_the_prefix(stories: HFTokenCounter) -> None:
    plain = [r.prompt for r in random_requests(stories, 3, 40, 5, seed=7)]
    assert [r.prompt for r in random_requests(stories, 3, 40, 5, seed=7, prefix_len=0)] == plain
    reqs = random_requests(stories, 20, 40, 10, seed=1, range_ratio=0.5, prefix_len=16)
    assert all(16 + 20 <= r.prompt_len <= 16 + 60 for r in reqs) and len({r.prompt_len for r in reqs}) > 3
    assert all(len(stories.encode(r.prompt)) == r.prompt_len for r in reqs)
    with pytest.raises(
        ValueError, match="--input-len 2 is below the minimum of 3 with --random-prefix-len 16"
    ):
        random_requests(stories, 2, 2, 5, seed=0, prefix_len=16)
    with pytest.raises(ValueError, match="--random-prefix-len must be >= 0"):
        random_requests(stories, 2, 20, 5, seed=0, prefix_len=-1)


@pytest.mark.parametrize("chat", [False, True])
def test_prefix_repetition_groups_share_their_prefix(qwen: HFTokenCounter, chat: bool) -> None:
    """16 prompts over 3 prefixes: 6, 5 and 5 prompts (vLLM would send 15), each exactly 30 + 40
    tokens as the server counts it; the prompts of a prefix share its tokens, the prefixes differ,
    and the order is shuffled (seeded)."""
    reqs = prefix_repetition_requests(qwen, 16, 30, 40, 3, 7, seed=0, chat=chat)
    assert len(reqs) == 16 and {r.expected_output_len for r in reqs} == {7}
    ids = [_server_ids(qwen, r.prompt, chat) for r in reqs]
    assert {len(t) for t in ids} == {70} and {r.prompt_len for r in reqs} == {70}
    rng = np.random.default_rng([0, 2])  # the prefixes' stream, drawn one after another
    prefixes = [shared_prefix(qwen, rng, 30, chat) for _ in range(3)]
    sizes = sorted(sum(1 for r in reqs if r.prompt.startswith(p.text)) for p in prefixes)
    assert sizes == [5, 5, 6]
    for p in prefixes:
        members = [t for r, t in zip(reqs, ids, strict=True) if r.prompt.startswith(p.text)]
        assert all(tuple(t[p.offset : p.offset + 30]) == p.ids for t in members)
        assert len({tuple(t) for t in members}) == len(members)  # the suffixes differ
    assert len({p.ids for p in prefixes}) == 3
    first_group = [i for i, r in enumerate(reqs) if r.prompt.startswith(prefixes[0].text)]
    assert first_group != list(range(6))  # shuffled, not grouped
    again = prefix_repetition_requests(qwen, 16, 30, 40, 3, 7, seed=0, chat=chat)
    assert [r.prompt for r in again] == [r.prompt for r in reqs]


def test_prefix_repetition_refusals(stories: HFTokenCounter) -> None:
    with pytest.raises(ValueError, match="--num-prompts 2 is below --prefix-repetition-num-prefixes 3"):
        prefix_repetition_requests(stories, 2, 8, 8, 3, 4, seed=0)
    with pytest.raises(ValueError, match="--prefix-repetition-suffix-len 1 is below the minimum of 3"):
        prefix_repetition_requests(stories, 3, 8, 1, 3, 4, seed=0)
    with pytest.raises(ValueError, match="--prefix-repetition-prefix-len must be >= 1"):
        prefix_repetition_requests(stories, 3, 0, 8, 3, 4, seed=0)


def _jsonl(path: Path, rows: list[object]) -> str:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_custom_prompts_templated_as_vllm(qwen: HFTokenCounter, tmp_path: Path) -> None:
    """vLLM's custom dataset: one ``{"prompt"}`` per line, shuffled with the seed. On
    /v1/completions the prompt is rendered with the chat template unless --skip-chat-template; on
    the chat endpoint it is the user message (the server templates it). Lengths as the server
    counts them; --custom-output-len -1 takes each line's ``output_tokens``."""
    rows = [
        {"prompt": f"What is the capital of country number {i}?", "output_tokens": 10 + i} for i in range(6)
    ]
    path = _jsonl(tmp_path / "p.jsonl", [*rows[:3], "", *rows[3:]])  # a blank line is skipped
    items = load_custom(path)
    assert [i.prompt for i in items] == [r["prompt"] for r in rows] and items[3].line == 5
    templated = custom_requests(qwen, path, 4, 32, seed=0)
    raw = custom_requests(qwen, path, 4, 32, seed=0, skip_chat_template=True)
    chat = custom_requests(qwen, path, 4, 32, seed=0, chat=True)
    assert [r.prompt for r in raw] == [r.prompt for r in chat]
    assert len({r.prompt for r in raw}) == 4 and [r.prompt for r in raw] != [r["prompt"] for r in rows[:4]]
    for t, r, c in zip(templated, raw, chat, strict=True):
        assert t.prompt.startswith("<|im_start|>user\n" + r.prompt + "<|im_end|>\n<|im_start|>assistant\n")
        assert t.prompt_len == len(qwen.encode(t.prompt)) == len(qwen.encode_chat(r.prompt)) == c.prompt_len
        assert r.prompt_len == len(qwen.encode(r.prompt)) < t.prompt_len
        assert t.expected_output_len == r.expected_output_len == c.expected_output_len == 32
    per_line = custom_requests(qwen, path, 6, None, seed=0, skip_chat_template=True)
    assert sorted(r.expected_output_len for r in per_line) == list(range(10, 16))
    by_prompt = {r["prompt"]: r["output_tokens"] for r in rows}
    assert all(by_prompt[r.prompt] == r.expected_output_len for r in per_line)


def _vllm_shuffled(rows: list[dict], seed: int) -> list[dict]:
    """vLLM 0.26's order of a custom or ShareGPT dataset's rows (``CustomDataset.load_data`` and
    ``ShareGPTDataset.load_data``, restated): Python's global ``random`` seeded, then shuffled."""
    rows = list(rows)
    random.seed(seed)
    random.shuffle(rows)
    return rows


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_custom_and_sharegpt_orders_are_vllms(stories: HFTokenCounter, tmp_path: Path, seed: int) -> None:
    """The same --seed picks the same prompts in the same order as vLLM's custom and sharegpt
    datasets: vLLM shuffles the rows with Python's ``random``, ShareGPT's after dropping the
    conversations of fewer than two turns (which changes every later position)."""
    rows = [{"prompt": f"tell me a short story about the number {i} and a cat"} for i in range(12)]
    path = _jsonl(tmp_path / "p.jsonl", rows)
    got = custom_requests(stories, path, 8, 16, seed=seed, skip_chat_template=True)
    assert [r.prompt for r in got] == [r["prompt"] for r in _vllm_shuffled(rows, seed)[:8]]

    def turn(who: str, text: str) -> dict:
        return {"from": who, "value": text}

    data = [
        {
            "id": str(i),
            "conversations": [turn("human", f"tell me a short story about the number {i} and a dog")]
            + ([turn("gpt", f"once upon a time the number {i} met a dog in the park")] if i % 3 else []),
        }
        for i in range(15)
    ]
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(json.dumps(data))
    kept = [d for d in data if len(d["conversations"]) >= 2]  # vLLM's filter, before its shuffle
    want = [d["conversations"][0]["value"] for d in _vllm_shuffled(kept, seed)[:6]]
    got = sharegpt_requests(stories, str(sharegpt), 6, 64, seed=seed)
    assert [r.prompt for r in got] == want


def test_custom_chat_template_kwargs_as_vllm(qwen: HFTokenCounter, tmp_path: Path) -> None:
    """vLLM's --chat-template-kwargs: a custom prompt for /v1/completions is rendered with these
    template variables (Qwen3's enable_thinking false: the empty think block), counted as the
    server counts the text; variables the template may not take are one line naming the flag."""
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": f"Tell me about topic {i}."} for i in range(3)])
    plain = custom_requests(qwen, path, 3, 16, seed=1)
    off = custom_requests(qwen, path, 3, 16, seed=1, chat_template_kwargs={"enable_thinking": False})
    raw = custom_requests(qwen, path, 3, 16, seed=1, skip_chat_template=True)
    for p, o, r in zip(plain, off, raw, strict=True):
        assert o.prompt == p.prompt + "<think>\n\n</think>\n\n" and "<think>" not in p.prompt
        assert o.prompt_len == len(qwen.encode(o.prompt)) > p.prompt_len
        kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
        assert o.prompt_len == len(qwen.encode_chat(r.prompt, kwargs))
    with pytest.raises(ValueError) as e:
        custom_requests(qwen, path, 3, 16, seed=1, chat_template_kwargs={"messages": []})
    assert str(e.value).startswith("--chat-template-kwargs: chat_template_kwargs must not set messages")


@pytest.mark.parametrize(
    ("rows", "num", "out", "words"),
    [
        ([{"prompt": "a b c"}, {"text": "x"}], 1, 8, 'line 2: no "prompt" (every line needs'),
        ([{"prompt": "a b c"}, {"prompt": ""}], 1, 8, 'line 2: "prompt" ""'),
        (['[{"prompt": "a"}]'], 1, 8, 'line 1: expected a JSON object with a "prompt" (a custom dataset'),
        (["[", '{"prompt": "a"}', "]"], 1, 8, "line 1: not JSON"),
        (["{bad"], 1, 8, "line 1: not JSON"),
        ([{"prompt": "a"}, {"prompt": "b"}], 3, 8, "has 2 prompts, --num-prompts 3 asked"),
        ([{"prompt": "a", "output_tokens": 4}, {"prompt": "b"}], 1, None, 'line 2 has no "output_tokens"'),
        (
            [{"prompt": "a", "output_tokens": "4"}],
            1,
            None,
            '"output_tokens" must be an integer >= 1, got "4"',
        ),
        ([{"prompt": "a", "output_tokens": 0}], 1, None, '"output_tokens" must be an integer >= 1, got 0'),
        ([{"prompt": "a " * 100}], 1, 8, "exceed the server's max_model_len 50"),
    ],
)
def test_custom_refusals(
    stories: HFTokenCounter, tmp_path: Path, rows: list[object], num: int, out: int | None, words: str
) -> None:
    path = _jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(ValueError) as e:
        custom_requests(stories, path, num, out, seed=0, max_model_len=50)
    assert words in str(e.value) and "\n" not in str(e.value)
    if rows[0] in ("[", '[{"prompt": "a"}]'):
        assert "is JSON Lines: one object a line" in str(e.value)


def _serve(url: str, *extra: str) -> list[str]:
    return ["bench", "serve", "--base-url", url, "--disable-tqdm", *extra]


def test_bad_combinations_are_one_line_before_any_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _jsonl(tmp_path / "good.jsonl", [{"prompt": "w1 w2 w3"}, {"prompt": "w4 w5"}])
    noprompt = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "w1"}, {"question": "w2"}])
    custom = ("--dataset", "custom", "--dataset-path", good)
    prefix = ("--dataset", "prefix_repetition")
    completions = ("--endpoint", "/v1/completions")
    with FakeServer(Behaviour()) as s:
        for extra, words in (
            (("--dataset", "custom"), "--dataset custom needs --dataset-path FILE"),
            (("--dataset", "custom", "--dataset-path", str(tmp_path / "no.jsonl")), "no such file"),
            (("--dataset", "custom", "--dataset-path", noprompt), 'line 2: no "prompt"'),
            (
                ("--dataset-path", good),
                "--dataset-path applies to --dataset sharegpt, custom, sonnet, burstgpt, spec_bench, hf or timed_trace",
            ),
            (
                (*prefix, "--dataset-path", good),
                "--dataset-path applies to --dataset sharegpt, custom, sonnet, burstgpt, spec_bench, hf or timed_trace",
            ),
            ((*custom, "--input-len", "8"), "--input-len applies to --dataset random"),
            (
                (*prefix, "--input-len", "8"),
                "--input-len applies to --dataset random or sonnet (use --prefix-repetition",
            ),
            ((*custom, "--random-prefix-len", "4"), "--random-prefix-len applies to --dataset random"),
            (("--random-prefix-len", "-1"), "--random-prefix-len must be >= 0"),
            (("--skip-chat-template",), "--skip-chat-template applies to --dataset custom"),
            (("--chat-template-kwargs", "{}"), "--chat-template-kwargs applies to --dataset custom"),
            ((*custom, "--chat-template-kwargs", "[1]"), "--chat-template-kwargs must be a JSON object"),
            (
                (*custom, "--chat-template-kwargs", "{}"),
                """the server applies the template: use --extra-body '{"chat_template_kwargs": ...}'""",
            ),
            (
                (*custom, *completions, "--skip-chat-template", "--chat-template-kwargs", "{}"),
                "--chat-template-kwargs and --skip-chat-template",
            ),
            (("--custom-output-len", "5"), "--custom-output-len applies to --dataset custom"),
            (("--custom-output-len", "0"), "--custom-output-len applies to --dataset custom"),
            ((*prefix, "--sharegpt-output-len", "5"), "--sharegpt-output-len applies to --dataset sharegpt"),
            (("--prefix-repetition-prefix-len", "8"), "--prefix-repetition-prefix-len applies to --dataset"),
            (
                (
                    "--dataset",
                    "sharegpt",
                    "--dataset-path",
                    str(SHAREGPT),
                    "--prefix-repetition-output-len",
                    "4",
                ),
                "--prefix-repetition-output-len applies to --dataset prefix_repetition",
            ),
            ((*custom, "--custom-output-len", "0"), "--custom-output-len must be >= 1, or -1"),
            (
                (*custom, "--custom-output-len", "5", "--output-len", "6"),
                "--output-len 6 and --custom-output-len 5",
            ),
            ((*custom, "--custom-output-len", "-1"), 'has no "output_tokens"'),
            ((*custom, "--num-prompts", "3"), "has 2 prompts, --num-prompts 3 asked"),
            ((*prefix, "--num-prompts", "4"), "--num-prompts 4 is below --prefix-repetition-num-prefixes 10"),
            (
                (*prefix, "--prefix-repetition-num-prefixes", "0"),
                "--prefix-repetition-num-prefixes must be >= 1",
            ),
            ((*prefix, "--prefix-repetition-output-len", "0"), "--prefix-repetition-output-len must be >= 1"),
            ((*prefix, "--prefix-repetition-suffix-len", "3"), "--prefix-repetition-suffix-len 3 is below"),
            (
                (*prefix, "--prefix-repetition-prefix-len", "4000", "--num-prompts", "10"),
                "exceeds the server's max_model_len 4096",
            ),
            (("--random-prefix-len", "4000"), "--random-prefix-len 4000 + --input-len 256"),
        ):
            rc = bench_main(_serve(s.url, *extra))
            err = capsys.readouterr().err
            assert rc == 2 and err.startswith("surge: error:") and words in err and err.count("\n") == 1, (
                extra,
                err,
            )
        assert s.behaviour.seen == 0  # refused before the first request


def test_a_prompt_the_servers_tokenize_refuses_is_its_message_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dataset prompt holding a lone surrogate escape (valid JSON, not valid Unicode text) that the
    server's /tokenize refuses with a 400: the run stops before any timed request with one line
    quoting the prompt and the server's message (it said "lost the server ... HTTP Error 400: Bad
    Request", though the server was there)."""
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": "w1 \ud800 w2"}])
    b = Behaviour()
    with FakeServer(b) as s:
        for endpoint in ("/v1/chat/completions", "/v1/completions"):
            argv = _serve(s.url, "--dataset", "custom", "--dataset-path", path, "--num-prompts", "1")
            argv += ["--endpoint", endpoint, "--skip-chat-template", "--warmup", "0"]
            assert bench_main(argv) == 2
            err = capsys.readouterr().err
            assert err.startswith(
                'surge: error: the server\'s /tokenize refused the prompt "w1 \\ud800 w2"'
            ), err
            assert "HTTP 400: " in err and "lone UTF-16 surrogate" in err and err.count("\n") == 1, err
            assert "lost the server" not in err
    assert b.log == []


def test_results_record_the_dataset_and_compare_tells_them_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Against the fake server (word tokens, a chat template of CHAT_OVERHEAD tokens): a custom run
    with each line's output length, a prefix-repetition run and a random run with a prefix; each
    result records its dataset's settings, and comparing two of them warns."""
    rows = [{"prompt": f"w{10 + i} w{20 + i} w{30 + i}", "output_tokens": 3 + i} for i in range(4)]
    path = _jsonl(tmp_path / "p.jsonl", rows)
    files = {k: tmp_path / f"{k}.json" for k in ("custom", "rep", "rand", "rand0")}
    with FakeServer(Behaviour()) as s:
        common = ("--ignore-eos", "--num-prompts", "4", "--warmup", "0")
        argv = ("--dataset", "custom", "--dataset-path", path, "--custom-output-len", "-1")
        assert bench_main(_serve(s.url, *common, *argv, "--result-file", str(files["custom"]))) == 0
        sent = [e["body"]["messages"][0]["content"] for e in s.behaviour.log]
        assert sorted(sent) == sorted(r["prompt"] for r in rows)  # the user message, not templated again
        rep = ("--dataset", "prefix_repetition", "--prefix-repetition-prefix-len", "12")
        rep += ("--prefix-repetition-suffix-len", "20", "--prefix-repetition-num-prefixes", "2")
        assert bench_main(_serve(s.url, *common, *rep, "--result-file", str(files["rep"]))) == 0
        rand = ("--input-len", "32", "--output-len", "4", "--result-file")
        assert bench_main(_serve(s.url, *common, "--random-prefix-len", "12", *rand, str(files["rand"]))) == 0
        assert bench_main(_serve(s.url, *common, *rand, str(files["rand0"]))) == 0
    custom, rep_r, rand_r = (json.loads(files[k].read_text()) for k in ("custom", "rep", "rand"))
    assert custom["dataset"] == "custom" and custom["dataset_path"] == path
    assert (custom["custom_output_len"], custom["skip_chat_template"], custom["random_prefix_len"]) == (
        -1,
        False,
        None,
    )
    assert sorted(custom["output_lens"]) == [3, 4, 5, 6] and custom["output_len"] is None
    assert custom["input_lens"] == [1 + 3 + CHAT_OVERHEAD] * 4 and custom["failed"] == 0  # BOS, 3 words
    assert (rep_r["dataset"], rep_r["input_len"], rep_r["output_len"]) == ("prefix_repetition", 32, 128)
    assert (rep_r["prefix_repetition_prefix_len"], rep_r["prefix_repetition_num_prefixes"]) == (12, 2)
    assert rep_r["input_lens"] == [32] * 4 and rep_r["custom_output_len"] is None
    assert (rand_r["random_prefix_len"], rand_r["input_len"], rand_r["input_lens"]) == (12, 32, [44] * 4)
    assert rand_r["prefix_repetition_prefix_len"] is None and rand_r["dataset_path"] is None
    cmp = compare_points(load_points(files["rand0"]), load_points(files["rand"]))
    assert [(name, b, n) for _, name, b, n in cmp.mismatches] == [("random_prefix_len", 0, 12)]


def test_chat_template_kwargs_render_completions_prompts_and_are_recorded(tmp_path: Path) -> None:
    """A custom run on /v1/completions with --chat-template-kwargs sends the prompts rendered with
    them (the fake template's empty think block), counts them so, and records them; compare warns
    against a run without."""
    rows = [{"prompt": f"w{10 + i} w{20 + i} w{30 + i}"} for i in range(3)]
    path = _jsonl(tmp_path / "p.jsonl", rows)
    files = {k: tmp_path / f"{k}.json" for k in ("off", "plain")}
    common = ("--dataset", "custom", "--dataset-path", path, "--endpoint", "/v1/completions", "--ignore-eos")
    common += ("--num-prompts", "3", "--warmup", "0", "--output-len", "2")
    with FakeServer(Behaviour()) as s:
        off = ("--chat-template-kwargs", '{"enable_thinking": false}', "--result-file", str(files["off"]))
        assert bench_main(_serve(s.url, *common, *off)) == 0
        sent = [e["body"]["prompt"] for e in s.behaviour.log]
        assert bench_main(_serve(s.url, *common, "--result-file", str(files["plain"]))) == 0
    overhead = " w2" * (CHAT_OVERHEAD + NO_THINK_OVERHEAD)
    assert sorted(sent) == sorted(r["prompt"] + overhead for r in rows)
    off_r, plain_r = (json.loads(files[k].read_text()) for k in ("off", "plain"))
    assert (
        off_r["chat_template_kwargs"] == {"enable_thinking": False}
        and plain_r["chat_template_kwargs"] is None
    )
    assert off_r["input_lens"] == [1 + 3 + CHAT_OVERHEAD + NO_THINK_OVERHEAD] * 3
    assert plain_r["input_lens"] == [1 + 3 + CHAT_OVERHEAD] * 3
    cmp = compare_points(load_points(files["plain"]), load_points(files["off"]))
    assert [name for _, name, _, _ in cmp.mismatches] == ["chat_template_kwargs"]


def _metric(base: str, name: str) -> float:
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_end_to_end_against_the_bundled_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``surge serve`` of the bundled model: a custom run on /v1/completions (the prompts rendered
    with the model's chat template through the server's /tokenize and /detokenize), a
    prefix-repetition run on the chat endpoint, a sonnet run on /v1/completions and a burstgpt run
    on the chat endpoint; the server counts exactly the benchmark's prompt lengths, and the
    repeated prefixes hit its prefix cache."""
    from surge.bench.launcher import ServerLauncher

    monkeypatch.chdir(REPO)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    path = _jsonl(
        tmp_path / "p.jsonl", [{"prompt": f"Once upon a time there was a cat number {i}."} for i in range(5)]
    )
    launch = f"{sys.executable} -m surge.cli serve --port {port}"
    with ServerLauncher(launch, base, 240.0, tmp_path / "server.log") as server:
        server.start()
        custom = tmp_path / "custom.json"
        argv = [
            "--dataset",
            "custom",
            "--dataset-path",
            path,
            "--num-prompts",
            "4",
            "--custom-output-len",
            "6",
        ]
        argv += ["--endpoint", "/v1/completions", "--ignore-eos", "--result-file", str(custom)]
        assert bench_main(_serve(base, *argv)) == 0
        r = json.loads(custom.read_text())
        assert r["token_counter"].endswith("/tokenize") and r["failed"] == 0 and r["output_lens"] == [6] * 4
        # the server's usage.prompt_tokens: the templated prompt ("user: ...\nassistant:") with its BOS
        assert all(
            n > len(f"Once upon a time there was a cat number {i}.".split()) + 3
            for i, n in enumerate(r["input_lens"])
        )
        out = capsys.readouterr().out
        assert "warning" not in out  # the server counted the prompt tokens the benchmark built
        hits = _metric(base, "surge:prefix_cache_hits")
        rep = tmp_path / "rep.json"
        argv = [
            "--dataset",
            "prefix_repetition",
            "--prefix-repetition-prefix-len",
            "48",
            "--num-prompts",
            "4",
        ]
        argv += ["--prefix-repetition-suffix-len", "24", "--prefix-repetition-num-prefixes", "2"]
        argv += ["--prefix-repetition-output-len", "4", "--max-concurrency", "1", "--ignore-eos"]
        assert bench_main(_serve(base, *argv, "--result-file", str(rep))) == 0
        r = json.loads(rep.read_text())
        assert r["failed"] == 0 and r["input_lens"] == [72] * 4  # counted by the server, template included
        assert _metric(base, "surge:prefix_cache_hits") - hits >= 2 * 32  # two repeats, >= 2 blocks each
        assert "warning" not in capsys.readouterr().out
        # sonnet on /v1/completions (templated through the server) and burstgpt on the chat endpoint
        poem = tmp_path / "poem.txt"
        poem.write_text("".join(f"Once upon a time a cat number {i} sat on the mat.\n" for i in range(30)))
        argv = ["--dataset", "sonnet", "--dataset-path", str(poem), "--sonnet-input-len", "120"]
        argv += ["--sonnet-prefix-len", "50", "--output-len", "4", "--num-prompts", "3", "--ignore-eos"]
        son = tmp_path / "son.json"
        assert (
            bench_main(_serve(base, *argv, "--endpoint", "/v1/completions", "--result-file", str(son))) == 0
        )
        r = json.loads(son.read_text())
        assert r["failed"] == 0 and all(n <= 120 for n in r["input_lens"]) and r["output_lens"] == [4] * 3
        rows = "".join(f"{i},GPT-4,{30 + 7 * i},{3 + i},0,Conversation log\n" for i in range(5))
        (tmp_path / "b.csv").write_text(
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + rows
        )
        burst = tmp_path / "burst.json"
        argv = ["--dataset", "burstgpt", "--dataset-path", str(tmp_path / "b.csv"), "--num-prompts", "4"]
        assert bench_main(_serve(base, *argv, "--ignore-eos", "--result-file", str(burst))) == 0
        r = json.loads(burst.read_text())
        assert r["failed"] == 0 and sorted(zip(r["input_lens"], r["output_lens"], strict=True)) == sorted(
            (30 + 7 * int(i), 3 + int(i)) for i in np.random.RandomState(0).choice(5, size=4, replace=False)
        )  # the server counted each row's Request tokens, template included
        assert "warning" not in capsys.readouterr().out


def test_disable_shuffle_keeps_the_files_order_as_vllm(
    stories: HFTokenCounter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM 0.26's --disable-shuffle: custom, sharegpt, hf (MT-Bench), spec_bench and
    prefix_repetition prompts in the file's order (prefix_repetition's prefix by prefix) instead of
    the seed's shuffle; through bench serve the timed requests go out in that order. The datasets
    whose order it does not change refuse it in one line (vLLM ignores it there)."""
    from surge.bench.hf_datasets import load_hf_rows, mt_bench_requests
    from surge.bench.question_datasets import spec_bench_requests

    rows = [{"prompt": f"tell me a short story about the number {i} and a cat"} for i in range(12)]
    path = _jsonl(tmp_path / "p.jsonl", rows)
    want = [r["prompt"] for r in rows[:8]]
    got = custom_requests(stories, path, 8, 16, seed=0, skip_chat_template=True, shuffle=False)
    assert [r.prompt for r in got] == want
    assert [r.prompt for r in custom_requests(stories, path, 8, 16, seed=0, skip_chat_template=True)] != want
    data: list[dict] = []
    for i in range(15):  # every third one has no reply: vLLM leaves it out before (not) shuffling
        turns = [{"from": "human", "value": f"a story about {i} dogs"}]
        if i % 3:
            turns.append({"from": "gpt", "value": f"once upon a time {i} dogs met in the park"})
        data.append({"id": str(i), "conversations": turns})
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(json.dumps(data))
    got = sharegpt_requests(stories, str(sharegpt), 5, 64, seed=0, shuffle=False)
    assert [r.prompt for r in got] == [f"a story about {i} dogs" for i in (1, 2, 4, 5, 7)]
    mt_bench = str(REPO.parent / "shared" / "assets" / "datasets" / "mt_bench" / "question.jsonl")
    first = [json.loads(line)["turns"][0] for line in Path(mt_bench).read_text().splitlines()[:3]]
    got = spec_bench_requests(stories, mt_bench, 3, 8, chat=True, shuffle=False)
    assert [r.prompt for r in got] == first
    hf_rows = load_hf_rows(mt_bench, "train")
    assert [
        r.prompt for r in mt_bench_requests(stories, hf_rows, mt_bench, 3, 8, 0, chat=True, shuffle=False)
    ] == first
    grouped = prefix_repetition_requests(stories, 6, 16, 16, 2, 4, seed=0, shuffle=False)
    prefixes = [r.prompt[:20] for r in grouped]
    assert prefixes[0] == prefixes[1] == prefixes[2] != prefixes[3] == prefixes[4] == prefixes[5]
    with FakeServer(Behaviour(ttft=0.001, itl=0.001)) as s:
        argv = serve_argv(s.url, "--num-prompts", "8")
        argv += ["--request-id-prefix", "r-", "--output-len", "2"]
        custom = [*argv, "--dataset", "custom", "--dataset-path", path, "--disable-shuffle"]
        assert bench_main(custom) == 0
        sent = sorted(s.behaviour.log, key=lambda e: int(e["request_id"][2:]))
        assert [e["body"]["messages"][0]["content"] for e in sent] == want
        out = tmp_path / "r.json"
        assert bench_main([*custom, "--result-file", str(out)]) == 0
        assert json.loads(out.read_text())["disable_shuffle"] is True
        capsys.readouterr()
        assert bench_main([*argv, "--disable-shuffle"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "surge: error: --disable-shuffle applies to --dataset sharegpt, custom, hf, spec_bench, "
        "prefix_repetition (--dataset random draws fresh random prompts; vLLM ignores the flag there)\n"
    ), err


def test_no_oversample_sends_the_prompts_a_file_has_as_vllm(
    stories: HFTokenCounter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM 0.26's --no-oversample: a custom, sharegpt, hf or spec_bench file with fewer usable
    prompts than --num-prompts sends those it has (vLLM would otherwise send some twice; Surge then
    refuses), with a note; a file with enough is unchanged; the datasets it does not change refuse
    it in one line."""
    from surge.bench.question_datasets import spec_bench_questions, spec_bench_requests

    rows = [{"prompt": f"tell me a short story about the number {i} and a cat"} for i in range(3)]
    path = _jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(ValueError, match="has 3 prompts, --num-prompts 5 asked"):
        custom_requests(stories, path, 5, 16, seed=0)
    assert len(custom_requests(stories, path, 5, 16, seed=0, fewer_ok=True)) == 3
    assert len(custom_requests(stories, path, 2, 16, seed=0, fewer_ok=True)) == 2
    mt_bench = str(REPO.parent / "shared" / "assets" / "datasets" / "mt_bench" / "question.jsonl")
    n = len(spec_bench_questions(mt_bench))
    assert len(spec_bench_requests(stories, mt_bench, n + 5, 8, chat=True, fewer_ok=True)) == n
    data = [{"id": "0", "conversations": [{"from": "human", "value": "a story about dogs and cats"}]}]
    data[0]["conversations"].append({"from": "gpt", "value": "once upon a time dogs met cats in the park"})
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(json.dumps(data))
    assert len(sharegpt_requests(stories, str(sharegpt), 4, 64, seed=0, fewer_ok=True)) == 1
    capsys.readouterr()
    with FakeServer(Behaviour(ttft=0.001, itl=0.001)) as s:
        argv = serve_argv(s.url, "--num-prompts", "5")
        argv += ["--output-len", "2", "--dataset", "custom", "--dataset-path", path]
        out = tmp_path / "r.json"
        assert bench_main([*argv, "--no-oversample", "--result-file", str(out)]) == 0
        assert len(s.behaviour.log) == 3
        result = json.loads(out.read_text())
        assert (result["completed"], result["failed"], result["no_oversample"]) == (3, 0, True)
        assert "sending those 3, not --num-prompts 5 (--no-oversample, as vLLM)" in capsys.readouterr().err
        assert bench_main(argv) == 2  # without it: refused, where vLLM sends some prompts twice
        assert bench_main(["bench", "serve", "--base-url", s.url, "--no-oversample"]) == 2
        assert len(s.behaviour.log) == 3
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"surge: error: {path} has 3 prompts, --num-prompts 5 asked"), err
    assert err[1] == (
        "surge: error: --no-oversample applies to --dataset sharegpt, custom, hf, spec_bench (--dataset random "
        "sends --num-prompts requests whatever it says, as vLLM's)"
    ), err
