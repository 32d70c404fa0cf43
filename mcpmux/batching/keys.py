"""Canonical keys: equal JSON arguments give equal keys, whatever their key order or spacing."""

from __future__ import annotations

import json
from collections.abc import Mapping


def canonical_json(value: object) -> str:
    """Canonical JSON text of `value`: sorted keys, no whitespace, UTF-8 kept, integral floats as ints.

    `1.0` and `1` are the same JSON number, so they give the same key (as in RFC 8785). Raises
    `TypeError` naming the path of a value that is not JSON (or a non-string object key), and
    `ValueError` for NaN or infinity, which JSON cannot carry.
    """
    normal = _normalise(value, "$")
    try:
        return json.dumps(normal, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        raise ValueError(f"cannot build a canonical key: {exc} (NaN and infinity are not JSON)") from exc


def call_key(name: str, arguments: Mapping[str, object] | None) -> tuple[str, str]:
    """The coalescing/cache key of one call: ``(name, canonical_json(arguments or {}))``."""
    return (name, canonical_json(dict(arguments) if arguments else {}))


def _normalise(value: object, path: str) -> object:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        out: dict[str, object] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"cannot build a canonical key: object key {key!r} at {path} is not a string")
            out[key] = _normalise(item, f"{path}.{key}")
        return out
    if isinstance(value, list | tuple):
        return [_normalise(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise TypeError(f"cannot build a canonical key: value at {path} has type {type(value).__name__}, which is not JSON")
