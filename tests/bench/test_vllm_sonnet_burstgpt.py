"""vLLM's ``sonnet`` and ``burstgpt`` datasets in ``bench serve``.

Prompt construction with a real tokenizer (Qwen3's, the server's own template code for chat
prompts) against vLLM 0.26's rules restated here, the one-line refusals, and runs against the fake
server that record the dataset. The files are the tests' own (generated lines, a small CSV with
BurstGPT's header).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import QWEN3_8B, bench_main
from fake_server import CHAT_OVERHEAD, Behaviour, FakeServer, encode

from surge.bench.compare import compare_points, load_points
from surge.bench.datasets import (
    SONNET_INSTRUCTION,
    burstgpt_requests,
    load_burstgpt,
    sonnet_requests,
)
from surge.bench.tokens import HFTokenCounter

BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


@pytest.fixture(scope="module")
def qwen() -> HFTokenCounter:
    return HFTokenCounter(str(QWEN3_8B))


def _poem(path: Path, n: int = 60, seed: int = 1) -> list[str]:
    """``n`` lines of 4 to 10 words (each with its newline), written to ``path``."""
    words = [
        "love",
        "time",
        "beauty",
        "rose",
        "summer",
        "heart",
        "eyes",
        "night",
        "day",
        "truth",
        "youth",
        "death",
        "fair",
        "thee",
    ]
    rng = random.Random(seed)
    lines = [
        " ".join(rng.choice(words) for _ in range(rng.randint(4, 10))).capitalize() + ",\n" for _ in range(n)
    ]
    path.write_text("".join(lines))
    return lines


def _vllm_sonnet(
    counter: HFTokenCounter, lines: list[str], n: int, input_len: int, prefix_len: int, seed: int
) -> tuple[list[str], list[str]]:
    """vLLM 0.26's ``SonnetDataset.sample`` restated (global ``random`` seeded with ``--seed``, HF's
    chat template): the prompts it sends on the chat endpoint and, chat-templated, on /v1/completions."""
    tok = counter.tok
    rnd = random.Random(seed)

    def fmt(text: str) -> str:
        return str(
            tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
        )

    mean = sum(len(tok(line).input_ids) for line in lines) / len(lines)
    base = len(tok(fmt(SONNET_INSTRUCTION)).input_ids)
    n_lines = max(round((input_len - base) / mean), 1)
    n_prefix = max(round((prefix_len - base) / mean), 0)
    raw: list[str] = []
    while len(raw) < n:
        prompt = SONNET_INSTRUCTION + "".join(lines[:n_prefix] + rnd.choices(lines, k=n_lines - n_prefix))
        if len(tok(fmt(prompt)).input_ids) <= input_len:
            raw.append(prompt)
    return raw, [fmt(p) for p in raw]


def test_sonnet_prompts_are_vllms(qwen: HFTokenCounter, tmp_path: Path) -> None:
    """The same prompts as vLLM's sonnet dataset for a seed: the instruction, the file's first lines
    (about --sonnet-prefix-len tokens with it), then lines drawn with replacement, redrawn while over
    --sonnet-input-len; chat-templated on /v1/completions, the user message on the chat endpoint.
    Lengths as the server counts them, at most the input length; each asks the output length."""
    path = tmp_path / "sonnet.txt"
    lines = _poem(path)
    raw, formatted = _vllm_sonnet(qwen, lines, 12, 160, 60, seed=3)
    completions = sonnet_requests(qwen, str(path), 12, 160, 60, 9, seed=3)
    chat = sonnet_requests(qwen, str(path), 12, 160, 60, 9, seed=3, chat=True)
    assert [r.prompt for r in completions] == formatted and [r.prompt for r in chat] == raw
    for c, h in zip(completions, chat, strict=True):
        assert c.prompt_len == len(qwen.encode(c.prompt)) == len(qwen.encode_chat(h.prompt)) == h.prompt_len
        assert c.prompt_len <= 160 and c.expected_output_len == h.expected_output_len == 9
    mean = sum(len(qwen.encode(line)) for line in lines) / len(lines)
    base = len(qwen.encode_chat(SONNET_INSTRUCTION))
    prefix = SONNET_INSTRUCTION + "".join(lines[: round((60 - base) / mean)])
    assert all(r.prompt.startswith(prefix) for r in chat) and len({r.prompt for r in chat}) == 12
    assert len({r.prompt_len for r in chat}) > 1  # lines of many lengths: prompts up to the input length
    assert [r.prompt for r in sonnet_requests(qwen, str(path), 12, 160, 60, 9, seed=4, chat=True)] != raw
    no_prefix = sonnet_requests(qwen, str(path), 4, 160, 0, 9, seed=3, chat=True)
    assert len({r.prompt.split("\n")[1] for r in no_prefix}) > 1  # no shared first line


@pytest.mark.parametrize(
    ("text", "input_len", "prefix_len", "words"),
    [
        ("", 160, 60, "no lines (the sonnet dataset draws a text file's lines)"),
        (None, 18, 0, "--sonnet-input-len 18 must be above the"),
        (None, 100, 400, "--sonnet-prefix-len 400: the instruction and the file's first"),
        (
            "word " * 80 + "\n",
            40,
            0,
            "no draw of 1 lines (after 0 prefix lines) fit --sonnet-input-len 40 in 1000",
        ),
        (None, 160, -1, "--sonnet-prefix-len must be >= 0"),
    ],
)
def test_sonnet_refusals(
    qwen: HFTokenCounter, tmp_path: Path, text: str | None, input_len: int, prefix_len: int, words: str
) -> None:
    """vLLM would divide by zero on an empty file, and loop forever on lengths no draw can meet."""
    path = tmp_path / "sonnet.txt"
    if text is None:
        _poem(path)
    else:
        path.write_text(text)
    with pytest.raises(ValueError) as e:
        sonnet_requests(qwen, str(path), 3, input_len, prefix_len, 9, seed=0, chat=True)
    assert words in str(e.value) and "\n" not in str(e.value)


def _burst_csv(path: Path, rows: list[tuple[str, int | str, int | str]]) -> str:
    body = "".join(f"{i * 1.5},{m},{q},{a},0,Conversation log\n" for i, (m, q, a) in enumerate(rows))
    path.write_text(BURSTGPT_HEADER + "\n" + body)
    return str(path)


def test_burstgpt_rows_and_lengths_are_vllms(
    qwen: HFTokenCounter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's burstgpt: only GPT-4 rows with Response tokens > 0; the rows picked as pandas'
    ``sample(n, random_state=seed)`` (without replacement, with it past the rows); each prompt has
    exactly its row's Request tokens as the server counts it and asks its Response tokens."""
    rows: list[tuple[str, int | str, int | str]] = []
    for i in range(12):
        rows.append(("GPT-4", 20 + 3 * i, 5 + i))
        rows.append(("ChatGPT", 900, 7))  # another model: left out
    rows.append(("GPT-4", 50, 0))  # a failed request: left out
    path = _burst_csv(tmp_path / "b.csv", rows)
    kept = load_burstgpt(path)
    assert [(r.request_tokens, r.response_tokens) for r in kept] == [(20 + 3 * i, 5 + i) for i in range(12)]
    assert kept[1].line == 4  # the header is line 1
    for chat in (False, True):
        reqs = burstgpt_requests(qwen, path, 8, seed=5, chat=chat)
        picked = np.random.RandomState(5).choice(12, size=8, replace=False)
        assert [(r.prompt_len, r.expected_output_len) for r in reqs] == [(20 + 3 * i, 5 + i) for i in picked]
        encode = qwen.encode_chat if chat else qwen.encode
        assert all(len(encode(r.prompt)) == r.prompt_len for r in reqs)
        assert [r.prompt for r in burstgpt_requests(qwen, path, 8, seed=5, chat=chat)] == [
            r.prompt for r in reqs
        ]
    many = burstgpt_requests(qwen, path, 30, seed=0)
    assert len(many) == 30 and len({r.prompt for r in many}) == 30  # rows again, prompts fresh
    assert [r.prompt_len - 20 for r in many] == [3 * i for i in np.random.RandomState(0).choice(12, 30)]
    assert capsys.readouterr().err == ""
    fits = burstgpt_requests(qwen, path, 5, seed=0, max_model_len=60, chat=True)
    assert all(r.prompt_len + r.expected_output_len <= 60 for r in fits)
    assert "3 GPT-4 rows left out (3 over the server's max_model_len 60" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "its header has no 'Model', 'Request tokens', 'Response tokens' column (found 'nothing')"),
        ("Timestamp,Model,Request tokens\n1,GPT-4,5\n", "its header has no 'Response tokens' column"),
        (
            BURSTGPT_HEADER + "\n1,ChatGPT,5,5,10,x\n2,GPT-4,5,0,5,x\n",
            "no row of Model GPT-4 with Response tokens > 0",
        ),
        (
            BURSTGPT_HEADER + "\n1,GPT-4,5,5,10,x\n2,GPT-4,five,5,10,x\n",
            "line 3: 'Request tokens' must be an integer, got 'five'",
        ),
        (BURSTGPT_HEADER + "\n1,GPT-4,5\n", "line 2: 3 fields, the header has 6"),
        (
            BURSTGPT_HEADER + "\n1,GPT-4,0,5,5,x\n",
            "no usable row (1 with Request tokens below the least prompt of",
        ),
    ],
)
def test_burstgpt_refusals(qwen: HFTokenCounter, tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "b.csv"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        burstgpt_requests(qwen, str(path), 2, seed=0, chat=True)
    assert words in str(e.value) and "\n" not in str(e.value)


def _serve(url: str, *extra: str) -> list[str]:
    return ["bench", "serve", "--base-url", url, "--disable-tqdm", *extra]


def _word_poem(path: Path) -> str:
    """Lines of 3 to 6 fake-server words (``w<id>``: one token each)."""
    path.write_text("".join(" ".join(f"w{20 + i + k}" for k in range(3 + i % 4)) + "\n" for i in range(40)))
    return str(path)


def test_cli_refusals_are_one_line_before_any_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    poem = _word_poem(tmp_path / "poem.txt")
    csv_path = _burst_csv(tmp_path / "b.csv", [("GPT-4", 12, 4), ("GPT-4", 20, 3)])
    sonnet = ("--dataset", "sonnet", "--dataset-path", poem)
    burst = ("--dataset", "burstgpt", "--dataset-path", csv_path)
    with FakeServer(Behaviour()) as s:
        for extra, words in (
            (("--dataset", "sonnet"), "--dataset sonnet needs --dataset-path FILE (a text file"),
            (("--dataset", "burstgpt"), "--dataset burstgpt needs --dataset-path FILE (a BurstGPT CSV file)"),
            (("--dataset", "sonnet", "--dataset-path", str(tmp_path / "no.txt")), "no such file"),
            (("--dataset", "burstgpt", "--dataset-path", poem), "not a BurstGPT CSV file"),
            (("--sonnet-input-len", "100"), "--sonnet-input-len applies to --dataset sonnet"),
            (
                (*burst, "--sonnet-output-len", "5"),
                "--sonnet-output-len applies to --dataset sonnet (use --output-len)",
            ),
            (
                (*sonnet, "--input-len", "100", "--sonnet-input-len", "90"),
                "--input-len 100 and --sonnet-input-len 90",
            ),
            (
                (*sonnet, "--output-len", "10", "--sonnet-output-len", "9"),
                "--output-len 10 and --sonnet-output-len 9",
            ),
            ((*sonnet, "--sonnet-output-len", "0"), "--sonnet-output-len must be >= 1"),
            ((*sonnet, "--sonnet-input-len", "0"), "--sonnet-input-len must be >= 1"),
            ((*sonnet, "--sonnet-prefix-len", "-1"), "--sonnet-prefix-len must be >= 0"),
            (
                (*sonnet, "--sonnet-input-len", "4000"),
                "--sonnet-input-len 4000 + --sonnet-output-len 150 exceeds",
            ),
            ((*sonnet, "--sonnet-input-len", "6"), "--sonnet-input-len 6 must be above the"),
            ((*burst, "--input-len", "8"), "--input-len applies to --dataset random or sonnet (each row's"),
            ((*burst, "--output-len", "8"), "each row's Response tokens is its request's output length"),
            ((*burst, "--seed", str(2**32)), "--seed must be below 2**32 with --dataset burstgpt"),
        ):
            rc = bench_main(_serve(s.url, *extra))
            err = capsys.readouterr().err
            assert rc == 2 and err.startswith("surge: error:") and words in err and err.count("\n") == 1, (
                extra,
                err,
            )
        assert s.behaviour.seen == 0


def test_runs_record_the_dataset(tmp_path: Path) -> None:
    """Against the fake server (word tokens, a BOS, a chat template of CHAT_OVERHEAD tokens): a
    sonnet run on /v1/completions sends the templated prompts, a sonnet run on the chat endpoint the
    user messages, a burstgpt run its rows' lengths; every request is held to its length with
    --ignore-eos (off by default, as vLLM), and the results record the dataset's settings."""
    poem = _word_poem(tmp_path / "poem.txt")
    csv_path = _burst_csv(tmp_path / "b.csv", [("GPT-4", 12 + i, 2 + i % 3) for i in range(6)])
    files = {k: tmp_path / f"{k}.json" for k in ("comp", "chat", "chat2", "burst")}
    common = ("--num-prompts", "4", "--warmup", "0")
    sonnet = ("--dataset", "sonnet", "--dataset-path", poem, "--sonnet-input-len", "40")
    sonnet += ("--sonnet-prefix-len", "20", "--output-len", "3")
    with FakeServer(Behaviour()) as s:
        comp = (*sonnet, "--endpoint", "/v1/completions", "--ignore-eos", "--result-file", str(files["comp"]))
        assert bench_main(_serve(s.url, *common, *comp)) == 0
        sent_comp = [e["body"]["prompt"] for e in s.behaviour.log]
        assert bench_main(_serve(s.url, *common, *sonnet, "--result-file", str(files["chat"]))) == 0
        sent_chat = [e["body"]["messages"][0]["content"] for e in s.behaviour.log[4:]]
        for e in s.behaviour.log[4:]:
            assert e["body"]["max_completion_tokens"] == 3 and "ignore_eos" not in e["body"]
        more = ("--sonnet-prefix-len", "30", "--result-file", str(files["chat2"]))
        assert bench_main(_serve(s.url, *common, *sonnet, *more)) == 0
        burst = ("--dataset", "burstgpt", "--dataset-path", csv_path, "--ignore-eos")
        assert bench_main(_serve(s.url, *common, *burst, "--result-file", str(files["burst"]))) == 0
    # the fake server's /detokenize writes words as ids: compare the tokens
    assert sorted(encode(p) for p in sent_comp) == sorted(encode(p) + [2] * CHAT_OVERHEAD for p in sent_chat)
    assert all(p.startswith(SONNET_INSTRUCTION) for p in sent_chat)
    comp_r, chat_r, burst_r = (json.loads(files[k].read_text()) for k in ("comp", "chat", "burst"))
    for r in (comp_r, chat_r):
        assert (r["dataset"], r["dataset_path"], r["input_len"], r["output_len"]) == ("sonnet", poem, None, 3)
        assert (r["sonnet_input_len"], r["sonnet_prefix_len"], r["sonnet_output_len"]) == (40, 20, 3)
        assert r["failed"] == 0 and all(n <= 40 for n in r["input_lens"]) and r["custom_output_len"] is None
    assert comp_r["ignore_eos"] and comp_r["exact_length"] and not chat_r["ignore_eos"]
    assert sorted(comp_r["input_lens"]) == sorted(chat_r["input_lens"])
    assert burst_r["dataset"] == "burstgpt" and burst_r["failed"] == 0 and burst_r["sonnet_input_len"] is None
    pairs = sorted(zip(burst_r["input_lens"], burst_r["output_lens"], strict=True))
    picked = np.random.RandomState(0).choice(6, size=4, replace=False)
    assert pairs == sorted((12 + int(i), 2 + int(i) % 3) for i in picked)
    cmp = compare_points(load_points(files["chat"]), load_points(files["chat2"]))
    assert [(name, b, n) for _, name, b, n in cmp.mismatches] == [("sonnet_prefix_len", 20, 30)]
