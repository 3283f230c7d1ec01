"""vLLM's ``spec_bench`` dataset in ``bench serve``.

Prompt construction with a real tokenizer (Qwen3's) against vLLM 0.26's ``SpecBench`` restated here,
on the shared MT-Bench ``question.jsonl`` (80 questions of 8 categories), the one-line refusals, and a
run against the fake server that records the dataset.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import QWEN3_8B, SHARED, bench_main
from fake_server import CHAT_OVERHEAD, Behaviour, FakeServer, encode

from surge.bench.compare import compare_points, load_points
from surge.bench.question_datasets import load_questions, spec_bench_requests
from surge.bench.tokens import HFTokenCounter

MT_BENCH = SHARED / "datasets" / "mt_bench" / "question.jsonl"


@pytest.fixture(scope="module")
def qwen() -> HFTokenCounter:
    return HFTokenCounter(str(QWEN3_8B))


def _vllm_spec_bench(counter: HFTokenCounter, path: Path, n: int, category: str | None) -> list[str]:
    """vLLM 0.26's ``SpecBench`` restated: the JSONL rows' first turns (of ``category`` when given),
    ``random.seed(0); random.shuffle`` (its dispatch passes no --seed), the first ``n``, each rendered
    with the chat template (CustomDataset.sample, skip_chat_template False)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    data = [{"prompt": r["turns"][0]} for r in rows if (not category) or category == r["category"]]
    random.seed(0)
    random.shuffle(data)
    return [
        str(
            counter.tok.apply_chat_template(
                [{"role": "user", "content": d["prompt"]}], add_generation_prompt=True, tokenize=False
            )
        )
        for d in data[:n]
    ]


@pytest.mark.parametrize("category", [None, "writing", "math"])
def test_spec_bench_prompts_are_vllms(qwen: HFTokenCounter, category: str | None) -> None:
    """The same questions in the same order as vLLM's spec_bench; chat-templated on /v1/completions,
    the user message on the chat endpoint; lengths as the server counts them; the output length."""
    n = 10 if category else 40
    formatted = _vllm_spec_bench(qwen, MT_BENCH, n, category)
    completions = spec_bench_requests(qwen, str(MT_BENCH), n, 7, category)
    chat = spec_bench_requests(qwen, str(MT_BENCH), n, 7, category, chat=True)
    assert [r.prompt for r in completions] == formatted
    for c, h in zip(completions, chat, strict=True):
        assert c.prompt.startswith("<|im_start|>user\n" + h.prompt + "<|im_end|>\n")
        assert c.prompt_len == len(qwen.encode(c.prompt)) == len(qwen.encode_chat(h.prompt)) == h.prompt_len
        assert c.expected_output_len == h.expected_output_len == 7
    questions = {q.prompt: q for q in load_questions(str(MT_BENCH))}
    assert len(questions) == 80 and len({r.prompt for r in chat}) == n
    if category:
        assert {questions[r.prompt].category for r in chat} == {category}
    else:  # shuffled: not the file's first questions
        assert [questions[r.prompt].line for r in chat] != list(range(1, n + 1))


@pytest.mark.parametrize(
    ("lines", "n", "category", "words"),
    [
        ([], 1, None, "no questions (expected one"),
        (['{"turns": []}'], 1, None, 'line 1: "turns" [] (every line needs a list of turns'),
        (['{"question_id": 1}'], 1, None, 'line 1: no "turns"'),
        (["[1, 2]"], 1, None, 'line 1: expected a JSON object with "turns"'),
        (['{"turns": ["a"]}', "{oops"], 1, None, "line 2: not JSON"),
        (['{"turns": ["a"], "category": "x"}'], 1, "y", "--spec-bench-category y: no question of it in"),
        (['{"turns": ["a"]}'], 1, "y", 'no line has a "category"'),
        (['{"turns": ["a"], "category": "x"}'] * 2, 3, None, "has 2 questions, --num-prompts 3 asked"),
        (['{"turns": ["a"], "category": "x"}'] * 2, 3, "x", "has 2 questions of category x, --num-prompts 3"),
    ],
)
def test_spec_bench_refusals(
    qwen: HFTokenCounter, tmp_path: Path, lines: list[str], n: int, category: str | None, words: str
) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    with pytest.raises(ValueError) as e:
        spec_bench_requests(qwen, str(path), n, 8, category, chat=True)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_spec_bench_prompt_over_max_model_len_is_refused(qwen: HFTokenCounter) -> None:
    with pytest.raises(ValueError, match=r"line \d+: a prompt of \d+ tokens and 256 output tokens exceed"):
        spec_bench_requests(qwen, str(MT_BENCH), 5, 256, max_model_len=300)


