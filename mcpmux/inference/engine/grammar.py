"""Constrained decoding: a request's output held to a JSON schema, a regular expression or a Lark grammar.

Built on llguidance. Each constrained request owns an `llguidance.LLMatcher` over the engine's
tokenizer; before a step samples, the matcher names the tokens it allows next and the sampler sets
every other token's logit to -inf on that request's row only, so unconstrained rows are untouched
and stay token-for-token exact. After the step the sampled token is consumed; once the grammar can
take no more tokens the request finishes with "stop". Where the grammar leaves only one way on (the
keys of a JSON object, a tool call's fixed text), those tokens are appended without sampling
(`forced`, jump-forward) and computed together in the next step. JSON comes out on one line
(`JSON_LAYOUT`). A grammar llguidance rejects (a schema feature
it does not support, a malformed regex) is an `InvalidSettingError` naming the reason.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.hf
import torch

from mcpmux.inference.engine.config import Grammar
from mcpmux.inference.errors import InvalidSettingError

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict of the type stubs only

_BITS = torch.arange(32, dtype=torch.int32)
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
                return GrammarMatcher(pristine.deep_copy(), self.vocab_size)
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
        return GrammarMatcher(pristine.deep_copy(), self.vocab_size)


class GrammarMatcher:
    """One request's position in its grammar."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._bitmask = torch.empty((1, (vocab_size + 31) // 32), dtype=torch.int32)

    def allowed(self) -> torch.Tensor:
        """A bool tensor [vocab_size]: the tokens the grammar allows next."""
        self._matcher.unsafe_compute_mask_ptr(self._bitmask.data_ptr(), self._bitmask.numel() * 4)
        bits = (self._bitmask[0].unsqueeze(-1) >> _BITS) & 1
        return bits.reshape(-1)[: self._vocab_size].bool()

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


def _grammar_source(grammar: Grammar) -> str:
    if grammar.kind == "json_schema":
        schema = json.loads(grammar.source)
        return str(llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT))
    if grammar.kind == "regex":
        return str(llguidance.LLMatcher.grammar_from_regex(grammar.source))
    return str(llguidance.LLMatcher.grammar_from_lark(grammar.source))
