"""vLLM's ``hf`` dataset (MT-Bench, ShareGPT-format conversations) in ``bench serve``, from local copies.

Prompt construction with a real tokenizer (Qwen3's) against vLLM 0.26's ``MTBenchDataset`` and
``ConversationDataset`` restated here, with ``datasets``' shuffles restated too (``Dataset.shuffle``'s
permutation; the streaming shuffle buffer, which holds all of a small dataset), on the shared
MT-Bench ``question.jsonl`` and FastChat ``dummy_conversation.json``; the folder and split rules of
``datasets``' local loading; the one-line refusals; and runs against the fake server.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pytest
from conftest import QWEN3_8B, SHARED, bench_main
from fake_server import CHAT_OVERHEAD, Behaviour, FakeServer, encode

from surge.bench.compare import compare_points, load_points
from surge.bench.hf_datasets import (
    CONVERSATIONS,
    MT_BENCH,
    hf_data_files,
    hf_requests,
    load_hf_rows,
    split_files,
)
from surge.bench.tokens import HFTokenCounter

MT_BENCH_FILE = SHARED / "datasets" / "mt_bench" / "question.jsonl"
CONVERSATION_FILE = SHARED / "datasets" / "fastchat" / "dummy_conversation.json"


@pytest.fixture(scope="module")
def qwen() -> HFTokenCounter:
    return HFTokenCounter(str(QWEN3_8B))


def _datasets_order(n: int, seed: int) -> list[int]:
    """The row order of ``datasets``' shuffle with ``seed``, restated: ``Dataset.shuffle`` (vLLM's
    ``--no-stream``) takes ``default_rng(seed).permutation(n)``; ``IterableDataset.shuffle`` (vLLM's
    default) fills a buffer of 1,000 rows and, at the end of data that never filled it, yields it
    in ``default_rng(seed).permutation`` order (datasets 5) or after ``default_rng(seed).shuffle``
    (datasets 4); the three agree below 1,000 rows."""
    assert n < 1000
    whole = [int(i) for i in np.random.default_rng(seed).permutation(n)]
    buffer = list(range(n))
    np.random.default_rng(seed).shuffle(buffer)
    assert buffer == whole
    return whole


def _template(counter: HFTokenCounter, text: str) -> str:
    return str(
        counter.tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
    )


def _vllm_mt_bench(
    counter: HFTokenCounter, path: Path, n: int, seed: int, skip_chat_template: bool = False
) -> list[str]:
    """vLLM 0.26's ``MTBenchDataset.sample`` restated: rows in the shuffled order, the first
    ``n``, each its first turn, rendered with the chat template unless --skip-chat-template."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    prompts = [rows[i]["turns"][0] for i in _datasets_order(len(rows), seed)[:n]]
    return prompts if skip_chat_template else [_template(counter, p) for p in prompts]


@pytest.mark.parametrize("seed", [0, 5])
def test_mt_bench_prompts_are_vllms(qwen: HFTokenCounter, seed: int) -> None:
    """The same questions in the same order as vLLM's hf MT-Bench for a seed; chat-templated on
    /v1/completions unless --skip-chat-template, the user message on the chat endpoint; lengths as
    the server counts them; 256 output tokens unless --hf-output-len."""
    path = str(MT_BENCH_FILE)
    comp = hf_requests(qwen, path, MT_BENCH, None, None, 30, None, seed)
    assert [r.prompt for r in comp] == _vllm_mt_bench(qwen, MT_BENCH_FILE, 30, seed)
    raw = hf_requests(qwen, path, MT_BENCH, "train", "default", 30, 9, seed, skip_chat_template=True)
    assert [r.prompt for r in raw] == _vllm_mt_bench(qwen, MT_BENCH_FILE, 30, seed, skip_chat_template=True)
    chat = hf_requests(qwen, path, MT_BENCH, None, None, 30, 9, seed, chat=True)
    assert [r.prompt for r in chat] == [r.prompt for r in raw]
    for c, r, h in zip(comp, raw, chat, strict=True):
        assert c.prompt_len == len(qwen.encode(c.prompt)) == len(qwen.encode_chat(h.prompt)) == h.prompt_len
        assert r.prompt_len == len(qwen.encode(r.prompt)) < c.prompt_len
        assert (c.expected_output_len, r.expected_output_len, h.expected_output_len) == (256, 9, 9)


