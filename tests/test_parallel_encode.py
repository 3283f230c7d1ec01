"""surge.parallel_encode: a long text encoded in pieces gives exactly ``tokenizer.encode``'s ids."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, pre_tokenizers, processors
from transformers import PreTrainedTokenizerBase

from surge.parallel_encode import SAFE_SPLIT_PATTERNS, encode_text, split_points, split_safe
from surge.tokenizer import load_tokenizer
from tests.conftest import QWEN3_8B_DIR, STORIES, requires_qwen3_8b

LLAMA3_PATTERN = next(p for p in SAFE_SPLIT_PATTERNS if r"\p{N}{1,3}" in p)

pytestmark = requires_qwen3_8b


def qwen3() -> PreTrainedTokenizerBase:
    return load_tokenizer(QWEN3_8B_DIR)


def llama3_split(tok: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """``tok`` with Llama 3's pre-tokenizer (its regex: digits in runs of up to three), no normalizer."""
    backend = tok.backend_tokenizer
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return tok


# pieces chosen for the pre-tokenizer's corners: contractions, digits, punctuation runs, space and
# newline runs, letters of other scripts, combining marks (NFC), emoji, special tokens
FRAGMENTS = [
    "the",
    "The",
    " cat",
    "'s",
    "'LL",
    " don't",
    "123",
    "4567",
    " 89",
    "...",
    " (x)",
    "!?",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    " \n ",
    "é",
    "e\u0301",
    " \u0301",
    "\u0301a",
    "naïve",
    "中文",
    " 日本語",
    "Привет",
    "مرحبا",
    "😀",
    " 👍🏽",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "a",
    "Z",
    "-",
    "_x",
    "'",
    '"q"',
]

texts = st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=80).map("".join)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerBase:
    return qwen3()


@pytest.fixture(scope="module")
def llama_tok() -> PreTrainedTokenizerBase:
    """Llama 3's split regex, and a post-processor that adds a BOS as Llama 3's does."""
    tok = llama3_split(qwen3())
    bos = "<|endoftext|>"
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tok.convert_tokens_to_ids(bos))]
    )
    return tok


def test_the_qwen3_tokenizer_is_split_and_sentencepiece_is_not(tok: PreTrainedTokenizerBase) -> None:
    assert split_safe(tok)
    assert not split_safe(load_tokenizer(STORIES))  # SentencePiece (Llama 2 style): encoded whole


@SETTINGS
@given(text=texts, piece=st.sampled_from([1, 3, 17]), add=st.booleans())
def test_pieces_give_the_ids_of_one_encode(
    tok: PreTrainedTokenizerBase, text: str, piece: int, add: bool
) -> None:
    assert encode_text(tok, text, add, min_chars=1, piece_chars=piece) == list(
        tok.encode(text, add_special_tokens=add)
    )


@SETTINGS
@given(text=texts, piece=st.sampled_from([1, 5]), add=st.booleans())
def test_pieces_give_the_ids_of_one_encode_under_llama3s_pattern_and_bos(
    llama_tok: PreTrainedTokenizerBase, text: str, piece: int, add: bool
) -> None:
    assert split_safe(llama_tok)
    want = list(llama_tok.encode(text, add_special_tokens=add))
    assert (
        want[:1] == [llama_tok.convert_tokens_to_ids("<|endoftext|>")] or not add
    )  # one BOS, from the post-processor
    assert encode_text(llama_tok, text, add, min_chars=1, piece_chars=piece) == want


def test_a_long_random_chat_prompt_is_cut_into_pieces_and_keeps_its_ids(tok: PreTrainedTokenizerBase) -> None:
    rng = random.Random(0)
    body = tok.decode([rng.randrange(1000, 150000) for _ in range(4096)])
    text = tok.apply_chat_template(
        [{"role": "user", "content": body}], tokenize=False, add_generation_prompt=True
    )
    points = split_points(text)
    assert len(points) >= 8  # about 21,000 characters in pieces of 2,048: the parallel path runs
    for p in points[1:]:
        assert (
            text[p] == " " and not text[p - 1].isspace() and text[p + 1].isascii() and text[p + 1].isalpha()
        )
    assert encode_text(tok, text, False) == list(tok.encode(text, add_special_tokens=False))


