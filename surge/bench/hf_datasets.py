"""vLLM's ``hf`` dataset for its text-only subsets, read from a local file or folder (no hub).

vLLM 0.26's ``--dataset-name hf`` picks a ``HuggingFaceDataset`` class by ``--dataset-path`` or
``--hf-name`` (checked in vLLM's order) and loads the data with ``datasets.load_dataset``. Surge has
two of them, and reads what ``load_dataset`` would read from a local copy (a hub snapshot folder, or
one file) instead of the hub:

- ``philschmid/mt-bench`` (vLLM's ``MTBenchDataset``): rows with a ``turns`` list; the first turn is
  the prompt, rendered with the chat template on /v1/completions unless ``--skip-chat-template``;
  each asks ``--hf-output-len`` (256 by default). See :func:`mt_bench_requests`.
- ``Aeala/ShareGPT_Vicuna_unfiltered`` (vLLM's ``ConversationDataset``): rows with a
  ``conversations`` list of ``{"from", "value"}`` turns; rows of two turns or more, turn 0 the prompt
  (sent as it is) and turn 1 the reply, whose length each request asks unless ``--hf-output-len``
  (then with vLLM's pruning). See :func:`conversation_requests`.

Rows are shuffled as ``Dataset.shuffle(seed=--seed)`` does
(``numpy.random.default_rng(seed).permutation``): vLLM's order with ``--no-stream``, and with its
default streaming too for data of fewer than 1,000 rows (the shuffle buffer then holds them all);
past that, vLLM's streaming order depends on the installed ``datasets`` version's buffer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from surge.bench.datasets import (
    SHAREGPT_MAX_PROMPT_LEN,
    SHAREGPT_MAX_TOTAL_LEN,
    SHAREGPT_MIN_LEN,
    SampleRequest,
    _read_text,
    dataset_file,
    fewer_prompts_note,
    prompt_encoder,
)
from surge.bench.tokens import TokenCounter

MT_BENCH = "philschmid/mt-bench"
CONVERSATIONS = "Aeala/ShareGPT_Vicuna_unfiltered"
HF_DATASETS = {MT_BENCH: "mt-bench", CONVERSATIONS: "conversations"}
"""The hub ids Surge's ``--dataset hf`` reads (from a local copy), in vLLM's dispatch order, and their kind."""
MT_BENCH_OUTPUT_LEN = 256
"""vLLM's ``MTBenchDataset.DEFAULT_OUTPUT_LEN``: the output tokens of an MT-Bench request without ``--hf-output-len``."""
DEFAULT_SPLIT = "train"
"""The split read without ``--hf-split`` (vLLM's default for MT-Bench; vLLM's conversations need it given)."""

DATA_SUFFIXES = (".json", ".jsonl", ".parquet")
IGNORED_FILES = (
    "README.md",
    "config.json",
    "dataset_info.json",
    "dataset_infos.json",
    "dummy_data.zip",
    "dataset_dict.json",
)
"""Files ``datasets`` never takes as data files of a folder."""
SPLIT_KEYWORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
"""``datasets``' split names and the words in a file or folder name that put a file in them."""
_SEP = "-._ 0123456789"  # the characters around such a word (datasets' NON_WORDS_CHARS)
_SHARDED = re.compile(r"(?P<split>\w+(?:\.\w+)*)-\d{5}-of-\d{5}[^/]*\.[^/]*")


def hf_dataset_kind(path: str | None, hf_name: str | None) -> str:
    """Which of vLLM's hf datasets ``--dataset-path`` / ``--hf-name`` select, as vLLM's dispatch:
    the first of :data:`HF_DATASETS` that either names ("mt-bench" or "conversations").

    Raises:
        ValueError: neither names one of them (one line listing the supported ids).
    """
    for name, kind in HF_DATASETS.items():
        if name in (path, hf_name):
            return kind
    given = f"--hf-name {hf_name}" if hf_name else f"--dataset-path {path}"
    raise ValueError(
        f"{given}: Surge's --dataset hf reads {MT_BENCH} (MT-Bench) and {CONVERSATIONS} (ShareGPT-format "
        "conversations) from a local copy: give one of them as --hf-name with --dataset-path FILE_OR_FOLDER "
        "(vLLM's other hf datasets, multimodal, code-edit, math or ASR sets, are not in Surge)"
    )