def _vllm_conversations(
    counter: HFTokenCounter, rows: list[dict[str, Any]], n: int, seed: int, output_len: int | None
) -> list[tuple[str, int]]:
    """vLLM 0.26's ``ConversationDataset.sample`` restated: the shuffled rows with two turns or more,
    turn 0 the prompt and turn 1 the completion, counted with ``tokenizer(text).input_ids``; with
    reply lengths, ``is_valid_sequence``'s pruning (4, 1,024, 2,048)."""
    out: list[tuple[str, int]] = []
    for i in _datasets_order(len(rows), seed):
        conv = rows[i]["conversations"]
        if len(conv) < 2:
            continue
        prompt, completion = conv[0]["value"], conv[1]["value"]
        p, c = len(counter.tok(prompt).input_ids), len(counter.tok(completion).input_ids)
        if output_len is None and (p < 4 or c < 4 or p > 1024 or p + c > 2048):
            continue
        out.append((prompt, c if output_len is None else output_len))
        if len(out) == n:
            break
    return out


def _conversation_rows(words: str = "love") -> list[dict[str, Any]]:
    """Rows that vLLM's pruning tells apart: short and long prompts and replies, one-turn rows, a
    reply-first row (vLLM takes turn 0 whatever its role)."""
    rows: list[dict[str, Any]] = []
    for i in range(40):
        prompt = f"Question {i}: " + f"{words} " * (i % 5)
        reply = "Yes." if i % 4 == 0 else f"Answer {i}: " + "ok " * (i % 7)
        turns = [{"from": "human", "value": prompt}, {"from": "gpt", "value": reply}]
        if i % 9 == 0:
            turns = turns[:1]  # no reply: left out
        if i % 11 == 0:
            turns = turns[::-1]
        rows.append({"id": f"c{i}", "conversations": turns})
    rows.append({"id": "long", "conversations": [{"value": "w " * 1100}, {"value": "a b c d e"}]})
    # vLLM prunes by its count of the raw text, not the chat-templated one (the server's on chat):
    # a prompt of 1 token is left out, one of 1,020 kept
    rows.append({"id": "hi", "conversations": [{"value": "Hi"}, {"value": "Hello, how are you?"}]})
    rows.append({"id": "edge", "conversations": [{"value": "w" + " w" * 1019}, {"value": "a b c d e"}]})
    return rows


def test_conversation_prompts_are_vllms(qwen: HFTokenCounter, tmp_path: Path) -> None:
    """The same rows in the same order as vLLM's hf conversations for a seed: with reply lengths
    pruned as vLLM (counted as vLLM counts them), with --hf-output-len every row of two turns; the
    prompt sent as it is on both endpoints, its length counted as the server sees it."""
    shared = json.loads(CONVERSATION_FILE.read_text())
    for seed in (0, 3):
        got = hf_requests(qwen, str(CONVERSATION_FILE), CONVERSATIONS, "train", None, 50, None, seed)
        assert [(r.prompt, r.expected_output_len) for r in got] == _vllm_conversations(
            qwen, shared, 50, seed, None
        )
    path = tmp_path / "conv.json"
    rows = _conversation_rows()
    path.write_text(json.dumps(rows))
    usable = _vllm_conversations(qwen, rows, len(rows), 1, None)
    kept = {p for p, _ in usable}
    assert "w" + " w" * 1019 in kept and "Hi" not in kept
    assert len(qwen.encode("Hi")) < 4 < len(qwen.encode_chat("Hi"))
    assert len(qwen.encode("w" + " w" * 1019)) <= 1024 < len(qwen.encode_chat("w" + " w" * 1019))
    pruned = _vllm_conversations(qwen, rows, 12, 1, None)
    fixed = _vllm_conversations(qwen, rows, 30, 1, 7)
    assert [p for p, _ in pruned] != [p for p, _ in fixed[:12]]  # pruning changes which rows
    for chat in (False, True):
        got = hf_requests(qwen, str(path), CONVERSATIONS, None, None, len(usable), None, 1, chat=chat)
        assert [(r.prompt, r.expected_output_len) for r in got] == usable
        got = hf_requests(qwen, str(path), CONVERSATIONS, None, None, 12, None, 1, chat=chat)
        assert [(r.prompt, r.expected_output_len) for r in got] == pruned
        encode = qwen.encode_chat if chat else qwen.encode
        assert all(r.prompt_len == len(encode(r.prompt)) for r in got)
        got = hf_requests(qwen, str(path), CONVERSATIONS, None, None, 30, 7, 1, chat=chat)
        assert [(r.prompt, r.expected_output_len) for r in got] == fixed
    lines = tmp_path / "conv.jsonl"  # JSON Lines, a folder of it: the same rows
    lines.write_text("".join(json.dumps(r) + "\n" for r in rows))
    folder = tmp_path / "snapshot"
    (folder / ".cache").mkdir(parents=True)
    (folder / "conv.json").write_text(json.dumps(rows))
    (folder / ".cache" / "x.json").write_text("[]")
    (folder / "README.md").write_text("# card\n")
    (folder / "clean.py").write_text("print(1)\n")
    for where in (lines, folder):
        got = hf_requests(qwen, str(where), CONVERSATIONS, None, None, 12, None, 1)
        assert [(r.prompt, r.expected_output_len) for r in got] == pruned


