"""Tool use for local models: the tools written into the prompt, a grammar that holds the output to a
call, and the call read back. The sampling bridge (MCP `tools` + `toolChoice`) and the OpenAI API
(`tools` + `tool_choice`) both use it.

Prompt. The builtin models' chat templates have no tool section, so the tools are written into the
system message, after the request's own system prompt: one JSON line per tool (`name`,
`description`, `parameters`), and the one form a call takes:

    <tool_call>{"name": "NAME", "arguments": {...}}

Earlier turns use the same form: an assistant's call is that line, a tool's result a user message
`<tool_result>...</tool_result>`, so the model reads the conversation the way it is asked to write.

Grammar (llguidance Lark, one JSON layout: `grammar.JSON_LAYOUT`):

- `required`: exactly one call; `name` is one of the tools, `arguments` matches that tool's schema;
- `forced` (OpenAI's named tool choice): the same, over that one tool;
- `auto`: plain text (which cannot start with "<") or one call, the model's choice;
- `none`: no grammar, and the tools are not offered (earlier calls and results are still shown).

JSON form (a remote server, which takes a JSON schema but not this grammar): the system message asks
for `{"name": ..., "arguments": ...}`, or under `auto` `{"content": "..."}` for plain text, and
`json_schema()` is the schema that holds the answer to that. `read_json` checks the answer (the
arguments against the tool's own schema) and turns it into the text form above, so every caller
reads local and remote answers alike.

One call per turn: a model that needs two tools calls them in two turns.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from mcpmux.inference.engine.config import Grammar
from mcpmux.inference.serving.json_check import schema_problem

CALL_MARKER = "<tool_call>"
CONTENT_KEY = "content"  # the JSON form's plain-text answer: {"content": "..."}
MODES = ("auto", "required", "none")
Mode = Literal["auto", "required", "none"]
# The layout the engine's JSON grammar writes (engine.grammar.JSON_LAYOUT), inside a Lark %json block.
_JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_CUT_CONTENT = re.compile(r'\s*\{\s*"content"\s*:\s*"')
_CALL_HEAD = re.compile(re.escape(CALL_MARKER) + r'\{"name": ("(?:[^"\\]|\\.)*"), "arguments": ')


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call: its name, what it does, and the JSON schema of its arguments."""

    name: str
    description: str
    schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model made: a fresh id, the tool's name, its arguments as parsed and as written."""

    id: str
    name: str
    arguments: dict[str, Any]
    arguments_json: str


