"""Random prompts of exact token counts (local tokenizers), ShareGPT loading, token-counter choice."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import BUNDLED_MODEL, QWEN3_8B, SHAREGPT, bench_main
from fake_server import Behaviour, FakeServer

from surge.bench.datasets import (
    load_sharegpt,
    random_requests,
    range_bounds,
    sharegpt_requests,
    special_tokens_added,
)
from surge.bench.tokens import HFTokenCounter, ServerTokenCounter, resolve_counter


@pytest.fixture(scope="module")
def stories() -> HFTokenCounter:
    return HFTokenCounter(str(BUNDLED_MODEL))


@pytest.fixture(scope="module")
def qwen() -> HFTokenCounter:
    return HFTokenCounter(str(QWEN3_8B))


@pytest.mark.parametrize("n", [1, 2, 7, 32, 256, 1000])
def test_exact_lengths_stories(stories: HFTokenCounter, n: int) -> None:
    reqs = random_requests(stories, 3, n, 5, seed=0)
    for r in reqs:
        assert len(stories.encode(r.prompt)) == n == r.prompt_len  # BOS included, as the server counts
        assert r.expected_output_len == 5


@pytest.mark.parametrize("n", [1, 32, 256, 4096])
def test_exact_lengths_qwen3(qwen: HFTokenCounter, n: int) -> None:
    for r in random_requests(qwen, 2, n, 5, seed=3):
        assert len(qwen.encode(r.prompt)) == n


def test_seeded_and_special_free(stories: HFTokenCounter, qwen: HFTokenCounter) -> None:
    a = [r.prompt for r in random_requests(stories, 3, 40, 5, seed=7)]
    b = [r.prompt for r in random_requests(stories, 3, 40, 5, seed=7)]
    c = [r.prompt for r in random_requests(stories, 3, 40, 5, seed=8)]
    assert a == b and a != c and len(set(a)) == 3
    pool = set(qwen.candidate_ids().tolist())
    assert not pool & set(qwen.tok.all_special_ids)
    assert 151643 not in pool and 151645 not in pool and 9707 in pool
    assert not set(stories.candidate_ids().tolist()) & {0, 1, 2, 3, 100}  # specials and <0x..> bytes


NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def test_extra_body_chat_template_of_parts_counted_as_the_server_renders_it(stories: HFTokenCounter) -> None:
    """A ``chat_template`` of ``--extra-body`` that loops over content parts: the server's default
    ``--chat-template-content-format auto`` passes it parts, so the count is of the text in it
    (passed as a string, the loop ran over characters and wrote none of the text)."""
    template = (
        "{% for m in messages %}{% for part in m['content'] %}[{{ part['text'] }}]{% endfor %}{% endfor %}"
    )
    ids = stories.encode_chat("Once upon a time", {"chat_template": template})
    assert stories.tok.decode(ids) == "[Once upon a time]"


def test_chat_template_kwargs_of_extra_body_are_counted_qwen3(qwen: HFTokenCounter) -> None:
    """Qwen3 with ``--extra-body '{"chat_template_kwargs": {"enable_thinking": false}}'``: the
    template adds an empty think block (4 tokens); the prompts the benchmark builds have exactly
    ``--input-len`` tokens as the server renders them with those kwargs (the user trial got 104
    for 100). Tokenizer only: Surge's own template code, as the server runs it."""
    from surge.bench.serve import ServeConfig, build_samples
    from surge.bench.tokens import prompt_options
    from surge.tokenizer import apply_chat_template

    def server_count(text: str, kwargs: dict[str, bool] | None) -> int:
        messages = [{"role": "user", "content": text}]
        return len(apply_chat_template(qwen.tok, messages, chat_template_kwargs=kwargs))

    options = prompt_options({**NO_THINK, "top_k": 1}, chat=True)
    assert options == NO_THINK  # only the fields that change the prompt
    # reasoning_effort "none" turns the thinking off as the server renders it (vLLM's mapping)
    none = prompt_options({"reasoning_effort": "none"}, chat=True)
    assert none["chat_template_kwargs"] == {"reasoning_effort": "none", "enable_thinking": False}
    assert len(qwen.encode_chat("x", none)) == len(qwen.encode_chat("x", options))
    assert prompt_options({"reasoning_effort": "low"} | NO_THINK, chat=True)["chat_template_kwargs"] == {
        "reasoning_effort": "low",
        "enable_thinking": False,  # the request's own chat_template_kwargs win
    }
    assert len(qwen.encode_chat("x", options)) == len(qwen.encode_chat("x")) + 4
    for r in random_requests(qwen, 3, 100, 5, seed=0, chat=True, options=options):
        assert server_count(r.prompt, {"enable_thinking": False}) == 100 == r.prompt_len
    # the path bench serve takes: ServeConfig.extra_body -> build_samples
    cfg = ServeConfig(input_len=100, num_prompts=2, extra_body={**NO_THINK, "top_k": 1})
    for r in build_samples(cfg, qwen, None):
        assert server_count(r.prompt, {"enable_thinking": False}) == 100
    # thinking on (the template's default) is counted as before
    for r in random_requests(qwen, 2, 100, 5, seed=0, chat=True):
        assert server_count(r.prompt, None) == 100
    # ShareGPT prompts are counted with the kwargs too
    for r in sharegpt_requests(qwen, str(SHAREGPT), 3, 16, seed=1, chat=True, options=options):
        assert server_count(r.prompt, {"enable_thinking": False}) == r.prompt_len


