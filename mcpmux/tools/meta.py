"""Meta-tools: one model turn fans out to many tool calls (`mux_parallel`, `mux_batch`, `mux_pipeline`).

Every inner call goes through `Mux.call_tool`, so it takes the same road as a direct call: the
upstream's queue and priorities, its concurrency and rate limits, the result cache and coalescing
(20 identical read-only calls in one `mux_batch` cost one upstream call), list-form merging.

Each inner call answers for itself: `{"index", "tool", "ok": true, "result": {"text", "structured"?}}`
or `{"index", "tool", "ok": false, "error": "..."}`. The meta-tool's own result is an error only when
the request itself is malformed (or, for `mux_pipeline`, when a step fails, since the pipeline then
has no final output). Meta-tools cannot call meta-tools, nor tools only MCP Apps views may call
(`Mux.model_refusal`): the model drives them.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TypeVar

import anyio
import mcp_types as types
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mcpmux.core.inbound import Caller
from mcpmux.errors import MuxError, UpstreamError, error_result
from mcpmux.tools.base import LocalTool, ToolCaller
from mcpmux.tools.meta_refs import BadReferenceError, StepOutput, check_refs, resolve_refs
from mcpmux.tools.meta_schemas import BATCH_TOOL, MAX_CALLS, MAX_CONCURRENT, MAX_STEPS, PARALLEL_TOOL, PIPELINE_TOOL
from mcpmux.upstream.lane import ProgressFn

logger = logging.getLogger(__name__)

META_TOOL_NAMES = frozenset({PARALLEL_TOOL.name, BATCH_TOOL.name, PIPELINE_TOOL.name})
Outcome = dict[str, Any]
_Args = TypeVar("_Args", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Call(_Strict):
    tool: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class _ParallelArgs(_Strict):
    calls: list[_Call] = Field(min_length=1, max_length=MAX_CALLS)


class _BatchArgs(_Strict):
    tool: str = Field(min_length=1)
    arguments: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_CALLS)


class _Step(_Call):
    id: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


class _PipelineArgs(_Strict):
    steps: list[_Step] = Field(min_length=1, max_length=MAX_STEPS)


def meta_tools(mux: ToolCaller) -> list[LocalTool]:
    """The three meta-tools, calling through `mux`."""
    runner = MetaRunner(mux)
    return [
        LocalTool(PARALLEL_TOOL, runner.parallel),
        LocalTool(BATCH_TOOL, runner.batch),
        LocalTool(PIPELINE_TOOL, runner.pipeline),
    ]


class MetaRunner:
    """Runs meta-tool requests against one `Mux`."""

    def __init__(self, mux: ToolCaller) -> None:
        self.mux = mux

    async def parallel(
        self, arguments: dict[str, Any], progress: ProgressFn | None, caller: Caller
    ) -> types.CallToolResult:
        """`mux_parallel`: every call at once (at most `MAX_CONCURRENT` in flight), results in input order."""
        parsed = _parse(_ParallelArgs, PARALLEL_TOOL.name, arguments)
        if isinstance(parsed, types.CallToolResult):
            return parsed
        calls = [(call.tool, call.arguments) for call in parsed.calls]
        return _fan_out_result(PARALLEL_TOOL.name, await self._fan_out(calls, progress, caller))

    async def batch(
        self, arguments: dict[str, Any], progress: ProgressFn | None, caller: Caller
    ) -> types.CallToolResult:
        """`mux_batch`: one tool, once per argument object, concurrently, results in input order."""
        parsed = _parse(_BatchArgs, BATCH_TOOL.name, arguments)
        if isinstance(parsed, types.CallToolResult):
            return parsed
        calls = [(parsed.tool, item) for item in parsed.arguments]
        return _fan_out_result(BATCH_TOOL.name, await self._fan_out(calls, progress, caller))

    async def pipeline(
        self, arguments: dict[str, Any], progress: ProgressFn | None, caller: Caller
    ) -> types.CallToolResult:
        """`mux_pipeline`: steps in order, `$ref`s resolved against earlier results; stops at a failure."""
        parsed = _parse(_PipelineArgs, PIPELINE_TOOL.name, arguments)
        if isinstance(parsed, types.CallToolResult):
            return parsed
        steps = parsed.steps
        try:
            _check_steps(steps)
        except BadReferenceError as err:
            return _malformed(PIPELINE_TOOL.name, str(err))
        caller = _scoped(caller)
        outputs: list[StepOutput] = []
        records: list[Outcome] = []
        for index, step in enumerate(steps):
            try:
                resolved = resolve_refs(step.arguments, outputs, index, step.tool)
            except BadReferenceError as err:
                records.append({**_failed(index, step.tool, str(err)), "id": step.id})
                break
            outcome = {**await self._call(index, step.tool, resolved, caller), "id": step.id}
            records.append(outcome)
            if not outcome["ok"]:
                break
            result = outcome["result"]
            outputs.append(StepOutput(step.id, result["text"], result.get("structured")))
            if progress is not None:
                await progress(index + 1, len(steps), f"step {index} ({step.tool}) done")
        return _pipeline_result(records, len(steps))

    async def _fan_out(
        self, calls: Sequence[tuple[str, dict[str, Any]]], progress: ProgressFn | None, caller: Caller
    ) -> list[Outcome]:
        caller = _scoped(caller)
        limiter = anyio.CapacityLimiter(MAX_CONCURRENT)
        outcomes: list[Outcome] = [{} for _ in calls]
        done = 0

        async def one(index: int, tool: str, arguments: dict[str, Any]) -> None:
            nonlocal done
            async with limiter:
                outcomes[index] = await self._call(index, tool, arguments, caller)
            done += 1
            if progress is not None:
                await progress(done, len(calls), f"{done} of {len(calls)} calls answered")

        async with anyio.create_task_group() as tasks:
            for index, (tool, arguments) in enumerate(calls):
                tasks.start_soon(one, index, tool, arguments)
        return outcomes

    async def _call(self, index: int, tool: str, arguments: dict[str, Any], caller: Caller) -> Outcome:
        if tool in META_TOOL_NAMES:
            return _failed(
                index, tool, f"{tool} is a meta-tool and meta-tools cannot call meta-tools; list its calls here"
            )
        refusal = self.mux.model_refusal(tool, caller.profile)
        if refusal is not None:
            return _failed(index, tool, refusal)
        try:
            result = await self.mux.call_tool(tool, arguments, caller=caller)
        except UpstreamError as err:
            return _failed(index, tool, f"{err} (JSON-RPC error {err.code})")
        except MuxError as err:
            return _failed(index, tool, str(err))
        except Exception as err:  # one broken call must not take its siblings' answers down with it
            logger.exception("meta-tool call %d to %s failed", index, tool)
            return _failed(index, tool, f"{type(err).__name__}: {err}")
        text = "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))
        if result.is_error:
            return _failed(index, tool, text or "the tool reported an error without a message")
        answer: dict[str, Any] = {"text": text}
        if result.structured_content is not None:
            answer["structured"] = result.structured_content
        others = [block.model_dump(by_alias=True, exclude_none=True) for block in result.content]
        others = [block for block in others if block.get("type") != "text"]
        if others:
            answer["content"] = others
        return {"index": index, "tool": tool, "ok": True, "result": answer}


def _scoped(caller: Caller) -> Caller:
    """The caller, with a fresh identity when it has none (a library call), so that client-scoped
    cache entries are never shared by accident; shared-scope tools still coalesce and cache."""
    return caller if caller.client is not None else replace(caller, client=f"meta-{uuid.uuid4().hex}")


def _check_steps(steps: Sequence[_Step]) -> None:
    seen: list[str | None] = []
    for index, step in enumerate(steps):
        if step.id is not None and step.id in seen:
            raise BadReferenceError(
                f"step {index} ({step.tool}): id {step.id!r} is already used by step {seen.index(step.id)}"
            )
        check_refs(step.arguments, seen, index, step.tool)
        seen.append(step.id)


def _parse(model: type[_Args], tool: str, arguments: dict[str, Any]) -> _Args | types.CallToolResult:
    try:
        return model.model_validate(arguments)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in problem['loc']) or '(arguments)'}: {problem['msg']}"
            for problem in err.errors()
        )
        return _malformed(tool, problems)


def _malformed(tool: str, problem: str) -> types.CallToolResult:
    text = f"{tool}: the request is malformed: {problem}. See the tool's input schema."
    return error_result(text)


def _failed(index: int, tool: str, error: str) -> Outcome:
    return {"index": index, "tool": tool, "ok": False, "error": error}


def _line(outcome: Outcome) -> str:
    label = f"[{outcome['index']}]" + (f" {outcome['id']}" if outcome.get("id") else "") + f" {outcome['tool']}"
    if outcome["ok"]:
        return f"{label} ok: {outcome['result']['text']}"
    return f"{label} failed: {outcome['error']}"


def _fan_out_result(tool: str, outcomes: list[Outcome]) -> types.CallToolResult:
    failed = sum(1 for outcome in outcomes if not outcome["ok"])
    summary = f"{tool}: {len(outcomes)} calls, {len(outcomes) - failed} ok, {failed} failed"
    text = "\n".join([summary, *(_line(outcome) for outcome in outcomes)])
    structured = {"results": outcomes, "succeeded": len(outcomes) - failed, "failed": failed}
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=structured)


def _pipeline_result(records: list[Outcome], total: int) -> types.CallToolResult:
    failure = next((record for record in records if not record["ok"]), None)
    if failure is None:
        summary = f"{PIPELINE_TOOL.name}: all {total} steps ok"
    else:
        summary = (
            f"{PIPELINE_TOOL.name}: stopped at step {failure['index']} ({failure['tool']}) after "
            f"{failure['index']} of {total} steps; later steps did not run"
        )
    text = "\n".join([summary, *(_line(record) for record in records)])
    structured = {
        "steps": records,
        "completed": len(records) - (failure is not None),
        "total": total,
        "failed_step": failure["index"] if failure is not None else None,
    }
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=structured, is_error=failure is not None
    )
