"""The aggregated, namespaced, filtered view of every upstream's tools, resources and prompts.

Tools and prompts are renamed by `naming.public_name` (`server__tool`); resources keep their URIs
(clients show and store them) and are routed by exact URI, then by the first upstream whose
resource template matches the URI.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
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
        raise UnknownToolError(f"no upstream offers resource {uri!r} (it matches no listed resource or template)")


def _unknown(kind: str, name: str, known: dict[str, Route]) -> str:
    close = difflib.get_close_matches(name, list(known), n=3)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else f"; {len(known)} {kind}s are listed"
    return f"unknown {kind} {name!r}{hint}"


def _template_regex(template: str) -> re.Pattern[str]:
    """An RFC 6570 template as a regex: `{var}` matches one path segment, `{+var}`/`{#var}` anything."""
    parts: list[str] = []
    for literal, expr in re.findall(r"([^{]*)(\{[^}]*\})?", template):
        parts.append(re.escape(literal))
        if expr:
            parts.append(".*" if expr[1:2] in ("+", "#") else "[^/]*")
    return re.compile("".join(parts))
