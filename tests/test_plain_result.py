"""`is_plain`: a result it accepts is one the SDK's 2026 model writes back unchanged; others it leaves
to the model. Checked against the model itself on generated results, near misses included."""

from __future__ import annotations

import copy
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from mcp_types import methods
from pydantic import ValidationError

from mcpmux.wire.plain_result import SERVER_INFO, is_plain

VERSION = "2026-07-28"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
text_blocks = st.fixed_dictionaries({"type": st.just("text"), "text": st.text()})
near_blocks = st.one_of(
    text_blocks,
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image", "Text"]), "text": json_values}),
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(), "annotations": json_values}),
    json_values,
)
server_info = st.dictionaries(st.sampled_from(["name", "version", "title", "extra"]), json_values, max_size=4)
metas = st.one_of(
    st.fixed_dictionaries({SERVER_INFO: st.dictionaries(st.sampled_from(["name", "version", "title"]), st.text())}),
    st.fixed_dictionaries({SERVER_INFO: server_info}),
    st.dictionaries(st.text(max_size=8), json_values, max_size=3),
    json_values,
)
plain_results = st.fixed_dictionaries(
    {"content": st.lists(text_blocks, max_size=3), "resultType": st.just("complete")},
    optional={"isError": st.booleans(), "_meta": metas},
)
near_results = st.fixed_dictionaries(
    {"content": st.lists(text_blocks, max_size=3) | st.lists(near_blocks, max_size=3) | json_values},
    optional={
        "isError": st.booleans() | json_values,
        "resultType": st.sampled_from(["complete", "input_required", "Complete"]) | json_values,
        "_meta": metas,
        "structuredContent": json_values,
        "other": json_values,
    },
)
results = plain_results | near_results


def model_written(raw: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return methods.serialize_server_result("tools/call", VERSION, copy.deepcopy(raw))
    except ValidationError:
        return None


def _nan_free(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isnan(value)
    if isinstance(value, list):
        return all(map(_nan_free, value))
    if isinstance(value, dict):
        return all(map(_nan_free, value.values()))
    return True


@settings(max_examples=600, deadline=None)
@given(results)
def test_a_plain_result_is_what_the_model_writes_back(raw: dict[str, Any]) -> None:
    if is_plain(raw):
        assert model_written(raw) == raw
        assert _nan_free(raw)  # never a float, whose dump could differ (NaN, infinities)


def test_the_commonest_results_are_plain_and_near_misses_are_not() -> None:
    info = {SERVER_INFO: {"name": "echo", "version": "1.0"}}
    plain = {"content": [{"type": "text", "text": "hi"}], "isError": False, "resultType": "complete", "_meta": info}
    assert is_plain(plain)
    assert is_plain({"content": [], "resultType": "complete"})
    for near in (
        {**plain, "isError": 0},  # the model reads 0 as false: written back, it differs
        {**plain, "resultType": None},
        {**plain, "structuredContent": {"a": 1}},
        {**plain, "_meta": {SERVER_INFO: {"name": "echo", "version": 1.0}}},
        {**plain, "_meta": {**info, "other": float("nan")}},
        {**plain, "content": [{"type": "text", "text": "hi", "annotations": None}]},
        {k: v for k, v in plain.items() if k != "resultType"},  # the model refuses it: the model says so
    ):
        assert not is_plain(near), near
