"""The aggregated, namespaced, filtered view of every upstream's tools, resources and prompts.

Tools and prompts are renamed by `naming.public_name` (`server__tool`); resources keep their URIs
(clients show and store them) and are routed by exact URI, then by the first upstream whose
resource template matches the URI. `ui://` URIs (MCP Apps views) are the exception: where tool
names are prefixed, they are named after their server (`mcpmux.core.apps`), and a named one routes
to its server whether or not that server lists it.

A view calls its server's tools by their own names (`read_pdf_bytes`, not `pdf__read_pdf_bytes`):
the host hands mcpmux, as it would the server, whatever the view's HTML says. Nothing in such a call
says which view made it (the host forwards the view's `tools/call` as it is), so a name the catalog
does not list is taken as a view's bare name: it routes to the one server with MCP Apps views (a tool
with `_meta.ui.resourceUri`) that has a tool of that name its views may call, and where several
have one, the error names them. A view's `resources/read` of its server's own `ui://` URI is routed
the same way.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any, Protocol

import mcp_types as types

from mcpmux.core import apps
from mcpmux.core.config import ProfileSettings
from mcpmux.core.naming import public_name
from mcpmux.errors import UnknownToolError
from mcpmux.upstream.session_io import Listing


class ListingSource(Protocol):
    name: str
    listing: Listing

    def allows_tool(self, tool: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class Route:
    """Where a public name goes: the upstream and the name it has there."""

    upstream: str
    name: str


@dataclass(slots=True)
class Catalog:
    separator: str = "__"
    prefix_single: bool = True
    profile: ProfileSettings | None = None
    """Only the servers and tools this profile allows are in the view (`mcpmux serve --profile`)."""
    tools: list[types.Tool] = field(default_factory=list)
    prompts: list[types.Prompt] = field(default_factory=list)
    resources: list[types.Resource] = field(default_factory=list)
    resource_templates: list[types.ResourceTemplate] = field(default_factory=list)
    _tool_routes: dict[str, Route] = field(default_factory=dict)
    input_schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Public tool name -> its input schema: the SDK checks 2026 `Mcp-Param` headers against it."""
    _prompt_routes: dict[str, Route] = field(default_factory=dict)
    _resource_routes: dict[str, str] = field(default_factory=dict)
    _template_routes: list[tuple[re.Pattern[str], str]] = field(default_factory=list)
    names_uris: bool = False
    """Whether `ui://` URIs are named after their server: where tool names are prefixed."""
    app_only: set[Route] = field(default_factory=set)
    """The tools only their server's views call (`_meta.ui.visibility` without "model")."""
    _servers: set[str] = field(default_factory=set)
    _public: dict[Route, str] = field(default_factory=dict)
    _bare: dict[str, list[Route]] = field(default_factory=dict)
    """A tool's own name -> the tools of that name views may call, on servers that have views."""
    _views: dict[str, list[str]] = field(default_factory=dict)
    """A server's own `ui://` URI -> the servers that list it or name it as a tool's view."""

    def rebuild(self, sources: Iterable[ListingSource], local_names: Iterable[str] = ()) -> None:
        """Recompute the whole view; local tools (mcpmux's own) keep their names and win collisions."""
        sources = list(sources)
        prefix = self.prefix_single or len(sources) > 1
        self.tools, self._tool_routes, self.input_schemas = [], {}, {}
        self.prompts, self._prompt_routes = [], {}
        self.resources, self._resource_routes = [], {}
        self.resource_templates, self._template_routes = [], []
        self.names_uris, self.app_only, self._servers = prefix, set(), set()
        self._public, self._bare, self._views = {}, {}, {}
        taken = set(local_names)
        profile = self.profile
        for source in sources:
            if profile is not None and not profile.allows_server(source.name):
                continue
            self._servers.add(source.name)
            has_views = prefix and any(apps.resource_uri(tool.meta) for tool in source.listing.tools)
            for tool in source.listing.tools:
                if not source.allows_tool(tool.name):
                    continue
                name = public_name(source.name, tool.name, self.separator, prefix, taken)
                if profile is not None and not profile.allows_tool(name):
                    continue
                taken.add(name)
                route = Route(source.name, tool.name)
                self.tools.append(self._listed_tool(source.name, name, tool))
                self._tool_routes[name] = route
                self.input_schemas[name] = tool.input_schema
                self._public[route] = name
                if apps.app_only(tool.meta):
                    self.app_only.add(route)
                if has_views and apps.app_callable(tool.meta):
                    self._bare.setdefault(tool.name, []).append(route)
                view = apps.resource_uri(tool.meta)
                if view is not None:
                    self._offers_view(view, source.name)
            prompt_names: set[str] = set(self._prompt_routes)
            for prompt in source.listing.prompts:
                name = public_name(source.name, prompt.name, self.separator, prefix, prompt_names)
                prompt_names.add(name)
                self.prompts.append(prompt.model_copy(update={"name": name}))
                self._prompt_routes[name] = Route(source.name, prompt.name)
            for resource in source.listing.resources:
                own = str(resource.uri)
                uri = self.public_uri(source.name, own)
                if own.startswith(apps.SCHEME):
                    self._offers_view(own, source.name)
                if uri not in self._resource_routes:
                    self._resource_routes[uri] = source.name
                    self.resources.append(resource if uri == own else resource.model_copy(update={"uri": uri}))
            for template in source.listing.resource_templates:
                uri_template = self.public_uri(source.name, template.uri_template)
                if uri_template != template.uri_template:
                    template = template.model_copy(update={"uri_template": uri_template})
                self.resource_templates.append(template)
                self._template_routes.append((_template_regex(uri_template), source.name))

    def _listed_tool(self, server: str, name: str, tool: types.Tool) -> types.Tool:
        """The tool as clients list it: its public name, and its view's URI named after its server."""
        meta = apps.named_meta(server, tool.meta) if self.names_uris else None
        return tool.model_copy(update={"name": name} if meta is None else {"name": name, "meta": meta})

    def _offers_view(self, uri: str, server: str) -> None:
        owners = self._views.setdefault(uri, [])
        if server not in owners:
            owners.append(server)

    def public_uri(self, server: str, uri: str) -> str:
        """A URI of `server`'s as clients see it (`mcpmux.core.apps`)."""
        return apps.public_uri(server, uri) if self.names_uris else uri

    def name_result(self, server: str, result: types.CallToolResult) -> types.CallToolResult:
        """A `tools/call` result of `server`'s with its `ui://` URIs as clients see them."""
        return apps.name_result(server, result) if self.names_uris else result

    def name_raw_result(self, server: str, result: Any) -> None:
        """The same, in place, for a raw result (the fast path's)."""
        if self.names_uris:
            apps.name_raw_result(server, result)

    def name_read(self, server: str, result: types.ReadResourceResult) -> types.ReadResourceResult:
        """A `resources/read` result of `server`'s with its `ui://` URIs as clients see them."""
        return apps.name_read(server, result) if self.names_uris else result

    def resolve_tool(self, name: str) -> Route:
        route = self._tool_routes.get(name) or self.bare_route(name, self._tool_routes)
        if route is None:
            raise UnknownToolError(_unknown("tool", name, self._tool_routes))
        return route

    def bare_route(self, name: str, listed: Mapping[str, Route]) -> Route | None:
        """Where a view's call by its server's own tool name `name` goes, among the `listed` tools: the one
        such tool's route, None when there is none; `UnknownToolError` naming them when there are several."""
        found = [route for route in self._bare.get(name, ()) if listed.get(self._public[route]) == route]
        if len(found) > 1:
            names = ", ".join(repr(self._public[route]) for route in found)
            raise UnknownToolError(
                f"tool {name!r} is not listed, and the servers {', '.join(r.upstream for r in found)} each have a "
                f"tool of that name ({names}); a view calls its server's tools by their own names only where one "
                "server has the name: call it by its full name"
            )
        return found[0] if found else None

    def locate_resource(self, uri: str, allows: Callable[[str], bool] = lambda server: True) -> tuple[str, str]:
        """(upstream, the upstream's own URI) of the resource a client names `uri`, among the servers
        `allows` lets it see: a listed URI, a `ui://` URI named after its server (listed or not: a tool's
        view need not be), a server's own `ui://` URI where one server offers it (a view reading its
        server's resources), else the first server whose template matches. `UnknownToolError` if none."""
        owner = self._resource_routes.get(uri)
        if owner is not None and allows(owner):
            return owner, self._own_uri(owner, uri)
        if self.names_uris and uri.startswith(apps.SCHEME):
            split = apps.split_uri(uri)
            if split is not None and split[0] in self._servers and allows(split[0]):
                return split
            owners = [server for server in self._views.get(uri, ()) if allows(server)]
            if len(owners) > 1:
                raise UnknownToolError(
                    f"resource {uri!r} is served by several servers ({', '.join(owners)}): read it as "
                    + " or ".join(repr(apps.public_uri(server, uri)) for server in owners)
                )
            if owners:
                return owners[0], uri
        for pattern, server in self._template_routes:
            if allows(server) and pattern.fullmatch(uri):
                return server, self._own_uri(server, uri)
        raise UnknownToolError(_no_resource(uri))

    def _own_uri(self, server: str, uri: str) -> str:
        split = apps.split_uri(uri) if self.names_uris else None
        return split[1] if split is not None and split[0] == server else uri

    def resolve_prompt(self, name: str) -> Route:
        route = self._prompt_routes.get(name)
        if route is None:
            raise UnknownToolError(_unknown("prompt", name, self._prompt_routes))
        return route

    def resolve_resource(self, uri: str) -> str:
        return self.locate_resource(uri)[0]


