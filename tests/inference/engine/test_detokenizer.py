"""Incremental detokenization through the tiny byte-level tokenizer: multi-byte characters are
never split, and stop strings never leak, even when they straddle tokens."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from mcpmux.inference.engine.detokenizer import IncrementalDetokenizer
from tests.inference.tiny_models import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tiny_tokenizer()


def stream(tok: PreTrainedTokenizerFast, text: str, stop: tuple[str, ...] = ()) -> tuple[list[str], str]:
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, tok.encode("Prompt: ", add_special_tokens=False), stop)
    deltas = []
    for token in ids:
        deltas.append(detok.add(token))
        if detok.stopped:
            break
    deltas.append(detok.flush())
    return deltas, detok.text


@pytest.mark.parametrize("text", ["emoji 😀🎉 and 日本語 mixed", "naïve café über", "plain ascii text"])
def test_multibyte_characters_are_never_split(tokenizer: PreTrainedTokenizerFast, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if text.startswith("emoji"):
        assert len(ids) > len(text.split()), "the emoji/CJK should span several byte tokens"
    deltas, full = stream(tokenizer, text)
    assert "".join(deltas) == text == full
    assert all("\ufffd" not in d for d in deltas)


def test_stop_string_split_across_tokens_never_leaks(tokenizer: PreTrainedTokenizerFast) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    deltas, full = stream(tokenizer, text, stop=("x jum",))
    assert "".join(deltas) == full == "The quick brown fo"
    assert all("x" not in d for d in deltas)


def test_partial_stop_prefix_is_released_when_it_does_not_complete(tokenizer: PreTrainedTokenizerFast) -> None:
    text = "Hello, world! How are you"
    deltas, full = stream(tokenizer, text, stop=("world?",))
    assert "".join(deltas) == full == text
    # "world" was held back until "!" showed it was not the stop string.
    joined = ""
    for d in deltas:
        joined += d
        assert not joined.endswith("world")


def test_earliest_of_several_stop_strings_wins(tokenizer: PreTrainedTokenizerFast) -> None:
    _, full = stream(tokenizer, "def add(a, b):\n    return a + b\n", stop=("return", "(a"))
    assert full == "def add"


def test_flush_emits_an_unfinished_character(tokenizer: PreTrainedTokenizerFast) -> None:
    ids = tokenizer.encode("ok 😀", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [])
    text = "".join(detok.add(t) for t in ids[:-1])
    assert text == "ok "  # the emoji's first bytes are held
    assert detok.flush() == "\ufffd"
