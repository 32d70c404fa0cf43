"""Incremental detokenization with stop strings.

Text is decoded over a short window of tokens: `decode(window) - decode(window minus the newest)`,
so tokenizers that drop a leading space at the start of a decode still yield the right text. When
the newest tokens end in the middle of a UTF-8 character (byte-level BPE splits emoji and CJK
across tokens) the decode ends in U+FFFD and nothing is emitted until the character completes.

Stop strings are matched on the accumulated text; the text from the match on is dropped, and any
tail that could still grow into a stop string is held back, so a stop string never reaches the
caller even when it is split across tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

_CONTEXT_TOKENS = 5  # prompt tokens kept as decode context so the first output token decodes right


class IncrementalDetokenizer:
    """Turns one request's output tokens into text deltas."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, prompt_token_ids: Sequence[int], stop: Sequence[str] = ()
    ) -> None:
        self._tokenizer = tokenizer
        self._tokens = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)
        self._stop = tuple(stop)
        self._text = ""  # output text so far (after any stop-string cut)
        self._emitted = 0  # how much of _text the caller has already been given
        self.stopped = False  # a stop string matched; no more text will come

    @property
    def text(self) -> str:
        return self._text

    def add(self, token_id: int) -> str:
        """Feed one output token; return the text now safe to emit (possibly empty)."""
        if self.stopped:
            return ""
        self._tokens.append(token_id)
        self._take_new_text(complete_only=True)
        return self._release(final=self.stopped)

    def flush(self) -> str:
        """The request ended: return whatever was held back, an unfinished character included."""
        if not self.stopped:
            self._take_new_text(complete_only=False)
        return self._release(final=True)

    def _take_new_text(self, complete_only: bool) -> None:
        prefix = self._decode(self._prefix_offset, self._read_offset)
        full = self._decode(self._prefix_offset, len(self._tokens))
        if len(full) <= len(prefix) or (complete_only and full.endswith("\ufffd")):
            return  # an incomplete character (or a token with no text yet): wait for more
        start = len(self._text)
        self._text += full[len(prefix) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._tokens)
        self._match_stop(start)

    def _decode(self, start: int, end: int) -> str:
        text = self._tokenizer.decode(self._tokens[start:end], skip_special_tokens=True)
        assert isinstance(text, str)  # a flat list of ids decodes to one string
        return text

    def _match_stop(self, new_from: int) -> None:
        longest = max((len(s) for s in self._stop), default=0)
        search_from = max(0, new_from - longest + 1)
        hits = [i for i in (self._text.find(s, search_from) for s in self._stop) if i >= 0]
        if hits:
            self._text = self._text[: min(hits)]
            self.stopped = True

    def _release(self, final: bool) -> str:
        end = len(self._text) if final else len(self._text) - self._held_back()
        end = max(end, self._emitted)
        delta = self._text[self._emitted : end]
        self._emitted = end
        return delta

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of some stop string."""
        held = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(self._text)), held, -1):
                if self._text.endswith(s[:n]):
                    held = n
                    break
        return held
