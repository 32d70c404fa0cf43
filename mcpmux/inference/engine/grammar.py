"""Constrained decoding: a request's output held to a JSON schema, a regular expression or a Lark grammar.

Built on llguidance. Each constrained request owns an `llguidance.LLMatcher` over the engine's
tokenizer. While a step's forward pass runs, a worker thread (`MaskFiller`) has every constrained
row's matcher name the tokens it allows next (llguidance fills the bitmasks without the GIL) and
turns them into a bias of 0 and -inf; the sampler adds it to those rows only, so unconstrained rows
are untouched and stay token-for-token exact. After the step the sampled token is consumed; once
the grammar can take no more tokens the request finishes with "stop". Where the grammar leaves only
one way on (the keys of a JSON object, a tool call's fixed text), those tokens are appended without
sampling (`forced`, jump-forward) and computed together in the next step. JSON comes out on one
line (`JSON_LAYOUT`). A grammar llguidance rejects (a schema feature it does not support, a
malformed regex) is an `InvalidSettingError` naming the reason.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.hf
import numpy as np
import torch

from mcpmux.inference.engine.config import Grammar
from mcpmux.inference.errors import InvalidSettingError

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict of the type stubs only

# Row b: the logit bias of the 8 tokens of a bitmask byte b (bit i set: token i allowed, 0; else -inf).
_BYTE_BIAS = np.array(
    [[0.0 if byte >> bit & 1 else -np.inf for bit in range(8)] for byte in range(256)], dtype=np.float32
)
# JSON on one line with ", " and ": ": with whitespace left free, a small model pads until max_tokens.
JSON_LAYOUT: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


class GrammarCompiler:
    """Makes matchers for one tokenizer, from any thread. Converting the tokenizer (about a second)
    waits for the first grammar; each compiled grammar is kept (the last `CACHE_SIZE`, by value) and
    copied for every request that asks for it again."""

    CACHE_SIZE = 64

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self._hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[Grammar, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, grammar: Grammar) -> GrammarMatcher:
        """A fresh matcher for `grammar`; raises `InvalidSettingError` when llguidance refuses it."""
        with self._lock:
            pristine = self._compiled.get(grammar)
            if pristine is not None:
                self._compiled.move_to_end(grammar)
                return GrammarMatcher(pristine.deep_copy())
            if self._tokenizer is None:
                self._tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self.vocab_size)
            tokenizer = self._tokenizer
        try:
            source = _grammar_source(grammar)
        except ValueError as err:
            raise InvalidSettingError(f"the {grammar.kind} grammar is not valid: {err}") from None
        pristine = llguidance.LLMatcher(tokenizer, source, log_level=0)  # releases the GIL while it builds
        if pristine.is_error():
            raise InvalidSettingError(f"the {grammar.kind} grammar cannot be used: {pristine.get_error()}")
        with self._lock:
            self._compiled[grammar] = pristine
            while len(self._compiled) > self.CACHE_SIZE:
                self._compiled.popitem(last=False)
        return GrammarMatcher(pristine.deep_copy())


class GrammarMatcher:
    """One request's position in its grammar."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def forced(self) -> list[int]:
        """The tokens the grammar allows as the only way on from here (jump-forward), not yet consumed."""
        return list(self._matcher.compute_ff_tokens())

    def consume(self, token_id: int) -> None:
        """Advance past the sampled token (always one the mask allowed)."""
        self._matcher.consume_token(token_id)

    @property
    def done(self) -> bool:
        """Whether the grammar takes no more tokens: the output is complete."""
        return bool(self._matcher.is_stopped())


class MaskFiller:
    """Fills the next-token masks of a step's constrained rows on a worker thread, so that the work
    overlaps the step's forward pass. The matchers must not be advanced until the fill is done
    (the sampler waits for it before it samples; the engine consumes tokens after)."""

    def __init__(self, vocab_size: int) -> None:
        self._vocab_size = vocab_size
        self._words = (vocab_size + 31) // 32
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")

    def start(self, matchers: list[GrammarMatcher]) -> Future[torch.Tensor]:
        """Begin filling; the result is a float32 bias [len(matchers), vocab_size], 0 where the
        grammar allows the token next and -inf elsewhere, one row per matcher in order."""
        return self._worker.submit(self._fill, [m._matcher for m in matchers])

    def _fill(self, matchers: list[llguidance.LLMatcher]) -> torch.Tensor:
        bitmask = torch.empty((len(matchers), self._words), dtype=torch.int32)
        # One by one, on this thread: for 64 rows llguidance's parallel executor was no faster on 2
        # cores, and 5-10x slower while other jobs kept them busy (benchmarks/structured_libs.py).
        for row, matcher in enumerate(matchers):
            matcher.unsafe_compute_mask_ptr(bitmask[row].data_ptr(), self._words * 4)  # without the GIL
        # numpy, single-threaded: torch here would start a second OpenMP team beside the forward's.
        bias = np.take(_BYTE_BIAS, bitmask.numpy().view(np.uint8), axis=0)
        return torch.from_numpy(bias.reshape(len(matchers), -1)[:, : self._vocab_size])


def _grammar_source(grammar: Grammar) -> str:
    if grammar.kind == "json_schema":
        schema = json.loads(grammar.source)
        return str(llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT))
    if grammar.kind == "regex":
        return str(llguidance.LLMatcher.grammar_from_regex(grammar.source))
    return str(llguidance.LLMatcher.grammar_from_lark(grammar.source))
