"""direct_decoder: the Rust decode called directly gives exactly tokenizer.decode's text."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from surge.tokenizer import IncrementalDetokenizer, direct_decoder, load_tokenizer
from tests.conftest import QWEN3_8B_DIR, STORIES, qwen3_8b_dir_or_skip

MODELS = [STORIES, QWEN3_8B_DIR]


@pytest.mark.parametrize("model", MODELS, ids=lambda p: p.name)
def test_same_text_as_decode(model: Path) -> None:
    if model == QWEN3_8B_DIR:
        qwen3_8b_dir_or_skip()
    tok = load_tokenizer(model)
    rng = random.Random(0)
    vocab = len(tok)
    specials = list(tok.all_special_ids)
    for _ in range(2000):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(0, 8))]
        if specials and rng.random() < 0.3:
            ids.insert(rng.randint(0, len(ids)), rng.choice(specials))
        for skip in (True, False):
            for spaces in (True, False):
                want = tok.decode(ids, skip_special_tokens=skip, spaces_between_special_tokens=spaces)
                assert direct_decoder(tok, skip, spaces)(ids) == want, (ids, skip, spaces)


def test_a_tokenizer_with_clean_up_goes_through_decode() -> None:
    tok = load_tokenizer(MODELS[0])
    tok.clean_up_tokenization_spaces = True
    calls = []
    real = tok.decode
    tok.decode = lambda ids, **kw: calls.append(ids) or real(ids, **kw)  # type: ignore[method-assign]
    assert direct_decoder(tok, True)([1, 2, 3]) == real([1, 2, 3], skip_special_tokens=True)
    assert calls == [[1, 2, 3]]


def test_incremental_text_unchanged() -> None:
    tok = load_tokenizer(MODELS[0])
    text = "Once upon a time, there was a little girl named Lily. She liked to play outside!"
    ids = tok.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(tok, [1], stop=("girl named Li",), include_stop_str_in_output=True)
    out = "".join(d.update([t]) for t in ids) + d.flush()
    assert out == text[: text.index("girl named Li") + len("girl named Li")]
