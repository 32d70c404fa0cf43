"""Checks a JSON value against a JSON schema, for answers a remote server wrote.

The local engine holds its output to a schema token by token, so its answers match by construction;
a remote server may only be asked to (or may ignore the asking). Its structured answers and tool
calls are therefore checked when they come back, and one that does not match is an error that says
where it fails, never passed on.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError


def schema_problem(value: Any, schema: dict[str, Any]) -> str | None:
    """Why `value` does not match `schema` (the first problem, with where it is), or None when it does."""
    validator = _validator(json.dumps(schema, sort_keys=True))  # by value: the same schema is checked once
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path)
    return f"{error.message} (at {where or 'the top level'})"


@lru_cache(maxsize=256)
def _validator(text: str) -> Any:
    schema = json.loads(text)
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError as err:
        raise ValueError(f"the JSON schema is not valid: {err.message}") from None
    return cls(schema)
