"""Tokenizer loading, chat template and incremental detokenization (stories260K and Qwen3)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from surge.config import DEFAULT_MODEL_DIR  # noqa: E402
from surge.tokenizer import (  # noqa: E402
    IncrementalDetokenizer,
    InvalidModelConfigError,
    apply_chat_template,
    content_text,
    load_tokenizer,
)


@pytest.fixture(scope="module")
def stories():
    return load_tokenizer(DEFAULT_MODEL_DIR)


@pytest.fixture(scope="module")
def qwen(qwen3_8b_dir: Path):
    return load_tokenizer(qwen3_8b_dir)


def _stream(tok, prompt_ids, out_ids, *, stop=(), step=1, stop_token_id=None, skip=True):
    d = IncrementalDetokenizer(tok, prompt_ids, stop=stop, skip_special_tokens=skip)
    deltas = []
    for i in range(0, len(out_ids), step):
        chunk = out_ids[i : i + step]
        last = i + step >= len(out_ids)
        deltas.append(d.update(chunk, stop_token_id if last else None))
        if d.stop_matched is not None:
            break
    deltas.append(d.flush())
    return d, deltas


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "tokenizer.json").write_text("not json")
    with pytest.raises(ValueError, match="cannot load"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("head_dim", 7, r"validate_rope': ValueError: RoPE requires an even rotary dimension"),
        ("rms_norm_eps", "x", r"Validation error for field 'rms_norm_eps': TypeError: Field 'rms_norm_eps'"),
    ],
)
@pytest.mark.skipif(
    int(__import__("transformers").__version__.split(".")[0]) < 5,
    reason="transformers 4 does not check config.json fields when it loads a tokenizer",
)
def test_a_config_json_transformers_refuses_is_named_with_its_reason(
    tmp_path: Path, field: str, value: object, reason: str
) -> None:
    """transformers reads config.json when it loads the tokenizer: a field it refuses is blamed on
    config.json, with the reason (its message's second line; the error once ended at the colon
    of "Class validation error for validator 'validate_rope':" and blamed the tokenizer)."""
    import json
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(DEFAULT_MODEL_DIR, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg[field] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        InvalidModelConfigError, match=r"^model: '.*config\.json' is invalid: .*" + reason
    ) as e:
        load_tokenizer(folder)
    assert "\n" not in str(e.value)
    if field == "head_dim":  # the offline LLM says the same, also for a folder without tokenizer files
        from surge import LLM
        from surge.config import TOKENIZER_FILES

        for name in TOKENIZER_FILES:
            (folder / name).unlink(missing_ok=True)
        with pytest.raises(InvalidModelConfigError, match=r"config\.json' is invalid: .*" + reason):
            LLM(str(folder), device="cpu")


def test_error_reason_joins_lines_after_a_colon() -> None:
    from surge.tokenizer import error_reason

    assert error_reason(ValueError("a:\n  b\nc")) == "a: b"
    assert error_reason(ValueError("first\nsecond")) == "first"
    assert error_reason(KeyError()) == "KeyError"


def test_multibyte_never_replacement_char(stories):
    text = "é 日 😀 done"
    ids = stories.encode(text, add_special_tokens=False)
    assert any(t.startswith("<0x") for t in stories.convert_ids_to_tokens(ids))
    prompt = stories.encode("Once upon a time")
    d, deltas = _stream(stories, prompt, ids)
    assert all("\ufffd" not in x for x in deltas)
    assert (
        "".join(deltas)
        == d.text
        == stories.decode(prompt + ids, skip_special_tokens=True)[
            len(stories.decode(prompt, skip_special_tokens=True)) :
        ]
    )
    assert d.text.strip() == text


def test_split_char_at_end_is_flushed(stories):
    ids = stories.encode("a 😀", add_special_tokens=False)[:-2]  # cut inside the emoji
    d, deltas = _stream(stories, [1], ids)
    assert all("\ufffd" not in x for x in deltas[:-1])
    assert deltas[-1].endswith("\ufffd")
    assert "".join(deltas) == d.text


def test_stop_string_across_tokens_and_no_leak(stories):
    prompt = stories.encode("Hello")
    body = "Once upon a time, there was a little girl"
    ids = stories.encode(body, add_special_tokens=False)
    for stop in (("there was",), ("time, th",), ("e was a",), ("zzz", "a little")):
        for step in (1, 2, 3):
            d, deltas = _stream(stories, prompt, ids, stop=stop, step=step)
            assert d.stop_matched is not None
            expected = (" " + body)[: min((" " + body).find(s) for s in stop if s in body)]
            assert d.text == expected == "".join(deltas)
            joined = ""
            for x in deltas:
                joined += x
                for s in stop:
                    # no streamed prefix ends with a (partial) stop string beyond the final text
                    assert s not in joined
            assert d.update(ids[:2]) == ""
            assert d.flush() == ""


def test_stop_prefix_released_at_end(stories):
    ids = stories.encode("Once upon a ti", add_special_tokens=False)
    d, deltas = _stream(stories, [1], ids, stop=("a time",))
    assert d.stop_matched is None
    assert deltas[-1].endswith("a ti")  # held back until flush
    assert "".join(deltas) == d.text == stories.decode(ids)


def test_stop_token_id_excluded(stories, qwen):
    ids = stories.encode("Once upon a time", add_special_tokens=False) + [2]
    d, deltas = _stream(stories, [1], ids, stop_token_id=2, skip=False)
    assert "</s>" not in d.text and d.text.endswith("time")
    assert d.num_output_tokens == len(ids)
    # a non-special stop token id is excluded too
    q_ids = qwen.encode("Hello world. Bye", add_special_tokens=False)
    d, _ = _stream(qwen, [], q_ids, stop_token_id=q_ids[-1])
    assert d.text == qwen.decode(q_ids[:-1])


@pytest.mark.parametrize("step", [1, 3, 7])
def test_random_tokens_equal_full_decode(stories, qwen, step):
    rng = random.Random(step)
    for tok in (stories, qwen):
        vocab = min(tok.vocab_size, 20000)
        specials = set(tok.all_special_ids)
        # tokens that are whole characters alone (random byte tokens make invalid UTF-8)
        whole = [t for t in range(vocab) if t not in specials and "\ufffd" not in tok.decode([t])]
        pieces = tok.encode(" é日本😀🎉 語", add_special_tokens=False)
        for _ in range(10):
            prompt = tok.encode("The cat")
            out = [rng.choice(whole) for _ in range(30)]
            out[rng.randrange(30) :] = pieces + out[rng.randrange(30) :]
            d, deltas = _stream(tok, prompt, out, step=step)
            full = tok.decode(prompt + out, skip_special_tokens=True)
            assert "".join(deltas) == d.text
            assert full == tok.decode(prompt, skip_special_tokens=True) + d.text


def test_qwen_multibyte_stream(qwen):
    text = "日本語のテキスト、😀 and émojis 🎉🎉"
    ids = qwen.encode(text, add_special_tokens=False)
    prompt = apply_chat_template(qwen, [{"role": "user", "content": "hi"}])
    d, deltas = _stream(qwen, prompt, ids + [qwen.eos_token_id], stop_token_id=qwen.eos_token_id)
    assert all("\ufffd" not in x for x in deltas)
    assert "".join(deltas) == d.text == text


def test_chat_template_qwen(qwen):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    ids = apply_chat_template(qwen, msgs, chat_template_kwargs={"enable_thinking": False})
    text = qwen.decode(ids)
    assert text.startswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert "<think>\n\n</think>" in text
    no_gen = qwen.decode(apply_chat_template(qwen, msgs, add_generation_prompt=False))
    assert not no_gen.rstrip().endswith("assistant")
    custom = apply_chat_template(
        qwen, msgs, chat_template="{% for m in messages %}[{{ m.content }}]{% endfor %}"
    )
    assert qwen.decode(custom) == "[hi]"


def test_chat_template_fallback_and_errors(stories, qwen):
    ids = apply_chat_template(stories, [{"role": "user", "content": "Once upon"}])
    assert ids[0] == stories.bos_token_id
    assert stories.decode(ids, skip_special_tokens=True) == "user: Once upon\nassistant:"
    with pytest.raises(ValueError, match="empty"):
        apply_chat_template(stories, [])
    with pytest.raises(ValueError, match=r"only text content parts \(of type 'text', 'refusal'"):
        apply_chat_template(stories, [{"role": "user", "content": [{"type": "image_url"}]}])
    # the refused part, by its path and type
    two = [{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text", "text": "b"}, {}]}]
    with pytest.raises(ValueError, match=r"^messages\[1\]\.content\[1\] has no 'type': only text"):
        apply_chat_template(stories, two)
    two[1]["content"] = [{"type": "input_audio"}]
    with pytest.raises(ValueError, match=r"^messages\[1\]\.content\[0\] has type 'input_audio': only"):
        apply_chat_template(stories, two)
    two[1]["content"] = ["b"]
    with pytest.raises(ValueError, match=r"^messages\[1\]\.content\[0\] is not an object: only"):
        apply_chat_template(stories, two)
    with pytest.raises(ValueError, match="needs a string 'text'"):
        apply_chat_template(stories, [{"role": "user", "content": [{"type": "text", "text": None}]}])
    with pytest.raises(ValueError, match="type 'refusal' needs a string 'refusal'"):
        apply_chat_template(stories, [{"role": "assistant", "content": [{"type": "refusal", "text": "no"}]}])
    # vLLM's text-like parts: an OpenAI refusal, the Responses API's input/output text, thinking
    parts = [
        {"type": "refusal", "refusal": "I can't."},
        {"type": "output_text", "text": "Ask"},
        {"type": "input_text", "text": "me"},
        {"type": "thinking", "thinking": "later"},
    ]
    assert content_text(parts) == "I can't.\nAsk\nme\nlater"
    replayed = [{"role": "user", "content": "x"}, {"role": "assistant", "content": parts[:1]}]
    plain = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "I can't."}]
    assert apply_chat_template(qwen, replayed) == apply_chat_template(qwen, plain)
    with pytest.raises(ValueError, match="role"):
        apply_chat_template(stories, [{"content": "x"}])
    with pytest.raises(ValueError, match="must not set"):
        apply_chat_template(qwen, [{"role": "user", "content": "x"}], chat_template_kwargs={"tokenize": True})
    with pytest.raises(ValueError, match="chat template error"):
        apply_chat_template(
            qwen, [{"role": "user", "content": "x"}], chat_template="{{ raise_exception('no') }}"
        )


def test_stop_strings_wait_for_min_tokens() -> None:
    """Like vLLM, a stop string in the first ``min_tokens`` tokens does not end the request."""
    from surge.tokenizer import IncrementalDetokenizer, load_tokenizer
    from tests.conftest import STORIES

    tok = load_tokenizer(STORIES)
    prompt = tok("Once upon a time").input_ids
    ids = tok(", there was a little girl. Lily was happy.", add_special_tokens=False).input_ids
    early = IncrementalDetokenizer(tok, prompt, stop=("there",))
    early_text = "".join(early.update([t]) for t in ids) + early.flush()
    assert early.stop_matched == "there"
    assert "there" not in early_text
    late = IncrementalDetokenizer(tok, prompt, stop=("there", "Lily"), min_tokens=4)
    late_text = "".join(late.update([t]) for t in ids) + late.flush()
    assert late.stop_matched == "Lily"
    assert "there" in late_text and "Lily" not in late_text


def test_bad_words_token_ids(stories, qwen) -> None:
    from surge.tokenizer import bad_words_token_ids

    # Qwen3: "Lily" is "L" "ily" at the start of a text and one token after a space; both kept
    # (vLLM would drop the second for having fewer tokens).
    plain, spaced = (tuple(qwen.encode(t, add_special_tokens=False)) for t in ("Lily", " Lily"))
    assert len(plain) == 2 and len(spaced) == 1
    assert bad_words_token_ids(qwen, ["Lily", "  Lily"]) == (plain, spaced)
    two = bad_words_token_ids(qwen, ["bad word"])
    assert len(two) == 2 and all(len(w) == 2 for w in two) and two[0][1] == two[1][1]
    # stories260K (sentencepiece): one token at the start; after a space a lone "▁" comes first
    lily = bad_words_token_ids(stories, ["Lily"])
    assert len(lily) == 2 and len(lily[0]) == 1 and lily[1][-1] == lily[0][0]
    for empty in ("", "   "):
        with pytest.raises(ValueError, match="bad_words"):
            bad_words_token_ids(stories, ["ok", empty])


@pytest.mark.parametrize("skip", [True, False])
def test_special_token_runs_keep_the_window_small(stories, qwen, skip) -> None:
    """A run of special tokens (EOS after a finished grammar, with ignore_eos) gives the same
    text as one full decode, and, when they are skipped, never enters the decode window
    (it used to grow with the run: a quadratic decode per request)."""
    rng = random.Random(3)
    for tok in (stories, qwen):
        specials = sorted(set(tok.all_special_ids))
        text_ids = tok.encode('Once upon a time, a café. {"a": 1}', add_special_tokens=False)
        ids = []
        for t in text_ids:
            ids.append(t)
            ids += [rng.choice(specials) for _ in range(rng.randrange(3))]
        ids += [specials[0]] * 600
        d, deltas = _stream(tok, [], ids, skip=skip)
        assert "".join(deltas) == d.text == tok.decode(ids, skip_special_tokens=skip)
        if skip:
            assert len(d._ids) <= len(text_ids) + 1


def _vllm_stop(
    pieces: list[str], chunks: list[int], stop: str, min_tokens: int, include: bool
) -> tuple[str, str | None]:
    """vLLM v1's stop-string rule (``BaseIncrementalDetokenizer.update`` + ``check_stop_strings``),
    for one stop string, over per-token texts delivered in ``chunks`` (tokens per update call)."""
    text, n, i = "", 0, 0
    for size in chunks:
        check_from = len(text)
        for piece in pieces[i : i + size]:
            text, n = text + piece, n + 1
            if n <= min_tokens:  # text of the first min_tokens tokens: no match may end in it
                check_from = len(text)
        i += size
        if n > min_tokens and len(text) > check_from:
            at = text.find(stop, max(0, check_from - len(stop) + 1))  # looks back len(stop) - 1
            if at >= 0:
                return text[: at + len(stop)] if include else text[:at], stop
    return text, None


@pytest.fixture(scope="module")
def girl(stories) -> tuple[list[int], list[int], list[str]]:
    """Prompt ids, output ids and each output token's text of ', there was a little girl.'."""
    ids = stories.encode("Once upon a time, there was a little girl.", add_special_tokens=False)
    prompt, out = [stories.bos_token_id, *ids[:4]], ids[4:]
    d = IncrementalDetokenizer(stories, prompt)
    pieces = [d.update([t]) for t in out]
    assert pieces == [",", " there", " was", " a", " little", " g", "ir", "l", "."]
    return prompt, out, pieces


