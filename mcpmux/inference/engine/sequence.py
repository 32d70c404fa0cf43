"""One request as the scheduler sees it: its tokens, its progress and the KV blocks it holds."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from mcpmux.inference.engine.config import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class Sequence:
    """A request's state. `token_ids` is prompt + output; the first `num_computed_tokens` of them
    have their K/V in the blocks of `block_table`."""

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    priority: int = 0
    arrival: int = 0  # admission order tie-break: smaller arrived earlier
    max_tokens: int = 0  # params.max_tokens, capped by the model's context length
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prefix-cache hit at first admission (-1: not yet admitted)
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of its full, computed blocks
    waited_steps: int = 0  # steps spent waiting, over its whole life (drives priority aging)
    num_preemptions: int = 0
    finish_reason: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def effective_priority(self, aging_interval: int) -> int:
        """Priority plus one level per `aging_interval` steps spent waiting (larger runs first)."""
        return self.priority + self.waited_steps // aging_interval
