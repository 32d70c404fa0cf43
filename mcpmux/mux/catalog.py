"""The aggregated, namespaced, filtered view of every upstream's tools, resources and prompts.

Tools and prompts are renamed by `naming.public_name` (`server__tool`); resources keep their URIs
(clients show and store them) and are routed by exact URI, then by the first upstream whose
resource template matches the URI.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any, Protocol

import mcp_types as types

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

    def rebuild(self, sources: Iterable[ListingSource], local_names: Iterable[str] = ()) -> None:
        """Recompute the whole view; local tools (mcpmux's own) keep their names and win collisions."""
        sources = list(sources)
        prefix = self.prefix_single or len(sources) > 1
        self.tools, self._tool_routes, self.input_schemas = [], {}, {}
        self.prompts, self._prompt_routes = [], {}
        self.resources, self._resource_routes = [], {}
        self.resource_templates, self._template_routes = [], []
        taken = set(local_names)
        profile = self.profile
        for source in sources:
            if profile is not None and not profile.allows_server(source.name):
                continue
            for tool in source.listing.tools:
                if not source.allows_tool(tool.name):
                    continue
                name = public_name(source.name, tool.name, self.separator, prefix, taken)
                if profile is not None and not profile.allows_tool(name):
                    continue
                taken.add(name)
                self.tools.append(tool.model_copy(update={"name": name}))
                self._tool_routes[name] = Route(source.name, tool.name)
                self.input_schemas[name] = tool.input_schema
            prompt_names: set[str] = set(self._prompt_routes)
            for prompt in source.listing.prompts:
                name = public_name(source.name, prompt.name, self.separator, prefix, prompt_names)
                prompt_names.add(name)
                self.prompts.append(prompt.model_copy(update={"name": name}))
                self._prompt_routes[name] = Route(source.name, prompt.name)
            for resource in source.listing.resources:
                uri = str(resource.uri)
                if uri not in self._resource_routes:
                    self._resource_routes[uri] = source.name
                    self.resources.append(resource)
            for template in source.listing.resource_templates:
                self.resource_templates.append(template)
                self._template_routes.append((_template_regex(template.uri_template), source.name))

    def resolve_tool(self, name: str) -> Route:
        route = self._tool_routes.get(name)
        if route is None:
            raise UnknownToolError(_unknown("tool", name, self._tool_routes))
        return route

    def resolve_prompt(self, name: str) -> Route:
        route = self._prompt_routes.get(name)
        if route is None:
            raise UnknownToolError(_unknown("prompt", name, self._prompt_routes))
        return route

    def resolve_resource(self, uri: str) -> str:
        upstream = self._resource_routes.get(uri)
        if upstream is not None:
            return upstream
        for pattern, owner in self._template_routes:
            if pattern.fullmatch(uri):
                return owner
        raise UnknownToolError(_no_resource(uri))


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
        route = self._routes.get(name)
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
        """The upstream of `uri` among the view's servers: its listed resource's, else the first whose
        template matches (another server may offer the same template outside the view)."""
        owner = self.catalog._resource_routes.get(uri)
        if owner is not None and self.allows_server(owner):
            return owner
        for pattern, server in self.catalog._template_routes:
            if self.allows_server(server) and pattern.fullmatch(uri):
                return server
        raise UnknownToolError(_no_resource(uri))


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
