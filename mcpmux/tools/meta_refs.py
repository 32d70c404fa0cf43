"""References between `mux_pipeline` steps: `{"$ref": "steps.<step>.<root>.<key>..."}`.

A JSON object whose only key is `"$ref"`, anywhere in a step's arguments (nested in objects and
arrays too), is replaced by a value taken from an earlier step's result before the step is called:

- `<step>` is the earlier step's index (0-based) or its `id`;
- `<root>` is `text` (the step's text content blocks joined with newlines), `json` (that text parsed
  as JSON) or `structured` (the step's structuredContent);
- each further segment is an object key, or a non-negative list index.

The reference may also be written as a list of segments, `["steps", 0, "structured", "a.b"]`, for
keys that contain a dot. Anything that does not resolve (a later or unknown step, a missing key, an
index out of range, text that is not JSON) raises `BadReferenceError`, whose message names the step,
the reference and what was there instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

REF_KEY = "$ref"
ROOTS = ("text", "json", "structured")


class BadReferenceError(ValueError):
    """A `$ref` in a pipeline step that does not resolve; the message says which and why."""


@dataclass(frozen=True, slots=True)
class StepOutput:
    """What later steps can reference from one finished step."""

    id: str | None
    text: str
    structured: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class _Where:
    """The step whose arguments are being resolved, for error messages."""

    index: int
    tool: str

    def fail(self, ref: object, problem: str) -> BadReferenceError:
        return BadReferenceError(f"step {self.index} ({self.tool}): reference {json.dumps(ref)}: {problem}")


def resolve_refs(value: Any, earlier: Sequence[StepOutput], step: int, tool: str) -> Any:
    """`value` with every `{"$ref": ...}` replaced by what it points at in `earlier` step outputs."""
    return _resolve(value, earlier, _Where(step, tool))


def _resolve(value: Any, earlier: Sequence[StepOutput], where: _Where) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and REF_KEY in value:
            return _lookup(value[REF_KEY], earlier, where)
        return {key: _resolve(item, earlier, where) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolve(item, earlier, where) for item in value]
    return value


def _segments(ref: object, where: _Where) -> list[str | int]:
    if isinstance(ref, str):
        return list(ref.split("."))
    if isinstance(ref, list) and all(isinstance(part, str | int) and not isinstance(part, bool) for part in ref):
        return list(ref)
    raise where.fail(ref, 'must be a string like "steps.0.text" or a list like ["steps", 0, "text"]')


def check_refs(value: Any, earlier_ids: Sequence[str | None], step: int, tool: str) -> None:
    """Raise `BadReferenceError` for a reference that can never resolve, before any step runs.

    Checks the form, the step (it must be earlier) and the root; keys and indices below the root
    can only be checked once the step has answered.
    """
    earlier = [StepOutput(id, "", None) for id in earlier_ids]
    for ref in _refs_in(value):
        _target(ref, earlier, _Where(step, tool))


def _refs_in(value: Any) -> list[object]:
    if isinstance(value, dict):
        if len(value) == 1 and REF_KEY in value:
            return [value[REF_KEY]]
        return [ref for item in value.values() for ref in _refs_in(item)]
    if isinstance(value, list):
        return [ref for item in value for ref in _refs_in(item)]
    return []


def _target(ref: object, earlier: Sequence[StepOutput], where: _Where) -> tuple[StepOutput, list[str | int]]:
    """The step a reference points at, and its segments (checked: "steps", the step, the root)."""
    parts = _segments(ref, where)
    if len(parts) < 3 or parts[0] != "steps":
        raise where.fail(ref, 'must be "steps.<index or id>.<text|json|structured>[.<key or index>...]"')
    if parts[2] not in ROOTS:
        raise where.fail(ref, f"unknown root {parts[2]!r}; use one of {', '.join(ROOTS)}")
    return earlier[_step_index(ref, parts[1], earlier, where)], parts


def _lookup(ref: object, earlier: Sequence[StepOutput], where: _Where) -> Any:
    output, parts = _target(ref, earlier, where)
    current: Any
    if parts[2] == "text":
        current = output.text
    elif parts[2] == "json":
        try:
            current = json.loads(output.text)
        except json.JSONDecodeError as err:
            raise where.fail(ref, f"the text of step {parts[1]} is not JSON ({err.msg} at {err.pos})") from None
    else:
        if output.structured is None:
            raise where.fail(ref, f"step {parts[1]} returned no structured content; use text or json instead")
        current = output.structured
    for depth, part in enumerate(parts[3:]):
        current = _walk(current, part, ref, ".".join(str(p) for p in parts[: 3 + depth]), where)
    return current


def _step_index(ref: object, selector: str | int, earlier: Sequence[StepOutput], where: _Where) -> int:
    if isinstance(selector, int) or selector.isdigit():
        index = int(selector)
        if 0 <= index < len(earlier):
            return index
    else:
        for index, output in enumerate(earlier):
            if output.id == selector:
                return index
    known = ", ".join(f"{i}" + (f" ({o.id!r})" if o.id else "") for i, o in enumerate(earlier)) or "none"
    raise where.fail(ref, f"step {selector!r} is not an earlier step (earlier steps: {known})")


def _walk(current: Any, part: str | int, ref: object, at: str, where: _Where) -> Any:
    if isinstance(current, Mapping):
        key = str(part)
        if key not in current:
            keys = ", ".join(repr(k) for k in list(current)[:20]) or "none"
            raise where.fail(ref, f"no key {key!r} in the object at {at} (its keys: {keys})")
        return current[key]
    if isinstance(current, list):
        if isinstance(part, int) or part.isdigit():
            index = int(part)
            if 0 <= index < len(current):
                return current[index]
            raise where.fail(ref, f"index {index} is out of range at {at} (a list of {len(current)})")
        raise where.fail(ref, f"{part!r} is not a list index at {at} (a list of {len(current)})")
    raise where.fail(ref, f"cannot look up {part!r} in the {type(current).__name__} at {at}")