def test_add_special_tokens_of_extra_body_is_counted(stories: HFTokenCounter) -> None:
    """Completions with ``add_special_tokens: false``: no BOS, so the text itself has the length."""
    from surge.bench.tokens import prompt_options

    options = prompt_options({"add_special_tokens": False}, chat=False)
    for r in random_requests(stories, 2, 32, 5, seed=0, options=options):
        assert len(stories.encode(r.prompt, add_special_tokens=False)) == 32
        assert len(stories.encode(r.prompt)) == 33


def test_prompt_options_refuse_wrong_types() -> None:
    from surge.bench.serve import ServeConfig
    from surge.bench.tokens import prompt_options

    assert prompt_options(None, True) == {} and prompt_options({"chat_template_kwargs": None}, True) == {}
    assert prompt_options(NO_THINK, chat=False) == {}  # the completions prompt has no template
    with pytest.raises(ValueError, match="'chat_template_kwargs' must be an object, got"):
        prompt_options({"chat_template_kwargs": "enable_thinking=false"}, True)
    with pytest.raises(ValueError, match="'add_special_tokens' must be true or false"):
        ServeConfig(extra_body={"add_special_tokens": "no"}).validate()


def test_below_minimum_is_an_error(stories: HFTokenCounter) -> None:
    with pytest.raises(ValueError):
        random_requests(stories, 1, 0, 5, seed=0)


def test_server_counter_through_tokenize() -> None:
    with FakeServer(Behaviour()) as s:
        counter = resolve_counter(s.url, "fake-model", None, None)
        assert isinstance(counter, ServerTokenCounter)
        assert counter.encode("") == [1] and 1 not in set(counter.candidate_ids().tolist())
        reqs = random_requests(counter, 2, 17, 4, seed=0)
        assert all(len(counter.encode(r.prompt)) == 17 for r in reqs)
        assert counter.max_model_len == 4096
        # a local folder supplies the vocabulary while the server still counts
        counter2 = resolve_counter(s.url, "fake-model", None, str(BUNDLED_MODEL))
        assert isinstance(counter2, ServerTokenCounter) and len(counter2.candidate_ids()) == 253
        # --tokenizer wins
        assert isinstance(resolve_counter(s.url, "fake-model", str(BUNDLED_MODEL), None), HFTokenCounter)


def test_no_way_to_count() -> None:
    from fake_server import free_port

    with pytest.raises(ValueError, match="--tokenizer"):
        resolve_counter(f"http://127.0.0.1:{free_port()}", "m", None, None)
    with pytest.raises(ValueError):
        resolve_counter("http://127.0.0.1:1", "m", "/nonexistent/dir", None)


