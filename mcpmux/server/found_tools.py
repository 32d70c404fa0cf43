"""`[mux] tool_search_expose = "listing"`: the tools a session found with `mux_search_tools` join its
`tools/list`, and the session is sent `notifications/tools/list_changed` when its listing grows.

MCP gives a client no capability that says it acts on `tools/list_changed`; a 2025 session has the
channel for it (stdio, or the HTTP session's stream), so each is told. A 2026-07-28 request has no
session to remember anything for: there, as with "call", found tools stay callable through
`mux_call_tool` or by name, and the listing does not change. What a session found is forgotten
when it ends.
"""

from __future__ import annotations

import logging
import weakref

import mcp_types as types
from mcp.server.connection import Connection
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpmux.core.inbound import Caller
from mcpmux.mux.multiplexer import Mux

logger = logging.getLogger(__name__)


class FoundTools:
    """Per 2025 session, the tool names `mux_search_tools` returned to it (when exposed as "listing")."""

    def __init__(self, mux: Mux, client_ids: weakref.WeakKeyDictionary[Connection, str]) -> None:
        self.mux = mux
        self._client_ids = client_ids
        """The front's client id per connection (`Frontend._client_id`): what `Caller.client` holds."""
        self._found: weakref.WeakKeyDictionary[Connection, set[str]] = weakref.WeakKeyDictionary()

    async def found(self, caller: Caller, names: list[str]) -> None:
        """`mux_search_tools` answered `caller` with `names`: they join its session's listing, which it is told of."""
        connection = next((conn for conn, known in list(self._client_ids.items()) if known == caller.client), None)
        if connection is None or connection.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return
        seen = self._found.setdefault(connection, set())
        if seen.issuperset(names):
            return
        seen.update(names)
        try:
            await connection.send_tool_list_changed()
        except Exception as err:  # a client that went away: nothing to tell
            logger.debug("could not tell a client its listing grew: %s", err)

    def listing(self, connection: Connection, caller: Caller) -> list[types.Tool]:
        """What tools/list shows this session: the listing of its profile (as it sees it), then the tools it found."""
        listed = self.mux.listed_tools(caller.profile, caller)
        found = self._found.get(connection)
        if not found:
            return listed
        shown = {tool.name for tool in listed}
        everything = self.mux.list_tools(caller.profile, caller)
        return listed + [tool for tool in everything if tool.name in found and tool.name not in shown]