def _run_min_tokens(stories, girl, stop: str, min_tokens: int, include: bool, chunks: list[int]):
    prompt, out, _ = girl
    d = IncrementalDetokenizer(
        stories, prompt, stop=(stop,), min_tokens=min_tokens, include_stop_str_in_output=include
    )
    deltas, i = [], 0
    for size in chunks:
        deltas.append(d.update(out[i : i + size]))
        i += size
        if d.stop_matched is not None:
            break
    deltas.append(d.flush())
    assert "".join(deltas) == d.text
    return d.text, d.stop_matched


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_straddling_min_tokens(stories, girl, include) -> None:
    """Like vLLM, once more than ``min_tokens`` tokens exist a stop string may start inside the
    first ``min_tokens`` tokens' text, provided it ends after it; one ending inside it never counts."""
    ones = [1] * 9
    # "little gi" starts in token 5 (" little"), ends in token 7 ("ir"): the 6th is the last gated
    cut = ", there was a little gi" if include else ", there was a "
    assert _run_min_tokens(stories, girl, "little gi", 6, include, ones) == (cut, "little gi")
    # "gi": the 6th token's text ends in "g", the 7th starts with "i"
    cut = ", there was a little gi" if include else ", there was a little "
    assert _run_min_tokens(stories, girl, "gi", 6, include, ones) == (cut, "gi")
    # " g" is the 6th token's whole text: inside the first min_tokens tokens, never matched
    assert _run_min_tokens(stories, girl, " g", 6, include, ones) == (", there was a little girl.", None)
    # a chunk that crosses the boundary: its gated part's text cannot hold a whole match
    assert _run_min_tokens(stories, girl, " g", 6, include, [4, 3, 2]) == (", there was a little girl.", None)
    assert _run_min_tokens(stories, girl, " gi", 6, include, [4, 3, 2])[1] == " gi"


