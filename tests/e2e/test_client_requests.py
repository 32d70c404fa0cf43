"""Upstream requests to the client through mcpmux: elicitation (form and url), roots, logging levels.

Real parts only: npm `server-everything` (2025-11-25) through `mcpmux serve` (stdio and HTTP fronts)
compared with the same server connected directly, by a real `mcp.Client` that declares elicitation
and roots; and this module run as an SDK 2.3 server (`python -m tests.e2e.test_client_requests`,
forced to 2025-11-25 with `protocol = "legacy"`) for what server-everything lacks: completion
notifications, timeouts, configured roots, list_changed counts, log levels.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import StdioServerParameters
from mcp.server.elicitation import AcceptedElicitation, ElicitationResult
from mcp.server.mcpserver import Context, Elicit, ListRoots, MCPServer, Resolve, Sample
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

from mcpmux import Mux
from mcpmux.core.config import config_from_dict
from mcpmux.core.inbound import can_answer
from mcpmux.errors import ConfigError
from mcpmux.mux.ask_policies import REASON_META
from mcpmux.server.frontend import Frontend
from tests.e2e.conftest import (
    EVERYTHING,
    ROOT,
    everything_available,
    mux_over_http,
    mux_over_stdio,
    served_in_process,
    text_of,
)

# -- the upstream server (this module run with -m) ---------------------------------------------------

upstream = MCPServer("asks-the-client")
roots_changes: list[int] = []
SCHEMA: types.ElicitRequestedSchema = {
    "type": "object",
    "properties": {"name": {"type": "string", "title": "Name"}},
    "required": ["name"],
}


outcomes: dict[str, str] = {}


@upstream.tool()
async def form(message: str, ctx: Context) -> dict[str, Any]:
    """Ask the user a form; return their answer (and remember how it ended, by message)."""
    try:
        answer = await ctx.session.elicit_form(message, SCHEMA, related_request_id=ctx.request_id)
    except MCPError as err:
        outcomes[message] = f"error: {err.error.message}"
        raise
    except anyio.get_cancelled_exc_class():
        outcomes[message] = "cancelled"
        raise
    outcomes[message] = answer.action
    return {"action": answer.action, "content": answer.content, "meta": answer.meta}


@upstream.tool()
def form_outcome(message: str) -> str:
    """How the form elicitation with this message ended ("" while it has not)."""
    return outcomes.get(message, "")


@upstream.tool()
async def url(address: str, elicitation_id: str, ctx: Context) -> str:
    """Send the user to a URL, then say the flow completed (notifications/elicitation/complete)."""
    answer = await ctx.session.elicit_url("Open this to sign in.", address, elicitation_id, ctx.request_id)
    if answer.action == "accept":
        await ctx.session.send_elicit_complete(elicitation_id, ctx.request_id)
    return answer.action


@upstream.tool()
async def roots(ctx: Context) -> list[str]:
    """The roots the client gives."""
    listed = await ctx.session.list_roots()
    return [str(root.uri) for root in listed.roots]


@upstream.tool()
def roots_changed() -> int:
    """How many notifications/roots/list_changed arrived."""
    return len(roots_changes)


@upstream.tool()
async def logs(ctx: Context) -> str:
    """Log once at each of four levels during the call."""
    for level in ("debug", "info", "warning", "error"):
        await ctx.session.send_log_message(level, f"at {level}", related_request_id=ctx.request_id)
    return "logged"


class Name(BaseModel):
    name: str


def ask_name(message: str) -> Elicit[Name]:
    return Elicit(message, Name)


def the_roots() -> ListRoots:
    return ListRoots()


@upstream.tool()
async def resolved(
    message: str,
    answer: Annotated[ElicitationResult[Name], Resolve(ask_name)],
    listed: Annotated[types.ListRootsResult, Resolve(the_roots)],
) -> dict[str, Any]:
    """Ask the user and the client's roots the era's way (pushed in 2025, input-required rounds in 2026)."""
    name = answer.data.name if isinstance(answer, AcceptedElicitation) else None
    return {"action": answer.action, "name": name, "roots": [str(root.uri) for root in listed.roots]}


LOOKUP = types.Tool(name="lookup", input_schema={"type": "object"})


def sample_with_a_tool(prompt: str) -> Sample:
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))
    return Sample([message], max_tokens=16, tools=[LOOKUP])


@upstream.tool()
async def tool_use(
    prompt: str, result: Annotated[types.CreateMessageResultWithTools, Resolve(sample_with_a_tool)]
) -> dict[str, Any]:
    """Sample with a tool the model may call (2025-11-25 sampling with tools; needs sampling.tools)."""
    blocks = result.content if isinstance(result.content, list) else [result.content]
    return {"stop_reason": result.stop_reason, "blocks": [block.type for block in blocks]}


async def _count_roots_change(ctx: Any, params: types.NotificationParams) -> None:
    roots_changes.append(1)


upstream._lowlevel_server.add_notification_handler(
    "notifications/roots/list_changed", types.NotificationParams, _count_roots_change
)

# -- tests ---------------------------------------------------------------------------------------------

pytestmark = pytest.mark.anyio
PY = sys.executable
ROOT_URI = "file:///home/user/project"
CONFIGURED_ROOT = "file:///srv/configured"
needs_everything = pytest.mark.skipif(not everything_available(), reason="server-everything is not installed")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


class Person:
    """The client side: answers elicitations (accepting forms with a name, urls as opened) and gives roots."""

    def __init__(self, action: str = "accept", delay: float = 0.0) -> None:
        self.action = action
        self.delay = delay
        self.asked: list[types.ElicitRequestParams] = []
        self.completed: list[str] = []
        self.cancelled: list[str] = []

    async def elicit(self, context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params)
        try:
            await anyio.sleep(self.delay)
        except anyio.get_cancelled_exc_class():
            self.cancelled.append(params.message)
            raise
        if self.action != "accept":
            return types.ElicitResult(action=self.action)  # type: ignore[arg-type]
        if isinstance(params, types.ElicitRequestURLParams):
            return types.ElicitResult(action="accept")
        return types.ElicitResult(action="accept", content=_answers(params.requested_schema))

    async def sample(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools:
        if params.tools:
            use = types.ToolUseContent(type="tool_use", name=params.tools[0].name, id="use-1", input={})
            return types.CreateMessageResultWithTools(
                role="assistant", content=[use], model="person", stop_reason="toolUse"
            )
        reply = types.TextContent(type="text", text="a reply")
        return types.CreateMessageResult(role="assistant", content=reply, model="person", stop_reason="endTurn")

    async def roots(self, context: ClientRequestContext) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=ROOT_URI, name="project")])  # type: ignore[arg-type]

    async def messages(self, message: Any) -> None:
        if isinstance(message, types.ElicitCompleteNotification):
            self.completed.append(message.params.elicitation_id)

    def client_args(self) -> dict[str, Any]:
        return {
            "elicitation_callback": self.elicit,
            "sampling_callback": self.sample,
            "sampling_capabilities": types.SamplingCapability(tools=types.SamplingToolsCapability()),
            "list_roots_callback": self.roots,
            "message_handler": self.messages,
        }


def _answers(schema: dict[str, Any]) -> dict[str, Any]:
    """A valid answer for each property of a requested schema (what a person would type)."""
    out: dict[str, Any] = {}
    for key, prop in schema.get("properties", {}).items():
        kind = prop.get("type")
        if "enum" in prop:
            out[key] = prop["enum"][0]
        elif "oneOf" in prop:
            out[key] = prop["oneOf"][0]["const"]
        elif kind == "boolean":
            out[key] = True
        elif kind in ("number", "integer"):
            out[key] = prop.get("minimum", 1)
        elif kind == "array":
            items = prop.get("items", {})
            choices = items.get("enum") or [choice["const"] for choice in items.get("anyOf", [])]
            out[key] = choices[:1]
        elif prop.get("format") == "email":
            out[key] = "ada@example.com"
        elif prop.get("format") == "uri":
            out[key] = "https://example.com"
        elif prop.get("format") == "date":
            out[key] = "1815-12-10"
        else:
            out[key] = prop.get("default", "Ada")
    return out


def _everything_table() -> dict[str, Any]:
    return {"command": "node", "args": [str(EVERYTHING), "stdio"]}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _everything_config(folder: Path) -> Path:
    return _write(
        folder / "everything.toml",
        f'[inference]\nbackend = "off"\n[servers.everything]\ncommand = "node"\nargs = ["{EVERYTHING}", "stdio"]\n',
    )


async def _direct_everything(person: Person) -> AsyncIterator[Client]:
    params = StdioServerParameters(command="node", args=[str(EVERYTHING), "stdio"], env=dict(os.environ))
    async with Client(params, **person.client_args()) as client:
        yield client


PREFIX = "everything__"
CAPABILITY_TOOLS = {"get-roots-list", "trigger-elicitation-request", "trigger-url-elicitation"}
# mcpmux takes sampling and elicitation as tasks upstream, for any client (`mcpmux.upstream.task_receiver`):
# server-everything lists these for it, which a client that declares no tasks does not get directly.
TASK_TOOLS = {"trigger-sampling-request-async", "trigger-elicitation-request-async"}


async def _everything_answers(client: Client, prefix: str) -> dict[str, str]:
    """What the capability tools of server-everything answer one client (roots, form, url)."""
    await anyio.sleep(0.5)  # server-everything asks for roots 350 ms after it is initialized
    out: dict[str, str] = {}
    out["roots"] = text_of(await client.call_tool(f"{prefix}get-roots-list", {}))
    out["form"] = text_of(await client.call_tool(f"{prefix}trigger-elicitation-request", {}))
    arguments = {"url": "https://example.com/login", "elicitationId": "fixed-id"}
    out["url"] = text_of(await client.call_tool(f"{prefix}trigger-url-elicitation", arguments))
    out["setLevel"] = repr(await client.set_logging_level("warning"))  # -32601 through mcpmux before
    return out


@needs_everything
@pytest.mark.parametrize("front", ["stdio", "http"])
async def test_server_everything_through_mcpmux_equals_direct(tmp_path: Path, front: str) -> None:
    direct_person, mux_person = Person(), Person()
    async for direct in _direct_everything(direct_person):
        direct_tools = {tool.name for tool in (await direct.list_tools()).tools}
        direct_answers = await _everything_answers(direct, "")
    assert direct_tools >= CAPABILITY_TOOLS
    config = _everything_config(tmp_path)
    if front == "stdio":
        async with mux_over_stdio(config, mode="legacy", **mux_person.client_args()) as client:
            mux_tools = {tool.name for tool in (await client.list_tools()).tools}
            mux_answers = await _everything_answers(client, PREFIX)
    else:
        with mux_over_http(config) as address:
            async with Client(address, mode="legacy", **mux_person.client_args()) as client:
                mux_tools = {tool.name for tool in (await client.list_tools()).tools}
                mux_answers = await _everything_answers(client, PREFIX)
    assert {name.removeprefix(PREFIX) for name in mux_tools if name.startswith(PREFIX)} == direct_tools | TASK_TOOLS
    assert mux_answers == direct_answers
    assert ROOT_URI in mux_answers["roots"]
    assert "fixed-id" in mux_answers["url"]
    # The person was asked the same things, the url elicitation unchanged.
    assert [p.model_dump() for p in mux_person.asked] == [p.model_dump() for p in direct_person.asked]


TS_CLIENT = ROOT / "tests" / "e2e" / "ts_client.mjs"
TS_SDK = ROOT / ".npm" / "node_modules" / "@modelcontextprotocol" / "sdk"


async def _ts_client(prefix: str, *command: str) -> dict[str, Any]:
    env = {**os.environ, "MCP_SDK_DIR": str(TS_SDK)}
    with anyio.fail_after(60):
        done = await anyio.run_process(["node", str(TS_CLIENT), prefix, *command], env=env)
    answers: dict[str, Any] = json.loads(done.stdout)
    return answers


@needs_everything
@pytest.mark.skipif(not TS_SDK.exists(), reason="the TypeScript SDK is not installed")
@pytest.mark.parametrize("front", ["stdio", "http"])
async def test_the_typescript_client_gets_through_mcpmux_what_it_gets_direct(tmp_path: Path, front: str) -> None:
    direct = await _ts_client("", "node", str(EVERYTHING), "stdio")
    config = _everything_config(tmp_path)
    if front == "stdio":
        through = await _ts_client(PREFIX, PY, "-m", "mcpmux", "serve", "--config", str(config))
    else:
        with mux_over_http(config) as address:
            through = await _ts_client(PREFIX, address)
    assert set(direct["tools"]) >= CAPABILITY_TOOLS
    assert set(through.pop("tools")) == set(direct.pop("tools")) | TASK_TOOLS
    assert through == direct  # roots, form and url elicitation, logging/setLevel


@needs_everything
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_tool_the_upstream_runs_only_as_a_task_answers_any_client(tmp_path: Path, mode: str) -> None:
    """server-everything's `simulate-research-query` requires task execution: mcpmux runs the task
    and waits for it, so a client that knows nothing of tasks (here in either era) gets the report."""
    async for direct in _direct_everything(Person()):
        refused = await direct.call_tool("simulate-research-query", {"topic": "bees"})
    assert refused.is_error  # called without a task, directly: the upstream refuses
    async with mux_over_stdio(_everything_config(tmp_path), mode=mode) as client:
        result = await client.call_tool(f"{PREFIX}simulate-research-query", {"topic": "bees"})
    assert not result.is_error, text_of(result)
    assert "# Research Report: bees" in text_of(result)


@needs_everything
async def test_a_client_without_elicitation_gets_a_decline_the_model_can_read(tmp_path: Path) -> None:
    async with mux_over_stdio(_everything_config(tmp_path), mode="legacy") as client:
        result = await client.call_tool(f"{PREFIX}trigger-elicitation-request", {})
    text = text_of(result)
    assert "declined" in text.lower()
    assert "no client with a call in flight on it declared elicitation" in text


# -- mcpmux in this process over HTTP, with the SDK server above -----------------------------------------


class Served:
    def __init__(self, mux: Mux, frontend: Frontend, url: str) -> None:
        self.mux = mux
        self.frontend = frontend
        self.url = url


def _table(name: str, extra: str = "") -> str:
    return (
        f'[servers.{name}]\ncommand = "{PY}"\nargs = ["-m", "tests.e2e.test_client_requests"]\n'
        f'cwd = "{ROOT}"\nprotocol = "legacy"\n{extra}'
    )


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    folder = tmp_path_factory.mktemp("client-requests")
    config = _write(
        folder / "mcpmux.toml",
        "\n".join(
            [
                '[inference]\nbackend = "off"\n',
                _table("asks", f'roots = ["{CONFIGURED_ROOT}"]\n[servers.asks.elicitation]\ntimeout = 1.0\n'),
                _table("refuses", '[servers.refuses.elicitation]\npolicy = "decline"\n'),
                # One process for every client: what one client's call left behind, another can read.
                _table("shared", 'sessions = "shared"\n[servers.shared.elicitation]\ntimeout = 1.0\n'),
                _table("modern").replace('protocol = "legacy"', 'protocol = "auto"'),
            ]
        ),
    )
    async with served_in_process(config) as (mux, frontend, url):
        yield Served(mux, frontend, url)


def test_roots_and_elicitation_settings_in_the_config() -> None:
    config = config_from_dict(
        {
            "mux": {"roots": ["/srv/data", {"uri": "file:///home/me", "name": "home"}]},
            "servers": {
                "own": {"command": "x", "roots": [], "elicitation": {"policy": "decline", "timeout": 5}},
                "inherits": {"command": "y"},
            },
        }
    )
    assert [(root.uri, root.name) for root in config.mux.roots] == [
        ("file:///srv/data", None),
        ("file:///home/me", "home"),
    ]
    assert config.servers["own"].roots == []  # none, not [mux] roots
    assert config.servers["inherits"].roots is None
    assert config.servers["own"].elicitation.policy == "decline"
    assert config.servers["inherits"].elicitation.policy == "client"
    with pytest.raises(ConfigError) as raised:
        config_from_dict({"mux": {"roots": ["https://example.com"]}})
    assert "a root must be a file:// URI or an absolute path" in str(raised.value)


async def test_form_elicitation_reaches_the_calling_client(served: Served) -> None:
    person = Person()
    async with Client(served.url, mode="legacy", **person.client_args()) as client:
        result = await client.call_tool("asks__form", {"message": "Who are you?"})
    assert not result.is_error, text_of(result)
    assert result.structured_content == {"action": "accept", "content": {"name": "Ada"}, "meta": None}
    assert [p.message for p in person.asked] == ["Who are you?"]


async def test_url_elicitation_and_its_completion_reach_the_client(served: Served) -> None:
    person = Person()
    async with Client(served.url, mode="legacy", **person.client_args()) as client:
        result = await client.call_tool("asks__url", {"address": "https://example.com/a", "elicitation_id": "e-1"})
        with anyio.fail_after(5):
            while not person.completed:
                await anyio.sleep(0.02)
    assert text_of(result) == "accept"
    assert isinstance(person.asked[0], types.ElicitRequestURLParams)
    assert person.asked[0].url == "https://example.com/a"
    assert person.completed == ["e-1"]


async def test_a_declining_client_has_the_last_word(served: Served) -> None:
    person = Person(action="decline")
    async with Client(served.url, mode="legacy", **person.client_args()) as client:
        result = await client.call_tool("asks__form", {"message": "Who?"})
    assert result.structured_content == {"action": "decline", "content": None, "meta": None}


async def test_without_the_capability_the_upstream_is_declined_with_a_reason(served: Served) -> None:
    async with Client(served.url, mode="legacy") as client:  # declares neither elicitation nor roots
        result = await client.call_tool("asks__form", {"message": "Who?"})
        roots = await client.call_tool("asks__roots", {})
    assert result.structured_content is not None
    assert result.structured_content["action"] == "decline"
    reason = result.structured_content["meta"][REASON_META]
    assert "declared elicitation" in reason
    assert result.content[-1] == types.TextContent(type="text", text=reason)  # the note for the model, last
    assert roots.structured_content == {"result": [CONFIGURED_ROOT]}  # [servers.asks] roots


@pytest.mark.parametrize(
    ("declared", "form", "url"),
    [
        ({}, False, False),
        ({"elicitation": {}}, True, False),  # the spec: an empty object is form mode only
        ({"elicitation": {"form": {}}}, True, False),
        ({"elicitation": {"url": {}}}, False, True),
        ({"elicitation": {"form": {}, "url": {}}}, True, True),
    ],
)
def test_which_clients_can_answer_which_elicitation(declared: dict[str, Any], form: bool, url: bool) -> None:
    capabilities = types.ClientCapabilities.model_validate(declared)
    form_request = types.ElicitRequest(params=types.ElicitRequestFormParams(message="m", requested_schema=SCHEMA))
    url_params = types.ElicitRequestURLParams(message="m", url="https://example.com", elicitation_id="e")
    assert can_answer(capabilities, form_request) is form
    assert can_answer(capabilities, types.ElicitRequest(params=url_params)) is url


async def test_policy_decline_never_asks(served: Served) -> None:
    person = Person()
    async with Client(served.url, mode="legacy", **person.client_args()) as client:
        result = await client.call_tool("refuses__form", {"message": "Who?"})
    assert person.asked == []
    assert result.structured_content is not None
    assert result.structured_content["action"] == "decline"
    assert 'policy = "decline"' in text_of(result)


async def test_a_client_that_does_not_answer_in_time_is_cancelled(served: Served) -> None:
    person = Person(delay=5.0)  # [servers.asks.elicitation] timeout = 1.0
    async with Client(served.url, mode="legacy", **person.client_args()) as client:
        with anyio.fail_after(10), pytest.raises(MCPError) as raised:
            await client.call_tool("asks__form", {"message": "Slow?"})
        with anyio.fail_after(5):
            while not person.cancelled:  # mcpmux withdrew its request: notifications/cancelled
                await anyio.sleep(0.02)
    # The upstream got mcpmux's error and raised it: the SDK server answers that with a JSON-RPC error.
    assert "did not answer the elicitation within 1s" in raised.value.error.message
    assert person.cancelled == ["Slow?"]


async def test_a_2026_client_answers_elicitation_and_roots_in_input_required_rounds(served: Served) -> None:
    person = Person()
    async with Client(served.url, mode="auto", **person.client_args()) as client:
        assert client.protocol_version == "2026-07-28"
        form = await client.call_tool("asks__form", {"message": "Who, in 2026?"})
        roots = await client.call_tool("asks__roots", {})
        link = await client.call_tool("asks__url", {"address": "https://example.com/c", "elicitation_id": "e-3"})
    assert form.structured_content == {"action": "accept", "content": {"name": "Ada"}, "meta": None}
    assert roots.structured_content == {"result": [ROOT_URI]}
    assert text_of(link) == "accept"
    assert [p.message for p in person.asked] == ["Who, in 2026?", "Open this to sign in."]


@pytest.mark.parametrize("client_mode", ["legacy", "auto"])
@pytest.mark.parametrize("name", ["asks", "modern"])
async def test_every_era_pair_elicits_and_lists_roots(served: Served, name: str, client_mode: str) -> None:
    eras = {status.name: status.protocol_version for status in served.mux.status()}
    assert eras[name] == ("2026-07-28" if name == "modern" else "2025-11-25")
    person = Person()
    async with Client(served.url, mode=client_mode, **person.client_args()) as client:
        result = await client.call_tool(f"{name}__resolved", {"message": f"{name} asks"})
    assert not result.is_error, text_of(result)
    assert result.structured_content == {"action": "accept", "name": "Ada", "roots": [ROOT_URI]}
    assert [p.message for p in person.asked] == [f"{name} asks"]


async def test_a_client_that_disconnects_mid_elicitation_leaves_nothing_waiting(served: Served) -> None:
    gone = Person(delay=60.0)
    with anyio.move_on_after(30) as scope:
        async with (
            Client(served.url, mode="legacy", **gone.client_args()) as client,
            anyio.create_task_group() as tasks,
        ):
            tasks.start_soon(client.call_tool, "shared__form", {"message": "Still there?"})
            while not gone.asked:
                await anyio.sleep(0.02)
            tasks.cancel_scope.cancel()  # the client goes away with the question open
    assert not scope.cancelled_caught
    person = Person()
    async with Client(served.url, mode="legacy", **person.client_args()) as client:
        with anyio.fail_after(10):
            while not (outcome := text_of(await client.call_tool("shared__form_outcome", {"message": "Still there?"}))):
                await anyio.sleep(0.1)
        # The client's going away cancelled its call, so the upstream's call and its elicitation (or, had the
        # cancellation been lost, the elicitation timeout: 1 s here) ended; others are served.
        assert outcome == "cancelled" or outcome.startswith("error: "), outcome
        result = await client.call_tool("shared__form", {"message": "Next?"})
    assert result.structured_content is not None
    assert result.structured_content["action"] == "accept"
    assert served.mux.calls.in_flight("shared") == 0  # no call left recorded in flight


async def test_two_clients_with_different_capabilities_on_one_upstream_at_once(served: Served) -> None:
    able = Person(delay=0.5)  # answers within the 1 s elicitation timeout
    results: dict[str, types.CallToolResult] = {}
    async with (
        Client(served.url, mode="legacy", **able.client_args()) as first,
        Client(served.url, mode="legacy") as second,  # declares nothing
        anyio.create_task_group() as tasks,
    ):

        async def call(client: Client, key: str) -> None:
            results[key] = await client.call_tool("asks__form", {"message": key})

        tasks.start_soon(call, first, "first")
        with anyio.fail_after(30):  # the first call may start a session of the client's own first
            while not able.asked:
                await anyio.sleep(0.01)
        await call(second, "second")  # while the first client's question is open
    # Each request went to the client of the most recent call, never to the other client.
    assert [p.message for p in able.asked] == ["first"]
    assert results["first"].structured_content is not None
    assert results["first"].structured_content["action"] == "accept"
    assert results["second"].structured_content is not None
    assert results["second"].structured_content["action"] == "decline"
    assert "declared elicitation" in text_of(results["second"])


@pytest.mark.parametrize("client_mode", ["legacy", "auto"])
@pytest.mark.parametrize("name", ["asks", "modern"])
async def test_sampling_with_tools_reaches_a_client_that_declared_it(
    served: Served, name: str, client_mode: str
) -> None:
    person = Person()
    async with Client(served.url, mode=client_mode, **person.client_args()) as client:
        result = await client.call_tool(f"{name}__tool_use", {"prompt": "Look it up."})
    assert not result.is_error, text_of(result)
    assert result.structured_content == {"stop_reason": "toolUse", "blocks": ["tool_use"]}


async def test_roots_come_from_the_calling_client(served: Served) -> None:
    person = Person()
    async with Client(served.url, mode="legacy", **person.client_args()) as client:
        result = await client.call_tool("asks__roots", {})
    assert result.structured_content == {"result": [ROOT_URI]}


async def test_roots_list_changed_is_passed_on(served: Served) -> None:
    person = Person()
    async with Client(served.url, mode="legacy", **person.client_args()) as client:
        before = (await client.call_tool("asks__roots_changed", {})).structured_content
        assert before is not None
        await client.session.send_notification(types.RootsListChangedNotification())
        with anyio.fail_after(5):
            while True:
                after = (await client.call_tool("asks__roots_changed", {})).structured_content
                assert after is not None
                if after["result"] > before["result"]:
                    break
                await anyio.sleep(0.05)


async def test_each_client_hears_logs_at_its_own_level(served: Served) -> None:
    heard: dict[str, list[str]] = {"warning": [], "all": []}

    def listener(key: str) -> Any:
        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            heard[key].append(params.level)

        return on_log

    async with (
        Client(served.url, mode="legacy", logging_callback=listener("warning")) as picky,
        Client(served.url, mode="legacy", logging_callback=listener("all")) as everything,
    ):
        await picky.set_logging_level("warning")
        assert (await picky.call_tool("asks__logs", {})).content
        assert (await everything.call_tool("asks__logs", {})).content
    # Logs of a call outside the SDK path's tracking reach every 2025 client (docs/design.md), each at its level.
    assert set(heard["warning"]) == {"warning", "error"}
    assert {"debug", "info", "warning", "error"} <= set(heard["all"])


@pytest.mark.parametrize("name", ["asks", "modern"])
async def test_a_2026_client_hears_logs_at_its_per_request_level(served: Served, name: str) -> None:
    heard: list[str] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        heard.append(params.level)

    async with Client(served.url, mode="auto", log_level="warning", logging_callback=on_log) as client:
        assert client.protocol_version == "2026-07-28"
        assert (await client.call_tool(f"{name}__logs", {})).content
    assert heard == ["warning", "error"]


if __name__ == "__main__":
    upstream.run("stdio")