def test_split_points_are_at_least_a_piece_apart() -> None:
    text = "word " * 1000
    points = split_points(text, 100)
    assert points[0] == 0 and all(b - a >= 100 for a, b in zip(points, points[1:], strict=False))
    assert split_points("no-split-point-here" * 10, 5) == [0]
    indented = ("        " * 4 + "{\n") * 300 + "end x"  # indentation: spaces before spaces or braces
    assert split_points(indented, 10) == [0, len(indented) - 2]
    assert split_points("1 " * 500, 10) == [0]  # a space before a digit is not a cut point


def test_an_added_token_that_strips_its_neighbours_keeps_the_text_whole() -> None:
    """An added token with rstrip eats the space after it, so cutting before that space would
    change the ids: such a tokenizer is never split (without the check, this test fails)."""
    tok = qwen3()
    tok.add_tokens([AddedToken("<tag>", rstrip=True, normalized=False)])
    assert not split_safe(tok)
    text = "<tag> hello there <tag> world"
    assert encode_text(tok, text, False, min_chars=1, piece_chars=1) == list(
        tok.encode(text, add_special_tokens=False)
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.add_tokens([AddedToken("two words", normalized=False)]),
        lambda t: setattr(t, "split_special_tokens", True),
        lambda t: t.backend_tokenizer.enable_truncation(16),
        lambda t: setattr(t.backend_tokenizer.model, "dropout", 0.1),
        lambda t: setattr(
            t.backend_tokenizer, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)
        ),
        lambda t: setattr(
            t.backend_tokenizer,
            "pre_tokenizer",
            pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(r"\w+|\s+"), behavior="isolated", invert=False),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            ),
        ),
    ],
    ids=[
        "added-token-with-a-space",
        "split-special-tokens",
        "truncation",
        "bpe-dropout",
        "byte-level-prefix-space",
        "other-regex",
    ],
)
def test_tokenizers_outside_the_proven_cases_are_encoded_whole(change) -> None:  # type: ignore[no-untyped-def]
    tok = qwen3()
    change(tok)
    assert not split_safe(tok)


@SETTINGS
@given(text=texts, add=st.booleans())
def test_a_short_text_of_a_proven_tokenizer_gets_the_ids_of_encode(
    tok: PreTrainedTokenizerBase, llama_tok: PreTrainedTokenizerBase, text: str, add: bool
) -> None:
    """Below ``min_chars``, ``splittable=True`` calls the Rust tokenizer directly: the same ids as
    the transformers wrapper, special tokens in the text and the post-processor's BOS included."""
    for t in (tok, llama_tok):
        assert encode_text(t, text, add, splittable=True) == list(t.encode(text, add_special_tokens=add))


def test_a_short_text_of_a_proven_tokenizer_skips_the_transformers_wrapper() -> None:
    """The server's short prompts do not go through ``tokenizer.encode`` (a fifth of their
    encode's cost); a tokenizer not proven by :func:`split_safe` still does."""
    tok = qwen3()
    rng = random.Random(1)
    samples = ["".join(rng.choices(FRAGMENTS, k=rng.randrange(1, 60))) for _ in range(200)]
    want = [(list(tok.encode(s, add_special_tokens=add)), s, add) for s in samples for add in (False, True)]

    def refuse(*args: object, **kwargs: object) -> list[int]:
        raise AssertionError("went through tokenizer.encode")

    tok.encode = refuse  # type: ignore[method-assign]
    for ids, s, add in want:
        assert encode_text(tok, s, add, splittable=True) == ids
    with pytest.raises(AssertionError, match="tokenizer.encode"):
        encode_text(tok, "hello", False, splittable=False)
    with pytest.raises(AssertionError, match="tokenizer.encode"):
        encode_text(tok, "hello", False)  # not proven by the caller: the wrapper


def test_a_tokenizer_class_with_its_own_encode_is_not_proven() -> None:
    tok = qwen3()

    class OwnEncode(type(tok)):  # type: ignore[misc]
        def _encode_plus(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
            return super()._encode_plus(*args, **kwargs)

    tok.__class__ = OwnEncode
    assert not split_safe(tok)
