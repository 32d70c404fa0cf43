"""What the engine hands back to callers: plain data, importable without torch."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TokenLogprob:
    """The sampled token's log-probability and, when asked for, the most likely alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class Completion:
    """A finished request: all its text and tokens, why it ended, and its token counts."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "abort"
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    logprobs: list[TokenLogprob] | None = None
