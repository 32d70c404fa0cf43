"""A 2025-11-25 upstream's task that mcpmux follows for a 2026-07-28 client (the tasks extension).

The extension's client polls `tasks/get` for the result; a 2025 upstream hands it out only through
`tasks/result`, which it holds until the task ends. So mcpmux asks for it at once (`follow`, in a
task of the Mux's) and keeps how the task ended; meanwhile `tasks/get` is the upstream's, renamed
to the extension's fields (`ttl` is `ttlMs`, `pollInterval` is `pollIntervalMs`).

While mcpmux waits on `tasks/result`, the upstream may ask something for the task (server-
everything's elicitation for an ambiguous query, naming the task in its related-task `_meta`).
When the client declared what it needs (elicitation; its url mode for a url one), the question
becomes the task's `inputRequests` (status `input_required`), and the client's `tasks/update`
answers it; otherwise mcpmux declines it (the reason in the decline's `_meta`), and the upstream's
`input_required` reads `working`, since mcpmux, not the client, is answering. Nobody else is asked,
nor told: a question about a client's task is that client's alone.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from mcpmux.core.inbound import ClientRequest, ClientResult
from mcpmux.mux.ask_policies import REASON_META
from mcpmux.upstream import task_extension as wire
from mcpmux.upstream.supervisor import Upstream
from mcpmux.upstream.tasks import RELATED_TASK

logger = logging.getLogger(__name__)

SETTLE_SECONDS = 5.0
"""How long `tasks/get` waits for how a task that ended upstream ended (its `tasks/result`)."""


def related_task(request: ClientRequest) -> str | None:
    """The upstream task a request of the upstream's is for (its related-task `_meta`), if any."""
    meta = request.params.meta if request.params is not None else None
    related = (meta or {}).get(RELATED_TASK)
    task_id = related.get("taskId") if isinstance(related, dict) else None
    return task_id if isinstance(task_id, str) else None


def _ended(state: dict[str, Any], outcome: dict[str, Any]) -> dict[str, Any]:
    """How a task ended: its last state upstream, and what `tasks/result` gave (a DetailedTask)."""
    status = state.get("status")
    if status not in wire.TERMINAL:  # the result came first: it says how the task ended
        status = "completed" if "result" in outcome else "failed"
    ended = {**state, "status": status}
    if status == "completed" and "result" in outcome:
        return {**ended, "result": wire.without_meta(outcome["result"], RELATED_TASK)}  # no 2026 word: it names theirs
    if status == "failed":
        error = outcome.get("error") or {"code": types.INTERNAL_ERROR, "message": state.get("statusMessage", "failed")}
        return {**ended, "error": error}
    return ended


@dataclass(slots=True)
class _Question:
    """An upstream's request during the task, waiting for the client's `tasks/update`."""

    request: dict[str, Any]
    """As `inputRequests` shows it: `method` and `params`."""
    answer: ClientResult | None = None
    answered: anyio.Event = field(default_factory=anyio.Event)