@pytest.mark.parametrize("include", [False, True])
def test_min_tokens_stop_strings_equal_vllm(stories, girl, include) -> None:
    """Every substring of the output as the stop string, every ``min_tokens`` and several ways to
    chunk the tokens: the text and the match equal vLLM's."""
    _, _, pieces = girl
    text = "".join(pieces)
    stops = sorted({text[a:b] for a in range(len(text)) for b in range(a + 1, min(a + 12, len(text)) + 1)})
    for chunks in ([1] * 9, [2, 2, 2, 2, 1], [3, 3, 3], [5, 4], [9]):
        for min_tokens in range(10):
            for stop in stops:
                got = _run_min_tokens(stories, girl, stop, min_tokens, include, chunks)
                want = _vllm_stop(pieces, chunks, stop, min_tokens, include)
                assert got == want, (stop, min_tokens, chunks)


def test_min_tokens_stop_token_id(stories, girl) -> None:
    """The EOS / stop token that ends a request after ``min_tokens`` tokens stays out of the
    text (in it with include_stop_str_in_output), and a chunk that crosses the boundary and
    ends with it is split without losing it."""
    prompt, out, _ = girl
    eos = stories.eos_token_id
    for include in (False, True):
        d = IncrementalDetokenizer(
            stories, prompt, stop=("xyz",), min_tokens=6, include_stop_str_in_output=include
        )
        text = d.update(out[:5]) + d.update([*out[5:], eos], stop_token_id=eos) + d.flush()
        assert text == d.text == ", there was a little girl." and d.stop_matched is None
        assert d.num_output_tokens == len(out) + 1
        d = IncrementalDetokenizer(
            stories, prompt, stop=("gi",), min_tokens=6, include_stop_str_in_output=include
        )
        text = d.update(out[:5]) + d.update([*out[5:], eos], stop_token_id=eos) + d.flush()
        assert d.stop_matched == "gi" and text == d.text == (
            ", there was a little gi" if include else ", there was a little "
        )


