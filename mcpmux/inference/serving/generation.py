"""`Generation`: one request for text, the value every backend of the fleet is handed.

The sampling bridge, the local tools and `/v1` each build one; the fleet routes it to a backend,
which renders it in its own way: the local engine writes the tools into the prompt and holds the
output to a grammar, a remote server is asked for the JSON form (`serving.tool_calls`) and checked
on return. Either way the text that comes back reads the same.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from mcpmux.inference.engine.config import SamplingParams
from mcpmux.inference.serving.tool_calls import ToolUse

Prompt = str | list[dict[str, str]]


@dataclass(frozen=True, slots=True)
class Generation:
    """A prompt or chat messages, how to sample them, the configured model's name, the priority (larger
    runs first) and the tools the model may call; `incremental`: the caller reads the text as it comes."""

    prompt: Prompt
    params: SamplingParams
    model: str
    priority: int = 0
    tools: ToolUse | None = None
    incremental: bool = True

    def share_key(self) -> str | None:
        """The same for requests that must get the same answer (greedy, same prompt, model, settings and
        tools); None for requests that sample, whose answers differ by design."""
        if not self.params.greedy:
            return None
        tools: Any = dataclasses.asdict(self.tools) if self.tools is not None else None
        params = dataclasses.asdict(self.params)
        return json.dumps([self.model, self.prompt, params, tools, self.incremental], sort_keys=True, default=str)
