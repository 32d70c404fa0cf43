"""Canonical keys: the same JSON arguments give the same key however they were written."""

from __future__ import annotations

import json

import pytest

from mcpmux.batching import call_key, canonical_json


def test_key_order_and_whitespace_do_not_matter() -> None:
    a = json.loads('{"city": "Paris", "opts": {"units": "metric", "days": 3}}')
    b = json.loads('{ "opts" : {"days":3,"units":"metric"},  "city":"Paris" }')
    assert canonical_json(a) == canonical_json(b) == '{"city":"Paris","opts":{"days":3,"units":"metric"}}'


def test_integral_float_equals_int_but_other_values_differ() -> None:
    assert canonical_json({"n": 1.0}) == canonical_json({"n": 1})
    assert canonical_json({"n": 1.5}) != canonical_json({"n": 1})
    assert canonical_json({"flag": True}) != canonical_json({"flag": 1})
    assert canonical_json(["a", "b"]) != canonical_json(["b", "a"])


def test_unicode_kept_and_tuples_are_arrays() -> None:
    assert canonical_json({"q": "café", "xs": (1, 2)}) == '{"q":"café","xs":[1,2]}'


def test_call_key_treats_missing_arguments_as_empty() -> None:
    assert call_key("search", None) == call_key("search", {}) == ("search", "{}")
    assert call_key("search", {"q": "x"}) != call_key("lookup", {"q": "x"})


def test_non_json_values_are_named_by_path() -> None:
    with pytest.raises(TypeError, match=r"\$\.opts\.when has type set"):
        canonical_json({"opts": {"when": {1, 2}}})
    with pytest.raises(TypeError, match="object key 3"):
        canonical_json({3: "x"})
    with pytest.raises(ValueError, match="NaN and infinity"):
        canonical_json({"x": float("nan")})
