"""`ui://` URIs named after their server are valid `ui://` URIs, unique across servers, and undone exactly;
a raw result and the SDK's model of it are named alike (the fast path and the SDK path agree)."""

from __future__ import annotations

import copy

import mcp_types as types
from hypothesis import given
from hypothesis import strategies as st

from mcpmux.core import apps

SERVERS = st.from_regex(r"[A-Za-z0-9_.-]{1,64}", fullmatch=True)  # what the config allows
UI_URIS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40).map(
    lambda rest: f"ui://{rest}"
)


@given(SERVERS, UI_URIS)
def test_a_named_uri_keeps_the_scheme_and_is_undone_exactly(server: str, uri: str) -> None:
    named = apps.public_uri(server, uri)
    assert named.startswith("ui://")
    assert apps.split_uri(named) == (server, uri)


@given(SERVERS, SERVERS, UI_URIS)
def test_two_servers_name_one_uri_apart(first: str, second: str, uri: str) -> None:
    assert (apps.public_uri(first, uri) == apps.public_uri(second, uri)) == (first == second)


def test_other_schemes_are_left_alone() -> None:
    assert apps.public_uri("pdf", "file:///tmp/a.pdf") == "file:///tmp/a.pdf"
    assert apps.split_uri("file:///tmp/a.pdf") is None
    assert apps.split_uri("ui://no-server/view.html") is None  # a server's own URI, never named


def test_visibility_reads_as_the_spec_says() -> None:
    assert not apps.app_only(None)
    assert apps.app_callable(None)  # no visibility: both
    assert apps.app_only({"ui": {"visibility": ["app"]}})
    assert not apps.app_callable({"ui": {"visibility": ["model"]}})
    assert apps.for_views({"ui/resourceUri": "ui://x/y"})  # the deprecated flat key still names a view
    assert not apps.for_views({"ui": {"resourceUri": "https://not-a-view"}})


def test_a_raw_result_and_its_model_are_named_alike() -> None:
    result = types.CallToolResult(
        content=[
            types.TextContent(type="text", text="ui://not/a/link"),
            types.ResourceLink(type="resource_link", uri="ui://clock/view.html", name="view"),
            types.ResourceLink(type="resource_link", uri="file:///tmp/a", name="file"),
            types.EmbeddedResource(
                type="resource", resource=types.TextResourceContents(uri="ui://app/index.html", text="<p>")
            ),
        ],
        meta={"ui": {"resourceUri": "ui://clock/view.html"}, "ui/resourceUri": "ui://clock/view.html", "other": 1},
    )
    raw = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    before = copy.deepcopy(raw)
    apps.name_raw_result("pdf", raw)
    assert raw == apps.name_result("pdf", result).model_dump(by_alias=True, mode="json", exclude_none=True)
    assert raw["_meta"] == {
        "ui": {"resourceUri": "ui://pdf+clock/view.html"},
        "ui/resourceUri": "ui://pdf+clock/view.html",
        "other": 1,
    }
    assert [block.get("uri") or block.get("resource", {}).get("uri") for block in raw["content"]] == [
        None,
        "ui://pdf+clock/view.html",
        "file:///tmp/a",
        "ui://pdf+app/index.html",
    ]
    assert raw["content"][0] == before["content"][0]  # text is the server's own, never rewritten


def test_a_result_without_views_is_the_same_object() -> None:
    result = types.CallToolResult(content=[types.TextContent(type="text", text="plain")])
    assert apps.name_result("pdf", result) is result