@pytest.mark.parametrize("include", [False, True])
def test_min_tokens_stop_strings_with_a_split_character_equal_vllm(stories, include) -> None:
    """Output ' ab 日 cd', whose 日 is three byte tokens: a chunk of tokens ending inside it held
    back all its text, and the text of tokens inside the first ``min_tokens`` then reached the
    matcher after the boundary ("ab" matched with min_tokens 4). Every chunking and
    ``min_tokens`` equals vLLM's per-token rule."""
    prompt = [stories.bos_token_id, *stories.encode("Once upon a time", add_special_tokens=False)]
    out = stories.encode("ab 日 cd", add_special_tokens=False)
    d = IncrementalDetokenizer(stories, prompt)
    pieces = [d.update([t]) for t in out]
    assert d.flush() == "" and "".join(pieces) == " ab 日 cd" and pieces[3:6] == ["", "", "日"]
    girl = (prompt, out, pieces)
    for chunks in ([8], [4, 4], [3, 5], [1] * 8, [2, 3, 3]):
        for min_tokens in range(9):
            for stop in ("ab", "b ", " 日", "日 c", "cd", "ab 日"):
                got = _run_min_tokens(stories, girl, stop, min_tokens, include, chunks)
                assert got == _vllm_stop(pieces, chunks, stop, min_tokens, include), (
                    stop,
                    min_tokens,
                    chunks,
                )