@dataclass(slots=True)
class CatalogView:
    """One profile's part of a `Catalog` (and of mcpmux's own tools): what its clients list, find and call.

    Every profile's clients share one `Mux` and its upstream sessions; each view reads the one catalog
    and keeps, per catalog rebuild, the tools its profile allows. A name outside the view is unknown,
    worded as any unknown name is, with suggestions taken from the view alone. `profile` None: all of it.
    """

    catalog: Catalog
    local_tools: Mapping[str, object]
    """The Mux's own tools by name (kept current by the Mux)."""
    always: Set[str]
    """Local tools every profile has (mcpmux's `mux_*` tools); other local tools follow the profile's globs."""
    name: str | None = None
    profile: ProfileSettings | None = None
    _seen: list[types.Tool] | None = None
    _tools: list[types.Tool] = field(default_factory=list)
    _routes: dict[str, Route] = field(default_factory=dict)

    def _current(self) -> None:
        if self._seen is self.catalog.tools:
            return
        self._seen = tools = self.catalog.tools
        profile = self.profile
        if profile is None:
            self._tools, self._routes = tools, self.catalog._tool_routes
            return
        routes = self.catalog._tool_routes
        self._tools = [tool for tool in tools if _allowed(profile, tool.name, routes[tool.name])]
        self._routes = {tool.name: routes[tool.name] for tool in self._tools}

    def tools(self) -> list[types.Tool]:
        """The upstream tools in the view, in catalog order."""
        self._current()
        return self._tools

    def allows_local(self, name: str) -> bool:
        return self.profile is None or name in self.always or self.profile.allows_tool(name)

    def allows(self, name: str) -> bool:
        """Whether the tool `name` (local or upstream) is in the view."""
        if name in self.local_tools:
            return self.allows_local(name)
        self._current()
        return name in self._routes

    def resolve_tool(self, name: str) -> Route:
        self._current()
        route = self._routes.get(name) or self.catalog.bare_route(name, self._routes)
        if route is None:
            raise UnknownToolError(_unknown("tool", name, self._routes))
        return route

    def allows_server(self, name: str) -> bool:
        """Whether the server `name`'s prompts, resources and templates are in the view."""
        return self.profile is None or self.profile.allows_server(name)

    def prompts(self) -> list[types.Prompt]:
        routes = self.catalog._prompt_routes
        return [prompt for prompt in self.catalog.prompts if self.allows_server(routes[prompt.name].upstream)]

    def resources(self) -> list[types.Resource]:
        routes = self.catalog._resource_routes
        return [resource for resource in self.catalog.resources if self.allows_server(routes[str(resource.uri)])]

    def resource_templates(self) -> list[types.ResourceTemplate]:
        pairs = zip(self.catalog.resource_templates, self.catalog._template_routes, strict=True)
        return [template for template, (_, owner) in pairs if self.allows_server(owner)]

    def resolve_prompt(self, name: str) -> Route:
        route = self.catalog.resolve_prompt(name)
        if not self.allows_server(route.upstream):
            inside = {
                key: value for key, value in self.catalog._prompt_routes.items() if self.allows_server(value.upstream)
            }
            raise UnknownToolError(_unknown("prompt", name, inside))
        return route

    def resolve_resource(self, uri: str) -> str:
        """The upstream of `uri` among the view's servers (`Catalog.locate_resource`)."""
        return self.locate_resource(uri)[0]

    def locate_resource(self, uri: str) -> tuple[str, str]:
        """(upstream, its own URI) of `uri` among the view's servers: another server may offer the same
        URI or template outside the view."""
        return self.catalog.locate_resource(uri, self.allows_server)


def _allowed(profile: ProfileSettings, name: str, route: Route) -> bool:
    return profile.allows_server(route.upstream) and profile.allows_tool(name)


def _no_resource(uri: str) -> str:
    return f"no upstream offers resource {uri!r} (it matches no listed resource or template)"


def _unknown(kind: str, name: str, known: dict[str, Route]) -> str:
    close = difflib.get_close_matches(name, list(known), n=3)
    # No count: the client's list holds mcpmux's own tools too (or, in search mode, far fewer), so any
    # number said here disagreed with the one the client sees.
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else f"; none listed is close ({kind}s/list)"
    return f"unknown {kind} {name!r}{hint}"


def _template_regex(template: str) -> re.Pattern[str]:
    """An RFC 6570 template as a regex: `{var}` matches one path segment, `{+var}`/`{#var}` anything."""
    parts: list[str] = []
    for literal, expr in re.findall(r"([^{]*)(\{[^}]*\})?", template):
        parts.append(re.escape(literal))
        if expr:
            parts.append(".*" if expr[1:2] in ("+", "#") else "[^/]*")
    return re.compile("".join(parts))
