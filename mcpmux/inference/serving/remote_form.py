"""How a structured request is put to a remote OpenAI-compatible server, and how its answer is read.

A remote server takes a JSON schema (`response_format` `json_schema`, which vLLM and SGLang follow)
but not the local engine's Lark grammars. So a tool call is asked for in the JSON form of
`serving.tool_calls` (the tools' schema), a JSON-schema grammar is sent as itself, and a regex or
Lark grammar is for local backends only. A server that refuses `response_format` is asked in the
prompt instead. Either way the answer is checked when it comes back: `RemoteForm.read` returns it in
the text form every caller reads (a call as `<tool_call>{...}`), or raises `ValueError` saying what
is wrong with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mcpmux.inference.serving.generation import Generation, Prompt
from mcpmux.inference.serving.json_check import schema_problem
from mcpmux.inference.serving.tool_calls import ToolUse


def served_remotely(generation: Generation) -> bool:
    """Whether a remote server can be asked for this request (a regex or Lark grammar needs the local engine)."""
    grammar = generation.params.grammar
    return grammar is None or grammar.kind == "json_schema"


@dataclass(frozen=True, slots=True)
class RemoteForm:
    """The prompt a remote server gets, the JSON schema its answer must match (None: free text), and the
    tools a JSON answer is read back with."""

    prompt: Prompt
    schema: dict[str, Any] | None = None
    tools: ToolUse | None = None

    def read(self, text: str) -> str:
        """The answer in the text form; `ValueError` naming the problem when it does not match."""
        if self.tools is not None:
            return self.tools.read_json(text)
        if self.schema is None:
            return text
        try:
            value = json.loads(text)
        except ValueError as err:
            raise ValueError(f"the answer is not JSON ({err}): {text[:200]!r}") from None
        problem = schema_problem(value, self.schema)
        if problem is not None:
            raise ValueError(f"the answer does not match the schema: {problem}")
        return text

    def read_cut(self, text: str) -> str:
        """An answer max_tokens cut short (it cannot match): a JSON-form answer as far as it goes in the
        text form, anything else as written."""
        return self.tools.read_json_cut(text) if self.tools is not None else text

    def asked_in_prompt(self) -> Prompt:
        """The prompt for a server that refuses `response_format`: the schema is asked for in words (a
        tool call's form is already there)."""
        if self.schema is None or self.tools is not None or isinstance(self.prompt, str):
            return self.prompt
        line = "Answer with only JSON that matches this JSON schema: " + json.dumps(self.schema)
        messages = list(self.prompt)
        if messages and messages[0]["role"] == "system":
            return [{"role": "system", "content": messages[0]["content"] + "\n" + line}, *messages[1:]]
        return [{"role": "system", "content": line}, *messages]


def remote_form(generation: Generation) -> RemoteForm:
    """The remote form of a request that `served_remotely` accepts."""
    tools, grammar, prompt = generation.tools, generation.params.grammar, generation.prompt
    if tools is not None and tools.may_call:
        if isinstance(prompt, str):
            raise ValueError("tools need chat messages, not a plain prompt")
        return RemoteForm(tools.with_tools(prompt, as_json=True), tools.json_schema(), tools)
    if grammar is None:
        return RemoteForm(prompt)
    return RemoteForm(prompt, json.loads(grammar.source))
