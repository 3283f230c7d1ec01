"""vLLM's ``spec_bench`` dataset: the first turn of each question of an MT-Bench-style JSONL file.

A question file has one JSON object a line with a ``turns`` list (the user's turns, the first
is the prompt) and a ``category`` (Spec-Bench's ``data/spec_bench/question.jsonl``, FastChat's
MT-Bench and Vicuna-Bench ``question.jsonl``). vLLM 0.26's ``SpecBench`` keeps the questions of
``--spec-bench-category`` (all without it), shuffles them with Python's ``random`` seeded with 0
(its dispatch passes no ``--seed``), takes the first ``--num-prompts`` and renders each with the
chat template (always: its dispatch passes no ``--skip-chat-template``). See :func:`spec_bench_requests`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from surge.bench.datasets import SampleRequest, _read_text, fewer_prompts_note, prompt_encoder
from surge.bench.tokens import TokenCounter

SPEC_BENCH_SEED = 0
"""The seed vLLM's ``spec_bench`` shuffles with whatever ``--seed`` says (``BenchmarkDataset``'s default)."""


@dataclass(frozen=True)
class Question:
    """One question of a question file: its first turn, its category (None: none) and its line (1-based)."""

    prompt: str
    category: str | None
    line: int


def load_questions(path: str) -> list[Question]:
    """The questions of an MT-Bench-style JSONL file: one JSON object a line with a ``turns`` list
    whose first item (a non-empty string) is the prompt, and optionally a ``category`` string;
    blank lines are skipped, other keys ignored.

    Raises:
        ValueError: missing or unreadable file, a line that is not a JSON object, a line without
            ``turns`` or whose first turn is not a non-empty string, or no line at all (one line
            naming the file and line).
    """
    out: list[Question] = []
    for n, line in enumerate(_read_text(path, "question JSONL file").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"--dataset-path {path}: line {n}: not JSON ({e})") from None
        if not isinstance(item, dict):
            raise ValueError(f'--dataset-path {path}: line {n}: expected a JSON object with "turns"')
        turns = item.get("turns")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0]:
            got = 'no "turns"' if "turns" not in item else f'"turns" {json.dumps(turns)[:40]}'
            raise ValueError(
                f"--dataset-path {path}: line {n}: {got} (every line needs a list of turns whose first is "
                "a non-empty string)"
            )
        category = item.get("category")
        out.append(Question(turns[0], category if isinstance(category, str) else None, n))
    if not out:
        raise ValueError(
            f'--dataset-path {path}: no questions (expected one {{"turns": [...]}} object a line)'
        )
    return out


def spec_bench_questions(path: str, category: str | None = None) -> list[Question]:
    """The questions of the file ``path`` (:func:`load_questions`) of ``category`` (all when None or
    empty, as vLLM), in the file's order.

    Raises:
        ValueError: an unusable file or line, or no question of ``category`` (naming the file's
            categories).
    """
    questions = load_questions(path)
    if category:  # vLLM: an empty category keeps them all
        kept = [q for q in questions if q.category == category]
        if not kept:
            found = sorted({q.category for q in questions if q.category is not None})
            have = f"its categories: {', '.join(found)}" if found else 'no line has a "category"'
            raise ValueError(f"--spec-bench-category {category}: no question of it in {path} ({have})")
        questions = kept
    return questions


def spec_bench_requests(
    counter: TokenCounter,
    path: str,
    num_prompts: int,
    output_len: int,
    category: str | None = None,
    max_model_len: int | None = None,
    chat: bool = False,
    options: Mapping[str, Any] | None = None,
    shuffle: bool = True,
    fewer_ok: bool = False,
) -> list[SampleRequest]:
    """vLLM's ``spec_bench`` dataset: ``num_prompts`` first turns of the question file ``path``
    (:func:`load_questions`), each asking ``output_len`` tokens.

    As vLLM 0.26: the questions of ``category`` (all when None), shuffled by
    ``random.Random(SPEC_BENCH_SEED).shuffle`` (vLLM seeds Python's ``random`` with 0, not with
    ``--seed``), the first ``num_prompts`` of them; on /v1/completions each prompt is sent rendered
    with the model's chat template (the user message and the generation prompt). On the chat
    endpoint the prompt is the user message and the server applies the template (vLLM's client
    sends the rendered text as the message, templating it twice). Lengths are counted as the
    server sees the prompt (under the request fields ``options``).

    Raises:
        ValueError: an unusable file or line, no question of ``category``, fewer questions than
            ``num_prompts`` (vLLM would send some twice), or a prompt whose length and output
            exceed ``max_model_len``.
    """
    if num_prompts < 1 or output_len < 1:
        raise ValueError("--num-prompts and --spec-bench-output-len must be >= 1")
    questions = spec_bench_questions(path, category)
    which = f" of category {category}" if category else ""
    if fewer_ok and len(questions) < num_prompts:  # vLLM's --no-oversample
        fewer_prompts_note(path, len(questions), f"questions{which}", num_prompts)
        num_prompts = len(questions)
    if len(questions) < num_prompts:
        raise ValueError(
            f"{path} has {len(questions)} questions{which}, --num-prompts {num_prompts} asked (vLLM would "
            f"send some twice; give --num-prompts {len(questions)} or fewer)"
        )
    if shuffle:  # False: vLLM's --disable-shuffle, the file's order
        random.Random(SPEC_BENCH_SEED).shuffle(questions)
    encode = prompt_encoder(counter, chat, options)
    out: list[SampleRequest] = []
    for q in questions[:num_prompts]:
        text = q.prompt if chat else counter.render_chat(q.prompt)
        n = len(encode(text))
        if max_model_len is not None and n + output_len > max_model_len:
            raise ValueError(
                f"{path} line {q.line}: a prompt of {n} tokens and {output_len} output tokens exceed the "
                f"server's max_model_len {max_model_len}"
            )
        out.append(SampleRequest(text, n, output_len))
    return out