def _serve(url: str, *extra: str) -> list[str]:
    return ["bench", "serve", "--base-url", url, "--disable-tqdm", *extra]


def _questions(path: Path, n: int = 12) -> str:
    """``n`` questions of fake-server words (``w<id>``: one token each), two categories."""
    rows = [
        {
            "question_id": i,
            "category": "even" if i % 2 == 0 else "odd",
            "turns": [f"w{40 + i} w{41 + i}", "w9"],
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_cli_refusals_are_one_line_before_any_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    questions = _questions(tmp_path / "q.jsonl")
    spec = ("--dataset-name", "spec_bench", "--dataset-path", questions)
    with FakeServer(Behaviour()) as s:
        for extra, words in (
            (("--dataset", "spec_bench"), "--dataset spec_bench needs --dataset-path FILE (a question JSONL"),
            (("--spec-bench-category", "x"), "--spec-bench-category applies to --dataset spec_bench"),
            (("--spec-bench-output-len", "9"), "--spec-bench-output-len applies to --dataset spec_bench"),
            ((*spec, "--spec-bench-output-len", "0"), "--spec-bench-output-len must be >= 1"),
            ((*spec, "--spec-bench-output-len", "-1"), "--spec-bench-output-len must be >= 1"),
            ((*spec, "--output-len", "5", "--spec-bench-output-len", "6"), "--output-len 5 and --spec-bench"),
            (
                (*spec, "--input-len", "8"),
                "--input-len applies to --dataset random or sonnet (questions keep",
            ),
            (
                (*spec, "--skip-chat-template"),
                "--skip-chat-template: vLLM's spec_bench renders every question",
            ),
            ((*spec, "--sonnet-output-len", "5"), "--sonnet-output-len applies to --dataset sonnet"),
            ((*spec, "--spec-bench-category", "none"), "--spec-bench-category none: no question of it in"),
            ((*spec, "--num-prompts", "13"), "has 12 questions, --num-prompts 13 asked"),
        ):
            rc = bench_main(_serve(s.url, *extra))
            err = capsys.readouterr().err
            assert rc == 2 and err.startswith("surge: error:") and words in err and err.count("\n") == 1, (
                extra,
                err,
            )
        assert s.behaviour.seen == 0


def test_runs_record_the_dataset(tmp_path: Path) -> None:
    """Against the fake server: a spec_bench run on /v1/completions sends the chat-templated
    questions in vLLM's order (whatever --seed), one on the chat endpoint the questions as the user
    message; --ignore-eos holds each request to --spec-bench-output-len; the results record the
    category and the output length, and bench compare tells categories apart."""
    questions = _questions(tmp_path / "q.jsonl")
    files = {k: tmp_path / f"{k}.json" for k in ("comp", "chat", "odd")}
    common = ("--num-prompts", "5", "--warmup", "0", "--ignore-eos")
    spec = ("--dataset-name", "spec_bench", "--dataset-path", questions, "--spec-bench-output-len", "3")
    with FakeServer(Behaviour()) as s:
        comp = ("--endpoint", "/v1/completions", "--result-file", str(files["comp"]))
        assert bench_main(_serve(s.url, *common, *spec, *comp)) == 0
        sent_comp = [e["body"]["prompt"] for e in s.behaviour.log]
        chat = ("--seed", "7", "--result-file", str(files["chat"]))
        assert bench_main(_serve(s.url, *common, *spec, *chat)) == 0
        sent_chat = [e["body"]["messages"][0]["content"] for e in s.behaviour.log[5:]]
        assert all(e["body"]["max_completion_tokens"] == 3 for e in s.behaviour.log[5:])
        odd = ("--spec-bench-category", "odd", "--result-file", str(files["odd"]))
        assert bench_main(_serve(s.url, *common, *spec, *odd)) == 0
        sent_odd = [e["body"]["messages"][0]["content"] for e in s.behaviour.log[10:]]
    rows = [json.loads(line) for line in Path(questions).read_text().splitlines()]
    order = list(range(12))
    random.Random(0).shuffle(order)  # vLLM's order: seed 0 whatever --seed
    assert sorted(sent_chat) == sorted(rows[i]["turns"][0] for i in order[:5])
    # the fake server's /detokenize writes words as ids: compare the tokens
    assert sorted(encode(p) for p in sent_comp) == sorted(encode(p) + [2] * CHAT_OVERHEAD for p in sent_chat)
    odd_rows = [r for r in rows if r["category"] == "odd"]
    odd_order = list(range(len(odd_rows)))
    random.Random(0).shuffle(odd_order)
    assert sorted(sent_odd) == sorted(odd_rows[i]["turns"][0] for i in odd_order[:5])
    comp_r, chat_r, odd_r = (json.loads(files[k].read_text()) for k in ("comp", "chat", "odd"))
    for r in (comp_r, chat_r):
        assert (r["dataset"], r["dataset_path"], r["output_len"]) == ("spec_bench", questions, 3)
        assert (r["spec_bench_category"], r["spec_bench_output_len"], r["sonnet_input_len"]) == (
            None,
            3,
            None,
        )
        assert r["failed"] == 0 and r["exact_length"] and r["output_lens"] == [3] * 5
    assert sorted(comp_r["input_lens"]) == sorted(chat_r["input_lens"])
    assert odd_r["spec_bench_category"] == "odd" and odd_r["failed"] == 0
    cmp = compare_points(load_points(files["chat"]), load_points(files["odd"]))
    assert [(name, b, n) for _, name, b, n in cmp.mismatches] == [("spec_bench_category", None, "odd")]


def test_num_prompts_0_sends_every_prompt_of_the_file_as_vllm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's custom and spec_bench datasets take --num-prompts 0 or less as every prompt of the
    file (spec_bench: of its category): Surge counts them, says so, and sends them all; another
    dataset still refuses it in one line."""
    questions = _questions(tmp_path / "q.jsonl")
    custom = tmp_path / "p.jsonl"
    custom.write_text("".join(json.dumps({"prompt": f"w{50 + i} w{60 + i}"}) + "\n" for i in range(7)))
    out = tmp_path / "r.json"
    common = ("--warmup", "0", "--ignore-eos", "--output-len", "2", "--result-file", str(out))
    with FakeServer(Behaviour()) as s:
        for extra, n in (
            (("--dataset", "spec_bench", "--dataset-path", questions, "--num-prompts", "0"), 12),
            (("--dataset", "spec_bench", "--dataset-path", questions, "--num-prompts", "-1"), 12),
            (
                ("--dataset-name", "spec_bench", "--dataset-path", questions, "--spec-bench-category", "odd"),
                6,
            ),
            (("--dataset", "custom", "--dataset-path", str(custom), "--skip-chat-template"), 7),
        ):
            argv = _serve(s.url, *common, *extra)
            if "--num-prompts" not in extra:
                argv += ["--num-prompts", "0"]
            seen = s.behaviour.seen
            assert bench_main(argv) == 0, capsys.readouterr().err
            err = capsys.readouterr().err
            assert f"sends every prompt of {extra[3]}: {n} (vLLM's {extra[1]} dataset)" in err, err
            r = json.loads(out.read_text())
            assert (r["num_prompts"], r["completed"], s.behaviour.seen - seen) == (n, n, n)
        assert bench_main(_serve(s.url, "--num-prompts", "0")) == 2
        assert "--num-prompts must be >= 1, got 0" in capsys.readouterr().err