def _paths(*names: str) -> list[PurePosixPath]:
    return sorted(PurePosixPath(n) for n in names)


@pytest.mark.parametrize(
    ("names", "splits"),
    [
        (["question.jsonl"], {"train": ["question.jsonl"]}),
        (["test.jsonl", "train.jsonl"], {"train": ["train.jsonl"], "test": ["test.jsonl"]}),
        (
            [
                "data/test-00000-of-00001.json",
                "data/train-00000-of-00002.json",
                "data/train-00001-of-00002.json",
            ],
            {
                "test": ["data/test-00000-of-00001.json"],
                "train": ["data/train-00000-of-00002.json", "data/train-00001-of-00002.json"],
            },
        ),
        (
            ["dev/b.json", "train/a.json", "x_test.json"],
            {"train": ["train/a.json"], "validation": ["dev/b.json"]},
        ),
        (["my_train_file.json", "pretest.json"], {"train": ["my_train_file.json"]}),
        (["a.json", "retrain.json"], {"train": ["a.json", "retrain.json"]}),
        (
            ["ShareGPT_V3_unfiltered_cleaned_split.json", "ShareGPT_V4.3.json"],
            {"train": ["ShareGPT_V3_unfiltered_cleaned_split.json", "ShareGPT_V4.3.json"]},
        ),
    ],
)
def test_splits_as_datasets_infers_them(names: list[str], splits: dict[str, list[str]]) -> None:
    """datasets' rules for a folder without a card's configs: sharded data/{split}-NNNNN-of-NNNNN
    names, else a split word in a folder name, else in a file name (between separators, never the
    name's end), else every file is train."""
    got = split_files(_paths(*names))
    assert {k: [str(p) for p in v] for k, v in got.items()} == splits