def check_local_path(path: str, hf_name: str | None) -> None:
    """Refuse a ``--dataset-path`` that is not a local file or folder (a hub id: Surge has no network).

    Raises:
        ValueError: one line saying how to give a local copy.
    """
    if Path(path).exists():
        return
    name = hf_name or path
    if name in HF_DATASETS:
        raise ValueError(
            f"--dataset-path {path}: no such local file or folder; Surge reads no dataset hub: download it "
            f"(e.g. huggingface-cli download {name} --repo-type dataset --local-dir DIR) and give "
            f"--dataset-path DIR --hf-name {name}"
        )
    raise ValueError(f"--dataset-path {path}: no such file or folder")


def _hidden(rel: PurePosixPath) -> bool:
    return any(part.startswith(".") or part.startswith("__") for part in rel.parts)


def _word_in(name: str, word: str, start: bool, end: bool) -> bool:
    """``word`` in ``name`` between separator characters, or at its start (``start``) or end (``end``)."""
    i = name.find(word)
    while i >= 0:
        j = i + len(word)
        before = (i == 0 and start) or (i > 0 and name[i - 1] in _SEP)
        after = (j == len(name) and end) or (j < len(name) and name[j] in _SEP)
        if before and after:
            return True
        i = name.find(word, i + 1)
    return False


def _in_dir(rel: PurePosixPath, word: str) -> bool:
    """datasets' ``**/{w}/**``, ``**/{w}[sep]*/**``, ``**/*[sep]{w}/**``, ``**/*[sep]{w}[sep]*/**``."""
    return any(_word_in(part, word, start=True, end=True) for part in rel.parts[:-1])


def _in_name(rel: PurePosixPath, word: str) -> bool:
    """datasets' ``**/{w}[sep]*`` and ``**/*[sep]{w}[sep]*``: never the whole name's end."""
    return _word_in(rel.name, word, start=True, end=False)


def split_files(files: list[PurePosixPath]) -> dict[str, list[PurePosixPath]]:
    """The splits of a folder's data files (paths relative to it, sorted), as ``datasets`` infers
    them without a dataset card's ``configs``: ``data/{split}-NNNNN-of-NNNNN*`` shards; else a split
    word (:data:`SPLIT_KEYWORDS`) in a folder name; else in a file name; else every file is ``train``.
    The first of these rules that puts a file in a split decides, and a split's files keep the order
    of its words and then of the paths."""
    sharded: dict[str, list[PurePosixPath]] = {}
    for rel in files:
        m = _SHARDED.fullmatch(rel.name) if rel.parent == PurePosixPath("data") else None
        if m:
            sharded.setdefault(m["split"], []).append(rel)
    if sharded:
        return sharded
    test: Callable[[PurePosixPath, str], bool]
    for test in (_in_dir, _in_name):
        found: dict[str, list[PurePosixPath]] = {}
        for split, words in SPLIT_KEYWORDS.items():
            picked = [rel for word in words for rel in files if test(rel, word)]
            unique = list(dict.fromkeys(picked))
            if unique:
                found[split] = unique
        if found:
            return found
    return {DEFAULT_SPLIT: list(files)}