class FollowedTask:
    """One 2025 upstream's task, followed for a 2026 client (see the module's docstring)."""

    def __init__(
        self, upstream: Upstream, client: Client, created: dict[str, Any], asks: types.ClientCapabilities | None
    ) -> None:
        self.upstream = upstream
        self.client: Client | None = client
        """The session the task lives on, until it ended (the task is gone with it)."""
        self.upstream_id = str(created["taskId"])
        self.state = created
        """Its last known state upstream."""
        self.final: dict[str, Any] | None = None
        """How it ended: what `tasks/get` answers from then on."""
        elicitation = asks.elicitation if asks is not None else None
        self._elicits = (elicitation is not None, elicitation is not None and elicitation.url is not None)
        """Whether the client declared elicitation: (form, url)."""
        self._questions: dict[str, _Question] = {}
        self._keys = itertools.count(1)
        self._ended = anyio.Event()
        self._scope = anyio.CancelScope()

    async def follow(self) -> None:
        """Wait for the task to end (`tasks/result`, within its ttl) and keep how it ended."""
        client = self.client
        assert client is not None  # it ends only here, or cancelled (which cancels this first)
        params = {"taskId": self.upstream_id}
        ttl_ms = self.state.get("ttlMs") or 3_600_000
        outcome: dict[str, Any] = {}
        with self._scope:
            with anyio.move_on_after(ttl_ms / 1000):
                try:
                    outcome = {"result": await wire.legacy_request(client, "tasks/result", params)}
                except MCPError as err:
                    outcome = {"error": err.error.model_dump(mode="json", exclude_none=True)}
                except Exception as err:  # one task's fault must not end the Mux's task group
                    logger.warning("following task %r of %r failed: %s", self.upstream_id, self.upstream.name, err)
                    outcome = {"error": {"code": types.INTERNAL_ERROR, "message": f"mcpmux lost the task: {err}"}}
            state = self.state
            try:
                state = wire.from_legacy(await wire.legacy_request(client, "tasks/get", params))
            except Exception as err:
                logger.debug("task %r of %r: no state after it ended: %s", self.upstream_id, self.upstream.name, err)
            if not outcome:
                message = f"upstream {self.upstream.name!r} did not end the task within its ttl ({ttl_ms} ms)"
                outcome = {"error": {"code": types.INTERNAL_ERROR, "message": message}}
            self._end(_ended(state, outcome))

    def _end(self, final: dict[str, Any]) -> None:
        self.final, self.client = final, None  # kept for `tasks/get`: no session held for it
        self._ended.set()
        for question in self._questions.values():
            question.answered.set()  # unanswered: mcpmux's fallback answers the upstream, if it still asks

    async def get(self) -> dict[str, Any]:
        """The task now, as the extension's DetailedTask (under the upstream's id)."""
        if self.final is not None:
            return self.final
        state = self.state = wire.from_legacy(await self._ask("tasks/get"))
        status = state.get("status")
        if status in wire.TERMINAL:
            with anyio.move_on_after(SETTLE_SECONDS):
                await self._ended.wait()
            return self.final if self.final is not None else state
        questions = {key: question.request for key, question in self._questions.items() if question.answer is None}
        if questions:
            return {**state, "status": "input_required", "inputRequests": questions}
        return {**state, "status": "working"} if status == "input_required" else state

    async def cancel(self) -> None:
        """Cancel it upstream; a task that ended first is left as it ended."""
        if self.final is not None:
            return
        try:
            state = wire.from_legacy(await self._ask("tasks/cancel"))
        except MCPError as err:
            if err.error.code != types.INVALID_PARAMS:
                raise
            return  # it ended before the cancel reached it: `tasks/get` says how
        if state.get("status") == "cancelled":
            self._scope.cancel()
            self._end(state)

    def update(self, responses: dict[str, Any]) -> None:
        """The client's answers to the task's `inputRequests`; keys not outstanding are ignored."""
        for key, response in responses.items():
            question = self._questions.get(key)
            if question is None or question.answer is not None:
                continue
            try:
                question.answer = types.ElicitResult.model_validate(response)  # `takes` asks nothing else
            except ValidationError as err:
                problem = f"inputResponses[{key!r}] is no answer to its elicitation: {err}"
                raise MCPError(types.INVALID_PARAMS, problem) from None
            question.answered.set()

    def _takes(self, request: types.ElicitRequest) -> bool:
        """Whether the client can be asked `request` (it declared elicitation, url mode for a url one)."""
        form, url = self._elicits
        return url if isinstance(request.params, types.ElicitRequestURLParams) else form

    async def ask(self, request: ClientRequest, limit: float | None) -> ClientResult | None:
        """Put `request` to the client as an input request of the task, and wait for its `tasks/update`.

        An elicitation the client cannot be asked, or that the task outlived, is declined here, with
        the reason in `_meta` (mcpmux's fallback would tell the model behind whatever call is in flight
        on the upstream, maybe another client's); None for anything else (roots: the configured ones).
        `TimeoutError` past `limit`. No other client is ever asked about the task.
        """
        if not isinstance(request, types.ElicitRequest):
            return None
        if not self._takes(request):
            return self._decline(request, "its client did not declare elicitation (url mode for a url one)")
        params = request.params.model_dump(by_alias=True, mode="json", exclude_none=True)
        key = f"elicitation-{next(self._keys)}"
        question = _Question({"method": request.method, "params": wire.without_meta(params, RELATED_TASK)})
        self._questions[key] = question
        try:
            with anyio.fail_after(limit):
                await question.answered.wait()
        finally:
            del self._questions[key]
        return question.answer or self._decline(request, "the task ended before its client answered")

    def _decline(self, request: types.ElicitRequest, why: str) -> types.ElicitResult:
        reason = (
            f"mcpmux declined upstream {self.upstream.name!r}'s elicitation ({request.params.message!r}) for "
            f"task {self.upstream_id!r}: {why}"
        )
        logger.info("%s", reason)
        return types.ElicitResult(action="decline", _meta={REASON_META: reason})

    async def _ask(self, method: str) -> dict[str, Any]:
        """The upstream's answer to `tasks/get` or `tasks/cancel` on the task, on its own session."""
        if self.client is None or self.client is not self.upstream.client:
            raise wire.not_found(self.upstream_id)  # the session it lived on is gone, and the task with it

        async def send(client: Client) -> dict[str, Any]:
            return await wire.legacy_request(client, method, {"taskId": self.upstream_id})

        answer: dict[str, Any] = await self.upstream.request(f"{method} for task {self.upstream_id!r}", send)
        return answer
