"""`Delta`: one streamed piece of a completion, the same shape for local engines and remote servers."""

from __future__ import annotations

from dataclasses import dataclass, field

from mcpmux.inference.engine.outputs import TokenLogprob


@dataclass(slots=True)
class Delta:
    """New text since the previous delta; `finish_reason` is None until the last one.

    The last delta (`finish_reason` set: "stop", "length" or "abort") carries the request's token
    counts; `token_ids` and `logprobs` are filled where the backend reports them.
    """

    text: str
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
