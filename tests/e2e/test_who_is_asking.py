"""Who is asking: each client's questions, answers, roots, logs and progress stay its own, end to end.

Several real `mcp.Client`s (each with its own bearer token, name, root and tag) share one mcpmux HTTP
front and call the same upstream at once (`tests/servers/asking_server.py`: `whoami` elicits a name,
`myroots` lists roots, `tell` logs and reports progress), over every era pair, stdio and HTTP
upstreams, fast path and SDK path. Nothing of one client may reach another: what it answers, what it
is asked, what it hears. Where the wire links a request to its call (HTTP upstreams, 2026-07-28), the
shared session serves everyone; a 2025 stdio upstream links nothing, and sessions of each client's
own (`sessions = "per-client"`) are the exact answer. Then those sessions' life: bounded, reaped,
restarted; and the client's own extensions reaching the upstream (a server that shows MCP Apps tools
only to hosts that declare the extension).
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.extension import advertise
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.e2e.conftest import ROOT, free_port, served_in_process, stop, text_of, wait_for_port

pytestmark = pytest.mark.anyio
ASKING = ROOT / "tests" / "servers" / "asking_server.py"
PY = sys.executable
UI = "io.modelcontextprotocol/ui"


@dataclass
class Person:
    """One client: answers elicitation with its name, lists its own root, keeps what it was told."""

    name: str
    asked: list[str] = field(default_factory=list)
    heard: list[str] = field(default_factory=list)
    progress: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)

    @property
    def token(self) -> str:
        return f"token-of-{self.name}"

    async def elicit(self, context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": self.name})

    async def roots(self, context: ClientRequestContext) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=f"file:///home/{self.name}")])

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.heard.append(str(params.data))

    def check(self, what: str, seen: str) -> None:
        if self.name not in seen:
            self.wrong.append(f"{what}: {seen!r}")


@asynccontextmanager
async def connected(url: str, person: Person, mode: str, ui: bool = False) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {person.token}"}
    extensions = [advertise(UI, {"mimeTypes": ["text/html;profile=mcp-app"]})] if ui else []
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0, read=None)) as http,
        Client(
            streamable_http_client(url, http_client=http),
            mode=mode,
            elicitation_callback=person.elicit,
            list_roots_callback=person.roots,
            logging_callback=person.log,
            extensions=extensions,
        ) as client,
    ):
        yield client


@contextmanager
def asking_upstream(transport: str) -> Iterator[dict[str, Any]]:
    """The asking server's config entry: a stdio command, or a URL it serves on loopback."""
    if transport == "stdio":
        yield {"command": PY, "args": [str(ASKING)]}
        return
    port = free_port()
    process = subprocess.Popen([PY, str(ASKING), "http", str(port)], stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        yield {"url": f"http://127.0.0.1:{port}/mcp"}
    finally:
        stop(process)


def write_config(folder: Path, server: dict[str, Any], people: list[Person], **mux: Any) -> Path:
    tokens = folder / "tokens"
    tokens.write_text("".join(f"{person.token}\n" for person in people))
    config = {
        "mcpServers": {"who": server},
        "mux": {"tool_search": "off", "meta_tools": False, **mux},
        "http": {"auth_token_file": str(tokens)},
        "inference": {"backend": "off"},
    }
    path = folder / "mcpmux.json"
    path.write_text(json.dumps(config))
    return path


async def everyone_calls(url: str, people: list[Person], mode: str, calls: int, seed: int) -> None:
    """Each person calls `whoami`, `myroots` and `tell` in a random mix, all at once, and checks each answer."""
    rng = random.Random(seed)

    async def one(client: Client, person: Person, tool: str) -> None:
        if tool == "tell":
            tag = f"{person.name}-{rng.randrange(1_000_000)}"

            async def progress(done: float, total: float | None, message: str | None) -> None:
                person.progress.append(message or "")
                person.check("progress", message or "")

            result = await client.call_tool("who__tell", {"tag": tag}, progress_callback=progress)
        else:
            result = await client.call_tool(f"who__{tool}", {"delay_ms": 150})
        assert not result.is_error, text_of(result)
        person.check(tool, text_of(result))

    async def client_of(person: Person) -> None:
        async with connected(url, person, mode) as client, anyio.create_task_group() as tasks:
            for _ in range(calls):
                tasks.start_soon(one, client, person, rng.choice(["whoami", "myroots", "tell"]))

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tasks:
            for person in people:
                tasks.start_soon(client_of, person)
    for person in people:
        assert person.wrong == [], (person.name, person.wrong)
        for line in person.heard:
            person.check("log", line)
        assert person.wrong == [], (person.name, person.wrong)


ROUTES = [
    (transport, upstream_era, client_era, fast)
    for transport in ("stdio", "http")
    for upstream_era in ("legacy", "auto")
    for client_era in ("legacy", "auto")
    for fast in (True, False)
]


@pytest.mark.parametrize(("transport", "upstream_era", "client_era", "fast"), ROUTES)
async def test_nothing_of_one_client_reaches_another(
    tmp_path: Path, transport: str, upstream_era: str, client_era: str, fast: bool
) -> None:
    index = ROUTES.index((transport, upstream_era, client_era, fast))
    people = [Person(f"person{n}") for n in range(2 + index % 7)]  # 2 to 8 clients, across the routes
    with asking_upstream(transport) as server:
        server["protocol"] = upstream_era
        if transport == "stdio" and upstream_era == "legacy":
            server["sessions"] = "per-client"  # nothing on a 2025 stdio pipe says which call a request is for
        config = write_config(tmp_path, server, people, fast_path=fast)
        async with served_in_process(config) as (mux, _, url):
            await everyone_calls(url, people, client_era, calls=6, seed=index)
            own = mux.status()[0].client_sessions
    assert sum(len(person.asked) for person in people) > 0
    # Linked wires serve every client on the one shared session; a 2025 stdio upstream gives each its own.
    # A 2025 client reaches a dual-era upstream through a 2025 session (`mcpmux.mux.sessions`): over
    # HTTP one that the 2025 clients share, over stdio one of each client's own.
    if transport == "stdio" and (upstream_era == "legacy" or client_era == "legacy"):
        assert own == len(people)
    else:
        assert own == (1 if upstream_era == "auto" and client_era == "legacy" else 0)


async def test_auto_refuses_what_it_cannot_attribute_then_gives_each_client_its_own_session(tmp_path: Path) -> None:
    people = [Person("ann"), Person("bea"), Person("cid")]
    with asking_upstream("stdio") as server:
        server["protocol"] = "legacy"
        config = write_config(tmp_path, server, people)
        async with served_in_process(config) as (mux, _, url):
            refused: list[str] = []

            async def burst(person: Person) -> None:
                async with connected(url, person, "legacy") as client:
                    try:
                        result = await client.call_tool("who__whoami", {"delay_ms": 300})
                    except MCPError as err:  # the upstream passed the refusal on as its error
                        refused.append(err.error.message)
                        return
                    if result.is_error:
                        refused.append(text_of(result))
                    else:
                        person.check("whoami", text_of(result))

            async with anyio.create_task_group() as tasks:
                for person in people:
                    tasks.start_soon(burst, person)
            for person in people:
                assert person.wrong == []  # refused or answered, never another's
            assert all("cannot tell which of its clients" in text for text in refused)
            # From now on each client has a session of its own: every question is answered, by its client.
            await everyone_calls(url, people, "legacy", calls=4, seed=1)
            # A 2025 client is its session: everyone_calls' sessions have one each, and a burst client
            # isolated in time keeps its own until it has been idle `client_session_idle`.
            assert len(people) <= mux.status()[0].client_sessions <= 2 * len(people)


async def test_a_client_declaring_the_apps_extension_sees_the_tools_the_server_shows_such_hosts(
    tmp_path: Path,
) -> None:
    host, plain = Person("host"), Person("plain")
    for era in ("legacy", "auto"):
        with asking_upstream("stdio") as server:
            server["protocol"] = era
            config = write_config(tmp_path, server, [host, plain])
            async with (
                served_in_process(config) as (_, _, url),
                connected(url, host, era, ui=True) as with_ui,
                connected(url, plain, era) as without,
            ):
                shown = {tool.name for tool in (await with_ui.list_tools()).tools}
                hidden = {tool.name for tool in (await without.list_tools()).tools}
                assert "who__view" in shown, era
                assert "who__view" not in hidden, era
                assert text_of(await with_ui.call_tool("who__view", {})) == "a view"
                with pytest.raises(MCPError, match="unknown tool 'who__view'"):
                    await without.call_tool("who__view", {})


async def test_per_client_sessions_are_bounded_reaped_and_restarted(tmp_path: Path) -> None:
    people = [Person("ann"), Person("bea"), Person("cid")]
    with asking_upstream("stdio") as server:
        server.update(protocol="legacy", sessions="per-client")
        config = write_config(tmp_path, server, people, max_client_sessions=2, client_session_idle=3.0)
        async with served_in_process(config) as (mux, _, url):
            pids: dict[str, int] = {}
            for person in people:  # one after another: the third takes the least recently used one's place
                async with connected(url, person, "legacy") as client:
                    pids[person.name] = int(text_of(await client.call_tool("who__pid", {})))
                    assert mux.status()[0].client_sessions <= 2
            assert len(set(pids.values())) == 3  # each its own process
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {people[0].token}"}) as http:
                scraped = (await http.get(url.replace("/mcp", "/metrics"))).text
            gauge = re.search(r'mcpmux_upstream_client_sessions\{upstream="who"\} (\S+)', scraped)
            assert gauge is not None
            assert 1 <= float(gauge.group(1)) <= 2  # the least recently used one may be idle long enough to go
            async with connected(url, people[2], "legacy") as client:
                await client.call_tool("who__crash", {})
                with anyio.fail_after(30):  # its supervisor starts it again
                    while (result := await client.call_tool("who__pid", {})).is_error:
                        await anyio.sleep(0.1)
                assert int(text_of(result)) != pids["cid"]
            with anyio.fail_after(30):  # idle for 3 s: stopped
                while mux.status()[0].client_sessions:
                    await anyio.sleep(0.2)