def hf_data_files(path: str, split: str, subset: str | None = None) -> list[Path]:
    """The JSON / JSON Lines files of ``split`` in ``path``: the file itself (its one split is
    ``train``, as ``datasets``' JSON loader names it), or a folder's data files of that split
    (:func:`split_files`; hidden files, ``__*`` folders and :data:`IGNORED_FILES` left out).

    Raises:
        ValueError: a subset other than ``default`` (Surge reads no dataset card's configs), a split
            the data does not have, Parquet data (no reader: pyarrow is not a Surge dependency), or
            no JSON data file (one line naming the flag).
    """
    if subset not in (None, "default"):
        raise ValueError(
            f"--hf-subset {subset}: Surge reads a local file or folder's data files without subsets (a dataset "
            "card's configs); give the subset's own file or folder as --dataset-path"
        )
    root = Path(path)
    if root.exists() and not root.is_dir():  # a file: a regular one (not /dev/null, a pipe)
        dataset_file(path, "JSON or JSON Lines file, or a folder of them")
    if root.is_file():
        if split != DEFAULT_SPLIT:
            raise ValueError(
                f"--hf-split {split}: the one file {path} is the {DEFAULT_SPLIT} split (as datasets' JSON loader "
                "names it); give a folder whose file names carry the split"
            )
        candidates = [root]
    else:
        rels = sorted(
            PurePosixPath(f.relative_to(root).as_posix())
            for f in root.rglob("*")
            if f.is_file() and f.suffix in DATA_SUFFIXES and f.name not in IGNORED_FILES
        )
        splits = split_files([r for r in rels if not _hidden(r)])
        if not any(splits.values()):
            raise ValueError(f"--dataset-path {path}: no .json or .jsonl data files in the folder")
        if split not in splits:
            raise ValueError(f"--hf-split {split}: {path} has the splits {', '.join(splits)}")
        candidates = [root / r for r in splits[split]]
    parquet = [f for f in candidates if f.suffix == ".parquet"]
    data = [f for f in candidates if f.suffix in (".json", ".jsonl")]
    if len(parquet) > len(data) or (root.is_file() and parquet):
        raise ValueError(
            f"--dataset-path {path}: Parquet data ({parquet[0].name}), which Surge does not read (pyarrow is not "
            "one of its dependencies): convert it to JSON Lines, e.g. with pandas' read_parquet(...).to_json(..., "
            "orient='records', lines=True)"
        )
    if not data:
        raise ValueError(f"--dataset-path {path}: not a .json or .jsonl file")
    return data


@dataclass(frozen=True)
class Row:
    """One row of the data: its fields and where it is (``file:line`` or ``file[index]``)."""

    fields: dict[str, Any]
    where: str


def _read_rows(file: Path, path: str) -> list[Row]:
    """The rows of one JSON file as ``datasets``' JSON loader reads them: a JSON array of objects,
    one object, or JSON Lines (one object a line, blank lines skipped).

    Raises:
        ValueError: a row that is not a JSON object, or a line that is not JSON (one line naming it).
    """
    text = _read_text(str(file), "JSON or JSON Lines file")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, list):
        items = [(item, f"{file}[{i}]") for i, item in enumerate(whole)]
    elif isinstance(whole, dict):
        items = [(whole, str(file))]
    else:
        items = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                items.append((json.loads(line), f"{file}:{n}"))
            except json.JSONDecodeError as e:
                raise ValueError(f"--dataset-path {path}: {file}:{n}: not JSON ({e})") from None
    rows = []
    for item, where in items:
        if not isinstance(item, dict):
            raise ValueError(f"--dataset-path {path}: {where}: a row must be a JSON object")
        rows.append(Row(item, where))
    return rows


def load_hf_rows(path: str, split: str, subset: str | None = None) -> list[Row]:
    """The rows of ``split`` of the local file or folder ``path`` (:func:`hf_data_files`), file after
    file in their order.

    Raises:
        ValueError: see :func:`hf_data_files` and :func:`_read_rows`, or no row at all.
    """
    rows = [row for file in hf_data_files(path, split, subset) for row in _read_rows(file, path)]
    if not rows:
        raise ValueError(f"--dataset-path {path}: no rows in the {split} split")
    return rows


def shuffled(rows: list[Row], seed: int, shuffle: bool = True) -> list[Row]:
    """``rows`` in the order of ``datasets``' ``Dataset.shuffle(seed=seed)``; as they are when not
    ``shuffle`` (vLLM's ``--disable-shuffle``)."""
    if not shuffle:
        return list(rows)
    return [rows[int(i)] for i in np.random.default_rng(seed).permutation(len(rows))]