def test_developer_role_is_system_for_templates_that_do_not_know_it(qwen):
    """OpenAI's ``developer`` role (its newer name for system instructions) reaches the prompt:
    Qwen3's template renders only system/user/assistant/tool roles and would drop it, so it is
    rendered as ``system``; a template that names the role gets it unchanged."""
    msgs = [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "hi"}]
    text = qwen.decode(apply_chat_template(qwen, msgs, chat_template_kwargs={"enable_thinking": False}))
    assert text.startswith("<|im_start|>system\nAnswer in French.<|im_end|>\n<|im_start|>user\nhi<|im_end|>")
    own = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{# developer #}"
    assert (
        qwen.decode(apply_chat_template(qwen, msgs, chat_template=own))
        == "developer:Answer in French.;user:hi;"
    )
    plain = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
    assert (
        qwen.decode(apply_chat_template(qwen, msgs, chat_template=plain))
        == "system:Answer in French.;user:hi;"
    )


def test_reasoning_in_the_history_reaches_the_template_under_both_names(qwen):
    """An assistant message's reasoning, sent back as ``reasoning`` (vLLM's name, what its
    responses carry) or ``reasoning_content`` (the older name), reaches the template under both
    names, as vLLM passes it: Qwen3's template reads ``reasoning_content`` and renders it inside
    ``<think>`` for a turn after the last user message; another template may read ``reasoning``.
    A null one (an SDK message object dumped with its unset fields) is no reasoning."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    both = "{% for m in messages %}{{ m.role }}:{{ m.reasoning }}|{{ m.reasoning_content }};{% endfor %}"
    for key in ("reasoning", "reasoning_content"):
        msgs = [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [call], key: "Call f."},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]
        text = qwen.decode(apply_chat_template(qwen, msgs))
        assert "<|im_start|>assistant\n<think>\nCall f.\n</think>\n\n<tool_call>" in text, text
        rendered = qwen.decode(apply_chat_template(qwen, msgs, chat_template=both))
        assert rendered.split(";")[1] == "assistant:Call f.|Call f.", rendered
    nulls = [{"role": "user", "content": "hi", "reasoning": None, "reasoning_content": None}]
    assert qwen.decode(apply_chat_template(qwen, nulls, chat_template=both)) == "user:|;"


def test_a_tokenizer_that_encodes_text_to_nothing_is_refused(tmp_path: Path) -> None:
    """Vocabulary files that load as a tokenizer dropping every text (an empty BPE vocabulary)
    are refused at load: prompts would reach the model as their special tokens alone."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab={"<s>": 0}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="encodes text to no tokens: its vocabulary files are incomplete"):
        load_tokenizer(tmp_path)


def _byte_token(tok, byte: int) -> int:
    """The token of one byte in a byte-level BPE vocabulary (GPT-2's byte-to-symbol map)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    symbol = (
        chr(byte) if byte in printable else chr(256 + sorted(set(range(256)) - set(printable)).index(byte))
    )
    return tok.convert_tokens_to_ids(symbol)


@pytest.mark.parametrize("step", [1, 2, 5])
def test_byte_tokens_that_never_complete_equal_full_decode(qwen, step):
    """Random runs of byte tokens (lone continuation bytes, cut and whole multi-byte characters,
    ASCII) stream to the text the whole output decodes to, whatever is held and released."""
    rng = random.Random(step)
    alphabet = [_byte_token(qwen, b) for b in (0x80, 0xBD, 0xA0, 0xE4, 0xF0, 0x9F, 0x98, 0x41)]
    emoji = qwen.encode("😀你", add_special_tokens=False)
    for _ in range(40):
        out = [rng.choice(alphabet) for _ in range(rng.randrange(1, 40))]
        cut = rng.randrange(len(out) + 1)
        out[cut:cut] = emoji
        d, deltas = _stream(qwen, [], out, step=step)
        assert "".join(deltas) == d.text == qwen.decode(out)


def test_bytes_that_never_form_a_character_are_not_decoded_at_every_token(qwen, monkeypatch):
    """Lone UTF-8 continuation bytes never complete a character, so the window of held tokens
    grows with the output: it is decoded again only once it has grown by half, so the tokens
    decoded over the output stay linear in its length. Decoding it at every token was quadratic
    (8,000 such tokens cost 4 s of the API process's CPU); its text is the same."""
    cont = _byte_token(qwen, 0x80)
    assert qwen.decode([cont]) == "\ufffd"
    d = IncrementalDetokenizer(qwen, [])
    decode = d._decode
    decoded: list[int] = []
    monkeypatch.setattr(d, "_decode", lambda ids: decoded.append(len(ids)) or decode(ids))
    text = "".join(d.update([cont]) for _ in range(2000))
    text += d.update(qwen.encode(" ok", add_special_tokens=False)) + d.flush()
    assert text == "\ufffd" * 2000 + " ok"
    assert sum(decoded) < 10 * 2000  # held at every token: 2000 * 2000


def test_text_of_the_first_min_tokens_ends_no_stop_string_when_held_bytes_come_before_it(qwen):
    """Text completed within the first ``min_tokens`` tokens ends no stop string. Behind nine lone
    continuation bytes (a held window decoded again only once it has grown by half) the "a" of
    token 10 was released only at the flush, past ``min_tokens``, and matched the stop "a"."""
    cont = _byte_token(qwen, 0x80)
    out = [cont] * 9 + qwen.encode("a", add_special_tokens=False) + [cont] * 20
    d = IncrementalDetokenizer(qwen, [], stop=("a",), min_tokens=12)
    text = "".join(d.update([t]) for t in out) + d.flush()
    assert d.stop_matched is None
    assert text == qwen.decode(out)