def test_a_tokenizer_folder_without_tokenizer_files_is_one_line(tmp_path: Path) -> None:
    """`--tokenizer` pointing at a folder without tokenizer files (a weights-only copy) printed
    transformers' five-line error after `surge: error:`; it is one line naming the files now, and a
    folder whose tokenizer does not load gives its error's first line only."""
    with pytest.raises(
        ValueError, match=r"^--tokenizer \S+: the folder has no tokenizer files \(tokenizer\.json"
    ):
        resolve_counter("http://127.0.0.1:1", "m", str(tmp_path), None)
    (tmp_path / "tokenizer_config.json").write_text("{}")  # no vocabulary: still no tokenizer
    with pytest.raises(ValueError, match=r"^--tokenizer \S+: the folder has no tokenizer files"):
        resolve_counter("http://127.0.0.1:1", "m", str(tmp_path), None)
    (tmp_path / "vocab.json").write_text("{}")  # a vocabulary without its merges.txt
    with pytest.raises(ValueError, match=r"^cannot load a tokenizer from ") as e:
        resolve_counter("http://127.0.0.1:1", "m", str(tmp_path), None)
    assert "\n" not in str(e.value), str(e.value)


def test_sharegpt(stories: HFTokenCounter, tmp_path: Path) -> None:
    conversations = load_sharegpt(str(SHAREGPT))
    assert len(conversations) == 500 and conversations[0].prompt.startswith("How to stop automatic updates")
    assert all(c.reply is None for c in conversations)  # the bundled files keep only the prompts
    reqs = sharegpt_requests(stories, str(SHAREGPT), 10, 64, seed=1, max_model_len=512)
    assert len(reqs) == 10 and len({r.prompt for r in reqs}) == 10
    for r in reqs:
        assert r.prompt_len == len(stories.encode(r.prompt)) and 4 <= r.prompt_len <= 512 - 64
        assert r.expected_output_len == 64
    assert [r.prompt for r in sharegpt_requests(stories, str(SHAREGPT), 10, 64, 1, 512)] == [
        r.prompt for r in reqs
    ]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "a list"}))
    for path in (str(bad), str(tmp_path / "missing.json")):
        with pytest.raises(ValueError):
            load_sharegpt(path)
    with pytest.raises(ValueError, match="usable prompts"):
        sharegpt_requests(stories, str(SHAREGPT), 10_000, 64, seed=1)