def _too_many(path: str, have: int, what: str, num_prompts: int) -> ValueError:
    """The one-line error of ``path`` having ``have`` < ``num_prompts`` usable rows (``what``)."""
    if not have:  # vLLM would send nothing, and no --num-prompts helps
        return ValueError(f"{path} has no {what}: nothing to send")
    return ValueError(
        f"{path} has {have} {what}, --num-prompts {num_prompts} asked (vLLM would send some twice; give "
        f"--num-prompts {have} or fewer)"
    )


def _check_fits(row: Row, n: int, want: int, max_model_len: int | None) -> None:
    """Refuse a taken row whose prompt has ``n`` tokens as the server counts it: none (an empty
    turn sent as it is, which a server answers with a 400, so every such request would fail), or
    with the ``want`` output tokens over ``max_model_len``. Raises ValueError naming the row."""
    if n == 0:
        raise ValueError(
            f"{row.where}: an empty prompt (0 tokens as the server counts it), which the server refuses; "
            "leave the row out of the data"
        )
    if max_model_len is not None and n + want > max_model_len:
        raise ValueError(
            f"{row.where}: a prompt of {n} tokens and {want} output tokens exceed the server's max_model_len "
            f"{max_model_len}"
        )


def mt_bench_requests(
    counter: TokenCounter,
    rows: list[Row],
    path: str,
    num_prompts: int,
    output_len: int | None,
    seed: int,
    max_model_len: int | None = None,
    chat: bool = False,
    options: Mapping[str, Any] | None = None,
    skip_chat_template: bool = False,
    shuffle: bool = True,
    fewer_ok: bool = False,
) -> list[SampleRequest]:
    """vLLM's ``MTBenchDataset`` (``shuffle`` False: vLLM's ``--disable-shuffle``, the rows' order): the first ``num_prompts`` rows in :func:`shuffled` order, each the
    first of its ``turns``, asking ``output_len`` tokens (None: :data:`MT_BENCH_OUTPUT_LEN`). On
    /v1/completions the prompt is rendered with the model's chat template unless
    ``skip_chat_template``, as vLLM; on the chat endpoint it is the user message (vLLM's client
    would send the rendered text as the message). Lengths are counted as the server sees the
    prompt (under the request fields ``options``).

    Raises:
        ValueError: fewer rows than ``num_prompts`` (vLLM would send some twice), a taken row
            without a first turn string, an empty prompt (a first turn of "" sent as it is), or a
            prompt whose length and output exceed ``max_model_len``.
    """
    want = MT_BENCH_OUTPUT_LEN if output_len is None else output_len
    if fewer_ok and 0 < len(rows) < num_prompts:  # vLLM's --no-oversample
        fewer_prompts_note(path, len(rows), "questions", num_prompts)
        num_prompts = len(rows)
    if len(rows) < num_prompts:
        raise _too_many(path, len(rows), "questions", num_prompts)
    encode = prompt_encoder(counter, chat, options)
    out: list[SampleRequest] = []
    for row in shuffled(rows, seed, shuffle)[:num_prompts]:
        turns = row.fields.get("turns")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise ValueError(f'{row.where}: an MT-Bench row needs "turns", a list whose first is a string')
        text = turns[0] if chat or skip_chat_template else counter.render_chat(turns[0])
        n = len(encode(text))
        _check_fits(row, n, want, max_model_len)
        out.append(SampleRequest(text, n, want))
    return out


def _turn(row: Row, conv: list[Any], i: int) -> str:
    turn = conv[i]
    value = turn.get("value") if isinstance(turn, dict) else None
    if not isinstance(value, str):
        raise ValueError(f'{row.where}: conversation turn {i} needs a "value" string')
    return value