@dataclass(frozen=True, slots=True)
class ToolUse:
    """The tools of one request and how the model may use them (`forced` names the one tool it must call)."""

    tools: tuple[ToolSpec, ...]
    mode: Mode = "auto"
    forced: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"tool choice must be one of {', '.join(MODES)} or a tool's name, got {self.mode!r}")
        names = [tool.name for tool in self.tools]
        if self.forced is not None and self.forced not in names:
            raise ValueError(f"tool choice names {self.forced!r}, which is not among the tools: {', '.join(names)}")
        if self.mode != "none" and not self.tools:
            raise ValueError(f"tool choice {self.mode!r} needs at least one tool")

    @property
    def may_call(self) -> bool:
        """Whether the output may be a call (the tools are offered and the grammar allows one)."""
        return self.mode != "none"

    @property
    def grammar(self) -> Grammar | None:
        """The Lark grammar the output must match; None under `none`."""
        return None if self.mode == "none" else Grammar("lark", self._lark())

    def offered(self) -> tuple[ToolSpec, ...]:
        """The tools the grammar lets the model call."""
        return tuple(t for t in self.tools if self.forced in (None, t.name))

    def system_prompt(self, system: str | None, *, as_json: bool = False) -> str | None:
        """The request's system prompt followed by the tools and the call format (unchanged under `none`);
        `as_json`: the JSON form a remote server is held to."""
        if not self.may_call:
            return system
        lines = [system] if system else []
        lines.append("You can call these tools:")
        for tool in self.offered():
            lines.append(json.dumps({"name": tool.name, "description": tool.description, "parameters": tool.schema}))
        marker = "" if as_json else CALL_MARKER
        lines.append(
            f'To call a tool, answer with only {marker}{{"name": "<tool name>", "arguments": <JSON arguments>}}'
        )
        if self.mode == "auto" and self.forced is None:
            lines.append(
                f'To answer without a tool, answer with only {{"{CONTENT_KEY}": "<your answer>"}}'
                if as_json
                else "To answer without a tool, write plain text."
            )
        else:
            lines.append("You must call one of these tools now.")
        return "\n".join(lines)

    def with_tools(self, messages: list[dict[str, str]], *, as_json: bool = False) -> list[dict[str, str]]:
        """Chat messages with the tools written into the system message (one is added if there is none)."""
        if messages and messages[0]["role"] == "system":
            head, rest = messages[0]["content"], messages[1:]
        else:
            head, rest = None, messages
        system = self.system_prompt(head, as_json=as_json)
        return ([{"role": "system", "content": system}] if system is not None else []) + rest

    def json_schema(self) -> dict[str, Any]:
        """The JSON schema of an answer in the JSON form: one call of an offered tool, or under `auto` also
        `{"content": text}`."""
        answers: list[dict[str, Any]] = [
            _object({"name": {"const": tool.name}, "arguments": tool.schema}) for tool in self.offered()
        ]
        if self.mode == "auto" and self.forced is None:
            answers.append(_object({CONTENT_KEY: {"type": "string"}}))
        return answers[0] if len(answers) == 1 else {"anyOf": answers}

    def read_json(self, text: str) -> str:
        """An answer in the JSON form as the text form (a call as `call_text` writes it, or the plain text);
        `ValueError` saying what is wrong when it is not one (not JSON, no offered tool, arguments that do
        not match the tool's schema)."""
        try:
            value = json.loads(text)
        except ValueError as err:
            raise ValueError(f"the answer is not JSON ({err}): {text[:200]!r}") from None
        offered = {tool.name: tool for tool in self.offered()}
        text_allowed = self.mode == "auto" and self.forced is None
        if text_allowed and isinstance(value, dict) and set(value) == {CONTENT_KEY}:
            content = value[CONTENT_KEY]
            if isinstance(content, str):
                return content
        if not isinstance(value, dict) or set(value) != {"name", "arguments"} or value["name"] not in offered:
            raise ValueError(f"the answer is not a call of one of the tools {', '.join(offered)}: {text[:200]!r}")
        problem = schema_problem(value["arguments"], offered[value["name"]].schema)
        if problem is not None:
            raise ValueError(
                f"the arguments of its call of {value['name']!r} do not match the tool's schema: {problem}"
            )
        return call_text(value["name"], value["arguments"])

    def parse(self, text: str) -> ToolCall | None:
        """The call `text` holds, or None for plain text (or a call cut short by max_tokens)."""
        head = _CALL_HEAD.match(text) if self.may_call else None
        if head is None:
            return None
        try:
            value = json.loads(text.removeprefix(CALL_MARKER))
        except ValueError:
            return None
        names = {tool.name for tool in self.offered()}
        if not isinstance(value, dict) or value.get("name") not in names:
            return None
        if not isinstance(value.get("arguments"), dict):
            return None
        return ToolCall(new_call_id(), value["name"], value["arguments"], text[head.end() : -1])

    def _lark(self) -> str:
        calls = []
        for i, tool in enumerate(self.offered()):
            head = json.dumps(f'{{"name": {json.dumps(tool.name)}, "arguments": ')
            calls.append(f'call_{i}: {head} args_{i} "}}"\nargs_{i}: %json {json.dumps(_laid_out(tool.schema))}\n')
        alternatives = " | ".join(f"call_{i}" for i in range(len(calls)))
        start = "start: TEXT | call\nTEXT: /[^<][\\s\\S]*/\n" if self.mode == "auto" and self.forced is None else ""
        return (start or "start: call\n") + f"call: {json.dumps(CALL_MARKER)} ({alternatives})\n" + "".join(calls)

    def read_json_cut(self, text: str) -> str:
        """An answer in the JSON form that max_tokens cut short, as the text form says it: the plain text
        so far, or the call so far after the call marker (as a local model's cut call reads)."""
        content = _CUT_CONTENT.match(text)
        if content is not None and self.mode == "auto" and self.forced is None:
            rest = text[content.end() :]
            for end in range(len(rest), max(-1, len(rest) - 7), -1):  # a cut escape: drop its start
                try:
                    return str(json.JSONDecoder().raw_decode('"' + rest[:end] + '"')[0])
                except ValueError:
                    continue
        return CALL_MARKER + text.strip() if text.lstrip().startswith("{") else text


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def _laid_out(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "x-guidance": _JSON_LAYOUT}


def new_call_id() -> str:
    """An id for a call, unique enough to pair it with its result."""
    return "call_" + uuid.uuid4().hex[:24]


def call_text(name: str, arguments: Any) -> str:
    """An earlier call as the model would have written it."""
    return CALL_MARKER + json.dumps({"name": name, "arguments": arguments})


def result_text(content: str, *, is_error: bool = False) -> str:
    """An earlier call's result, as the user message the model reads it in."""
    return f"<tool_result>{'error: ' if is_error else ''}{content}</tool_result>"


@dataclass(slots=True)
class CallStream:
    """Reads a streamed output as it grows: plain text, or one call's name and then its arguments in
    fragments (the closing brace of the call is held back until the output ends)."""

    use: ToolUse
    text: str = ""
    call_id: str | None = None
    name: str | None = None
    is_call: bool | None = None  # None until the first character is known
    _start: int = 0  # where the arguments begin in `text`
    _sent: int = 0  # argument characters already handed out

    def sees_call(self, delta: str) -> bool:
        """Whether the output is a call, known from its first delta (the start of the call marker)."""
        if self.is_call is None and delta:
            # A local model's plain text cannot start with "<"; a remote's (held to the JSON form) can.
            head = delta[: len(CALL_MARKER)]
            self.is_call = self.use.may_call and CALL_MARKER.startswith(head)
        return bool(self.is_call)

    def feed(self, delta: str, *, final: bool = False) -> str:
        """Add a call's next `delta`; return the argument text now safe to send (once `name` is known).
        `final` marks the last delta: the held-back brace is dropped, or, for a call cut short, sent."""
        self.text += delta
        if self.name is None:
            head = _CALL_HEAD.match(self.text)
            if head is None:
                return ""
            self.name, self.call_id = json.loads(head.group(1)), new_call_id()
            self._start = head.end()
        complete = final and self.use.parse(self.text) is not None
        end = len(self.text) if final and not complete else len(self.text) - 1
        fragment = self.text[self._start + self._sent : end]
        self._sent += len(fragment)
        return fragment