def test_sharegpt_reply_lengths_as_vllm(stories: HFTokenCounter, tmp_path: Path) -> None:
    """A conversation asks its reply's token count (BOS included, as vLLM counts it) and is pruned
    as vLLM prunes: under 4 tokens either side, a prompt over 1,024, both over 2,048, no reply.
    A fixed length overrides the reply and drops only the check on short outputs."""
    words = " ".join(["once upon a time there was a little dog"] * 40)  # 441 tokens
    rows = [
        ("tell me a short story about a cat", "the cat sat on the mat and then it slept all day"),
        ("hi", "a reply long enough to count here"),  # prompt under 4 tokens
        ("what is the capital of france today", "ok"),  # reply under 4 tokens (BOS + 2)
        (words * 4, "a reply of several tokens here"),  # prompt over 1,024 tokens
        (words, words * 4),  # prompt + reply over 2,048 tokens
        ("say something about the weather in spring", None),  # no reply: dropped
    ]
    data = [
        {
            "id": str(i),
            "conversations": [{"from": "human", "value": p}] + ([{"from": "gpt", "value": r}] if r else []),
        }
        for i, (p, r) in enumerate(rows)
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    reqs = sharegpt_requests(stories, str(path), 1, 64, seed=0)
    assert [(r.prompt, r.expected_output_len) for r in reqs] == [
        (rows[0][0], len(stories.encode(rows[0][1])))
    ]
    with pytest.raises(
        ValueError, match="only 1 usable prompts.*4 to 1024 tokens, at most 2048 with the output"
    ):
        sharegpt_requests(stories, str(path), 2, 64, seed=0)
    fixed = sharegpt_requests(stories, str(path), 3, 64, seed=0, fixed_output_len=7)
    assert {r.expected_output_len for r in fixed} == {7}
    assert {r.prompt for r in fixed} == {rows[0][0], rows[2][0], rows[4][0]}
    with pytest.raises(ValueError, match="only 2 usable prompts"):  # 441 + 7 over the context
        sharegpt_requests(stories, str(path), 3, 64, seed=0, max_model_len=300, fixed_output_len=7)


def test_sharegpt_prunes_on_vllms_count_on_the_chat_endpoint(qwen: HFTokenCounter, tmp_path: Path) -> None:
    """vLLM prunes a conversation on tokenizer(prompt).input_ids whatever the endpoint, so on the
    chat endpoint Surge keeps the same conversations: a prompt of 1 raw token (9 templated) is
    dropped as under 4 tokens, one of 1,020 raw tokens (1,028 templated) is kept as at most 1,024;
    the request's prompt_len stays the server's (templated) count."""
    long = "a" + " a" * 1019
    assert (len(qwen.encode("hi")), len(qwen.encode_chat("hi"))) == (1, 9)
    assert (len(qwen.encode(long)), len(qwen.encode_chat(long))) == (1020, 1028)
    data = [
        {
            "id": str(i),
            "conversations": [
                {"from": "human", "value": p},
                {"from": "gpt", "value": "a reply of some tokens"},
            ],
        }
        for i, p in enumerate(["hi", long, "tell me a short story about a cat"])
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    for chat in (False, True):
        reqs = sharegpt_requests(qwen, str(path), 2, 64, seed=0, chat=chat)
        assert sorted(r.prompt for r in reqs) == sorted([long, data[2]["conversations"][0]["value"]])
        count = qwen.encode_chat if chat else qwen.encode
        assert all(r.prompt_len == len(count(r.prompt)) for r in reqs)
    with pytest.raises(ValueError, match="only 2 usable prompts"):
        sharegpt_requests(qwen, str(path), 3, 64, seed=0, chat=True)
    with pytest.raises(ValueError, match="only 1 usable prompts"):  # 1,028 + 5 over the server's 1,030
        sharegpt_requests(qwen, str(path), 2, 64, seed=0, chat=True, max_model_len=1030)


def test_rng_is_numpy_default_rng(stories: HFTokenCounter) -> None:
    # the first draw of a prompt is default_rng(seed).choice(pool, n - overhead)
    pool = stories.candidate_ids()
    first = np.random.default_rng(11).choice(pool, size=4)
    text = random_requests(stories, 1, 5, 1, seed=11)[0].prompt
    assert text.split()[0] in stories.decode([int(i) for i in first])


def test_range_ratio_draws_lengths_in_vllms_bounds_each_prompt_exact(stories: HFTokenCounter) -> None:
    """``--random-range-ratio`` (vLLM's random dataset): per-request input and output lengths
    uniform in [floor(L (1 - r)), ceil(L (1 + r))], each prompt exactly its drawn length as the
    server counts it, the same draws for the same seed; r = 0 keeps the fixed-length prompts."""
    assert (
        range_bounds(100, 0.5) == (50, 150)
        and range_bounds(3, 0.9) == (1, 6)  # vLLM: floor(0.3) = 0 (raised to 1), ceil(5.7) = 6
        and range_bounds(256, 0.1) == (230, 282)  # was (230, 281): a mean 0.5 token under vLLM's 256
        and range_bounds(8, 0) == (8, 8)
    )
    reqs = random_requests(stories, 40, 100, 20, seed=5, range_ratio=0.5)
    ins = [r.prompt_len for r in reqs]
    outs = [r.expected_output_len for r in reqs]
    assert all(50 <= n <= 150 for n in ins) and all(10 <= n <= 30 for n in outs)
    assert len(set(ins)) > 10 and len(set(outs)) > 5  # not one length
    assert min(ins) < 75 and max(ins) > 125  # spread over the range, not bunched
    for r in reqs:
        assert len(stories.encode(r.prompt)) == r.prompt_len
    again = random_requests(stories, 40, 100, 20, seed=5, range_ratio=0.5)
    assert [(r.prompt, r.expected_output_len) for r in again] == [
        (r.prompt, r.expected_output_len) for r in reqs
    ]
    fixed = random_requests(stories, 3, 40, 5, seed=7)
    assert [r.prompt for r in random_requests(stories, 3, 40, 5, seed=7, range_ratio=0.0)] == [
        r.prompt for r in fixed
    ]
    for bad in (-0.1, 1.0, 2.0):
        with pytest.raises(ValueError, match="--random-range-ratio must be in"):
            random_requests(stories, 1, 40, 5, seed=0, range_ratio=bad)


def test_range_ratio_leaves_the_bos_unscaled_as_vllm(stories: HFTokenCounter, qwen: HFTokenCounter) -> None:
    """vLLM's get_sampling_params scales input_len - num_special_tokens_to_add() (the BOS), not
    input_len: at --input-len 7, ratio 0.3, a BOS tokenizer's prompts (the BOS counted, as the
    server counts it) are 1 + [floor(6 * 0.7), ceil(6 * 1.3)] = [5, 9] tokens, not [4, 10]; a
    tokenizer without a BOS (Qwen3) keeps [floor(L (1 - r)), ceil(L (1 + r))]."""
    assert special_tokens_added(stories) == 1 and special_tokens_added(qwen) == 0
    assert range_bounds(7, 0.3, 1) == (5, 9) and range_bounds(7, 0.3) == (4, 10)
    assert range_bounds(3, 0.9, 1) == (1, 5)  # vLLM: 1 + [floor(0.2), ceil(3.8)]
    assert range_bounds(1024, 0.5, 1) == (512, 1536)  # 1 + [511, 1535]
    lens = {r.prompt_len for r in random_requests(stories, 200, 7, 5, seed=0, range_ratio=0.3)}
    assert lens == {5, 6, 7, 8, 9}, lens
    outs = {r.expected_output_len for r in random_requests(stories, 200, 40, 7, seed=0, range_ratio=0.3)}
    assert min(outs) == 4 and max(outs) == 10  # output lengths have no BOS: [floor(4.9), ceil(9.1)]
    lens = {r.prompt_len for r in random_requests(qwen, 200, 7, 5, seed=0, range_ratio=0.3)}
    assert min(lens) == 4 and max(lens) == 10


def test_range_ratio_below_the_chat_template_minimum_names_the_option(qwen: HFTokenCounter) -> None:
    with pytest.raises(ValueError, match=r"--random-range-ratio 0\.9 drew input length"):
        random_requests(qwen, 20, 12, 5, seed=0, chat=True, range_ratio=0.9)


def test_a_dataset_path_that_is_not_a_regular_file_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--dataset sonnet --dataset-path /dev/null` said "no such file" though the path exists:
    every file dataset now says it is not a regular file, and what it is; an empty ShareGPT file
    says it is empty (it said "not JSON (Expecting value ...)")."""
    import os

    from surge.bench.datasets import load_burstgpt, load_custom, load_lines, load_sharegpt
    from surge.bench.hf_datasets import load_hf_rows
    from surge.bench.question_datasets import spec_bench_questions
    from surge.bench.timed_trace import TimedTraceOptions, read_timed_trace

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    loaders = (
        load_sharegpt,
        load_custom,
        load_lines,
        load_burstgpt,
        lambda p: spec_bench_questions(p, None),
        lambda p: list(read_timed_trace(p, TimedTraceOptions())),
        lambda p: load_hf_rows(p, "train"),
    )
    for path, kind in (("/dev/null", "a character device"), (str(fifo), "a named pipe")):
        for load in loaders:
            with pytest.raises(
                ValueError, match=f"--dataset-path {path}: not a regular file \\({kind}; give the"
            ):
                load(path)
    for load in loaders[:-1]:  # hf: a missing path is refused before, by check_local_path
        with pytest.raises(ValueError, match="no such file"):
            load(str(tmp_path / "nope"))
    empty = tmp_path / "empty.json"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="the file is empty"):
        load_sharegpt(str(empty))
    with FakeServer(Behaviour()) as s:  # the report's case, end to end: one line, rc 2
        argv = ["bench", "serve", "--base-url", s.url, "--disable-tqdm", "--dataset", "sonnet"]
        assert bench_main([*argv, "--dataset-path", "/dev/null", "--num-prompts", "2"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "surge: error: --dataset-path /dev/null: not a regular file (a character device; give the text file)\n"
    )