def _write(path: Path, rows: list[Any] | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(rows if isinstance(rows, str) else "".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_folder_splits_and_formats(tmp_path: Path) -> None:
    """A folder's split files in order; a .json holding an array, one object or JSON Lines."""
    _write(tmp_path / "d" / "train.jsonl", [{"turns": ["a"]}, {"turns": ["b"]}])
    _write(tmp_path / "d" / "test.json", json.dumps([{"turns": ["c"]}, {"turns": ["d"]}]))
    _write(tmp_path / "d" / "test-extra.json", [{"turns": ["e"]}, {"turns": ["g"]}])  # JSON Lines in a .json
    _write(tmp_path / "d" / "train-one.json", json.dumps({"turns": ["f"]}))
    turns = lambda split: [r.fields["turns"][0] for r in load_hf_rows(str(tmp_path / "d"), split)]  # noqa: E731
    assert turns("test") == ["e", "g", "c", "d"] and turns("train") == ["f", "a", "b"]
    assert [f.name for f in hf_data_files(str(tmp_path / "d"), "test")] == ["test-extra.json", "test.json"]
    rows = load_hf_rows(str(tmp_path / "d"), "test")
    assert rows[1].where.endswith("test-extra.json:2") and rows[3].where.endswith("test.json[1]")


@pytest.mark.parametrize(
    ("files", "args", "words"),
    [
        (
            {},
            ("philschmid/mt-bench", None),
            "no such local file or folder; Surge reads no dataset hub: download",
        ),
        (
            {},
            ("mine", MT_BENCH),
            "--dataset-path mine: no such local file or folder; Surge reads no dataset hub",
        ),
        (
            {"q.jsonl": [{"turns": ["a"]}]},
            ("q.jsonl", None),
            "--dataset-path q.jsonl: Surge's --dataset hf reads",
        ),
        ({"q.jsonl": [{"turns": ["a"]}]}, ("q.jsonl", "openai/gsm8k"), "--hf-name openai/gsm8k: Surge's"),
        ({"q.jsonl": [{"turns": ["a"]}]}, ("q.jsonl", MT_BENCH, "test"), "--hf-split test: the one file"),
        (
            {"d/train.json": [{"turns": ["a"]}]},
            ("d", MT_BENCH, "test"),
            "--hf-split test: d has the splits train",
        ),
        (
            {"q.jsonl": [{"turns": ["a"]}]},
            ("q.jsonl", MT_BENCH, None, "main"),
            "--hf-subset main: Surge reads",
        ),
        ({"d/x.parquet": "PAR1"}, ("d", MT_BENCH), "Parquet data (x.parquet), which Surge does not read"),
        ({"q.parquet": "PAR1"}, ("q.parquet", MT_BENCH), "Parquet data (q.parquet)"),
        ({"q.csv": "a,b\n"}, ("q.csv", MT_BENCH), "not a .json or .jsonl file"),
        ({"d/notes.txt": "x"}, ("d", MT_BENCH), "no .json or .jsonl data files in the folder"),
        ({"q.jsonl": ""}, ("q.jsonl", MT_BENCH), "no rows in the train split"),
        ({"q.jsonl": "{oops\n"}, ("q.jsonl", MT_BENCH), "q.jsonl:1: not JSON"),
        ({"q.json": "[1, 2]"}, ("q.json", MT_BENCH), "q.json[0]: a row must be a JSON object"),
        (
            {"q.jsonl": [{"turns": ["a"]}] * 2},
            ("q.jsonl", MT_BENCH),
            "has 2 questions, --num-prompts 3 asked",
        ),
        ({"q.jsonl": [{"turns": []}] * 3}, ("q.jsonl", MT_BENCH), 'an MT-Bench row needs "turns", a list'),
        ({"q.jsonl": [{"turns": ["a"]}] * 3}, ("q.jsonl", CONVERSATIONS), 'needs a "conversations" list'),
        (
            {"q.jsonl": [{"conversations": [{"value": "a"}, {"from": "gpt"}]}] * 3},
            ("q.jsonl", CONVERSATIONS),
            'conversation turn 1 needs a "value" string',
        ),
        (
            {"q.jsonl": [{"conversations": [{"value": "a b c d"}, {"value": "ok"}]}] * 3},
            ("q.jsonl", CONVERSATIONS),
            "has no usable conversations (two turns or more, kept by vLLM's pruning of their lengths): "
            "nothing to send",
        ),
        (
            {
                "q.jsonl": [{"conversations": [{"value": "a b c d"}, {"value": "ok"}]}] * 3
                + [
                    {
                        "conversations": [
                            {"value": "a b c d"},
                            {"value": "this is a fine and long enough reply"},
                        ]
                    }
                ]
            },
            ("q.jsonl", CONVERSATIONS),
            "has 1 usable conversations (two turns or more, kept by vLLM's pruning of their lengths), "
            "--num-prompts 3 asked (vLLM would send some twice; give --num-prompts 1 or fewer)",
        ),
    ],
)
def test_refusals(
    qwen: HFTokenCounter,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, Any],
    args: tuple[Any, ...],
    words: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    for name, content in files.items():
        _write(tmp_path / name, content)
    path, name, split, subset = (*args, None, None)[:4]
    with pytest.raises(ValueError) as e:
        hf_requests(qwen, path, name, split, subset, 3, None, 0, chat=True)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_conversations_of_one_turn_only_are_refused_in_one_line(qwen: HFTokenCounter, tmp_path: Path) -> None:
    """A ShareGPT-format file whose conversations all have one turn (as shared/assets' ShareGPT
    copies, which keep only the prompts) has nothing vLLM would send, even with --hf-output-len: the
    error says so (it said "has 0 conversations ...; give --num-prompts 0 or fewer")."""
    path = str(_write(tmp_path / "c.json", [{"conversations": [{"from": "human", "value": "a b c d"}]}] * 4))
    with pytest.raises(ValueError) as e:
        hf_requests(qwen, path, CONVERSATIONS, None, None, 2, 8, 0)
    assert str(e.value) == f"{path} has no conversations of two turns or more: nothing to send"


def test_an_empty_prompt_sent_as_it_is_is_refused_by_row(qwen: HFTokenCounter, tmp_path: Path) -> None:
    """An empty first turn sent as it is (a completions prompt: MT-Bench with --skip-chat-template,
    or a conversation with --hf-output-len, which no pruning drops) is 0 tokens, which the server
    answers with a 400: it is refused naming the row (every such request failed). Templated, or as
    the chat endpoint's user message, it has the template's tokens and is sent."""
    mt = str(_write(tmp_path / "q.jsonl", [{"turns": [""]}]))
    conv = str(_write(tmp_path / "c.jsonl", [{"conversations": [{"value": ""}, {"value": "a b c d e"}]}]))
    words = "an empty prompt (0 tokens as the server counts it), which the server refuses"
    with pytest.raises(ValueError, match=re.escape(f"{mt}: {words}")):
        hf_requests(qwen, mt, MT_BENCH, None, None, 1, 8, 0, skip_chat_template=True)
    with pytest.raises(ValueError, match=re.escape(f"{conv}: {words}")):
        hf_requests(qwen, conv, CONVERSATIONS, None, None, 1, 8, 0)
    assert hf_requests(qwen, mt, MT_BENCH, None, None, 1, 8, 0)[0].prompt_len > 0
    assert hf_requests(qwen, conv, CONVERSATIONS, None, None, 1, 8, 0, chat=True)[0].prompt_len > 0


def test_prompt_over_max_model_len_is_refused(qwen: HFTokenCounter) -> None:
    with pytest.raises(ValueError, match=r"question.jsonl:\d+: a prompt of \d+ tokens and 256 output tokens"):
        hf_requests(qwen, str(MT_BENCH_FILE), MT_BENCH, None, None, 5, None, 0, max_model_len=300)


def _serve(url: str, *extra: str) -> list[str]:
    return ["bench", "serve", "--base-url", url, "--disable-tqdm", *extra]


def _fake_files(tmp_path: Path) -> tuple[str, str]:
    """An MT-Bench file and a conversations file of fake-server words (``w<id>``: one token each)."""
    questions = [
        {"question_id": i, "category": "x", "turns": [f"w{30 + i} w{31 + i}", "w9"]} for i in range(10)
    ]
    convs = [
        {
            "conversations": [
                {"from": "human", "value": " ".join(f"w{40 + k}" for k in range(3 + i % 3))},
                {"from": "gpt", "value": " ".join(f"w{60 + k}" for k in range(3 + i % 4))},
            ]
        }
        for i in range(10)
    ]
    mt = _write(tmp_path / "mt" / "question.jsonl", questions)
    conv = _write(tmp_path / "data" / "sharegpt.json", json.dumps(convs))
    return str(mt.parent), str(conv)


def test_cli_refusals_are_one_line_before_any_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mt, conv = _fake_files(tmp_path)
    hf = ("--dataset-name", "hf", "--dataset-path", mt, "--hf-name", MT_BENCH)
    with FakeServer(Behaviour()) as s:
        for extra, words in (
            (("--dataset", "hf"), "--dataset hf needs --dataset-path FILE (a local copy of the Hugging Face"),
            (("--hf-name", MT_BENCH), "--hf-name applies to --dataset hf"),
            (("--hf-split", "train"), "--hf-split applies to --dataset hf"),
            (("--hf-output-len", "9"), "--hf-output-len applies to --dataset hf (use --output-len)"),
            (("--dataset", "hf", "--dataset-path", MT_BENCH), "no such local file or folder; Surge reads no"),
            (("--dataset", "hf", "--dataset-path", mt), f"--dataset-path {mt}: Surge's --dataset hf reads"),
            ((*hf, "--hf-output-len", "0"), "--hf-output-len must be >= 1"),
            (
                (*hf, "--output-len", "5", "--hf-output-len", "6"),
                "--output-len 5 and --hf-output-len 6 disagree",
            ),
            ((*hf, "--input-len", "8"), "--input-len applies to --dataset random or sonnet (the dataset's"),
            ((*hf, "--hf-subset", "de"), "--hf-subset de: Surge reads a local file or folder's data files"),
            ((*hf, "--hf-split", "test"), f"--hf-split test: {mt} has the splits train"),
            ((*hf, "--chat-template-kwargs", "{}"), "--chat-template-kwargs applies to --dataset custom"),
            ((*hf, "--num-prompts", "11"), "has 10 questions, --num-prompts 11 asked"),
        ):
            rc = bench_main(_serve(s.url, *extra))
            err = capsys.readouterr().err
            assert rc == 2 and err.startswith("surge: error:") and words in err and err.count("\n") == 1, (
                extra,
                err,
            )
        assert s.behaviour.seen == 0


def test_runs_record_the_dataset(tmp_path: Path) -> None:
    """Against the fake server (word tokens, a BOS, a chat template of CHAT_OVERHEAD tokens): an
    MT-Bench run on /v1/completions sends the templated questions, one with --skip-chat-template
    the questions; a conversations run asks each reply's length (BOS included, as vLLM counts it),
    held to it with --ignore-eos; the results record the hf settings and compare tells them apart."""
    mt, conv = _fake_files(tmp_path)
    files = {k: tmp_path / f"{k}.json" for k in ("comp", "raw", "conv", "conv7")}
    common = ("--num-prompts", "4", "--warmup", "0", "--seed", "2", "--endpoint", "/v1/completions")
    mt_args = ("--dataset-name", "hf", "--dataset-path", mt, "--hf-name", MT_BENCH, "--hf-output-len", "3")
    conv_args = ("--dataset-name", "hf", "--dataset-path", conv, "--hf-name", CONVERSATIONS, "--ignore-eos")
    with FakeServer(Behaviour()) as s:
        assert bench_main(_serve(s.url, *common, *mt_args, "--result-file", str(files["comp"]))) == 0
        sent_comp = [e["body"]["prompt"] for e in s.behaviour.log]
        raw = (*mt_args, "--skip-chat-template", "--result-file", str(files["raw"]))
        assert bench_main(_serve(s.url, *common, *raw)) == 0
        sent_raw = [e["body"]["prompt"] for e in s.behaviour.log[4:]]
        assert bench_main(_serve(s.url, *common, *conv_args, "--result-file", str(files["conv"]))) == 0
        sent_conv = [(e["body"]["prompt"], e["body"]["max_tokens"]) for e in s.behaviour.log[8:]]
        more = (*conv_args, "--output-len", "7", "--result-file", str(files["conv7"]))
        assert bench_main(_serve(s.url, *common, *more)) == 0
    questions = [json.loads(line) for line in Path(mt, "question.jsonl").read_text().splitlines()]
    order = [int(i) for i in np.random.default_rng(2).permutation(10)]
    assert sorted(sent_raw) == sorted(questions[i]["turns"][0] for i in order[:4])
    # the fake server's /detokenize writes words as ids: compare the tokens
    assert sorted(encode(p) for p in sent_comp) == sorted(encode(p) + [2] * CHAT_OVERHEAD for p in sent_raw)
    convs = json.loads(Path(conv).read_text())
    want = [(c["conversations"][0]["value"], len(encode(c["conversations"][1]["value"]))) for c in convs]
    assert sorted(sent_conv) == sorted(want[i] for i in order[:4])
    comp_r, raw_r, conv_r, conv7_r = (
        json.loads(files[k].read_text()) for k in ("comp", "raw", "conv", "conv7")
    )
    assert (comp_r["dataset"], comp_r["hf_name"], comp_r["hf_split"], comp_r["hf_subset"]) == (
        "hf",
        MT_BENCH,
        "train",
        None,
    )
    assert (comp_r["hf_output_len"], comp_r["output_len"], comp_r["skip_chat_template"]) == (3, 3, False)
    assert raw_r["skip_chat_template"] and comp_r["failed"] == raw_r["failed"] == 0
    assert conv_r["failed"] == 0 and conv_r["exact_length"] and conv_r["hf_output_len"] is None
    assert sorted(conv_r["output_lens"]) == sorted(n for _, n in sent_conv)
    assert conv7_r["output_lens"] == [7] * 4 and conv7_r["hf_output_len"] == 7
    cmp = compare_points(load_points(files["comp"]), load_points(files["raw"]))
    assert [(name, b, n) for _, name, b, n in cmp.mismatches] == [("skip_chat_template", False, True)]
    other = tmp_path / "other.json"  # the same run but of another split and subset
    other.write_text(json.dumps({**comp_r, "hf_split": "test", "hf_subset": "default"}))
    cmp = compare_points(load_points(files["comp"]), load_points(other))
    assert [(name, b, n) for _, name, b, n in cmp.mismatches] == [
        ("hf_split", "train", "test"),
        ("hf_subset", None, "default"),
    ]