def conversation_requests(
    counter: TokenCounter,
    rows: list[Row],
    path: str,
    num_prompts: int,
    output_len: int | None,
    seed: int,
    max_model_len: int | None = None,
    chat: bool = False,
    options: Mapping[str, Any] | None = None,
    shuffle: bool = True,
    fewer_ok: bool = False,
) -> list[SampleRequest]:
    """vLLM's ``ConversationDataset``: rows in :func:`shuffled` order (``shuffle`` False: vLLM's
    ``--disable-shuffle``, the rows' order) whose ``conversations`` have two
    turns or more; turn 0's ``value`` is the prompt, sent as it is (on the chat endpoint as the user
    message), turn 1's the reply. With ``output_len`` None each request asks its reply's length and,
    as vLLM, a row is left out when its prompt or reply has under 4 tokens, its prompt over 1,024, or
    both over 2,048, counted as vLLM counts them (``tokenizer(text).input_ids``, a BOS included);
    with ``output_len`` every row is kept and asks it. ``prompt_len`` is counted as the server sees
    the prompt (templated on the chat endpoint, under the request fields ``options``).

    Raises:
        ValueError: a row without a ``conversations`` list or a turn without a ``value`` string
            (where vLLM stops with a KeyError), fewer usable rows than ``num_prompts``, an empty
            prompt of 0 tokens (with ``output_len``, which no pruning drops), or a prompt whose length
            and output exceed ``max_model_len``.
    """
    encode = prompt_encoder(counter, chat, options)
    out: list[SampleRequest] = []
    for row in shuffled(rows, seed, shuffle):
        conv = row.fields.get("conversations")
        if not isinstance(conv, list):
            raise ValueError(f'{row.where}: a conversation row needs a "conversations" list')
        if len(conv) < 2:
            continue
        prompt, reply = _turn(row, conv, 0), _turn(row, conv, 1)
        if output_len is None:
            raw = len(counter.encode(prompt))
            want = len(counter.encode(reply))
            if (
                raw < SHAREGPT_MIN_LEN
                or want < SHAREGPT_MIN_LEN
                or raw > SHAREGPT_MAX_PROMPT_LEN
                or raw + want > SHAREGPT_MAX_TOTAL_LEN
            ):
                continue
        else:
            want = output_len
        n = len(encode(prompt))
        _check_fits(row, n, want, max_model_len)
        out.append(SampleRequest(prompt, n, want))
        if len(out) == num_prompts:
            return out
    what = (
        "usable conversations (two turns or more, kept by vLLM's pruning of their lengths)"
        if output_len is None
        else "conversations of two turns or more"
    )
    if fewer_ok and out:  # vLLM's --no-oversample
        fewer_prompts_note(path, len(out), what, num_prompts)
        return out
    raise _too_many(path, len(out), what, num_prompts)


def hf_requests(
    counter: TokenCounter,
    path: str,
    hf_name: str | None,
    split: str | None,
    subset: str | None,
    num_prompts: int,
    output_len: int | None,
    seed: int,
    max_model_len: int | None = None,
    chat: bool = False,
    options: Mapping[str, Any] | None = None,
    skip_chat_template: bool = False,
    shuffle: bool = True,
    fewer_ok: bool = False,
) -> list[SampleRequest]:
    """vLLM's ``--dataset-name hf`` (``shuffle`` False: vLLM's ``--disable-shuffle``) for MT-Bench and ShareGPT-format conversations
    (:func:`hf_dataset_kind`), read from the local file or folder ``path`` (split ``split``, default
    :data:`DEFAULT_SPLIT`): :func:`mt_bench_requests` or :func:`conversation_requests`.

    Raises:
        ValueError: an unsupported dataset or subset, a hub id that is not a local path, unusable
            data, or too few usable rows (one line each).
    """
    kind = hf_dataset_kind(path, hf_name)
    check_local_path(path, hf_name)
    rows = load_hf_rows(path, split or DEFAULT_SPLIT, subset)
    if kind == "mt-bench":
        return mt_bench_requests(
            counter,
            rows,
            path,
            num_prompts,
            output_len,
            seed,
            max_model_len,
            chat,
            options,
            skip_chat_template,
            shuffle,
            fewer_ok,
        )
    return conversation_requests(
        counter, rows, path, num_prompts, output_len, seed, max_model_len, chat, options, shuffle, fewer_ok
    )
