"""Public names for upstream tools and prompts.

The rule, in order:
1. `server + separator + name` (or just `name` when prefixing is off);
2. every character outside the spec's `[A-Za-z0-9_.-]` becomes `_`;
3. if the result is longer than 128 characters, or another entry already holds it (two names that
   differed only in replaced characters), it is cut to 119 characters and `-` plus the first 8 hex
   digits of SHA-1(`server` NUL `name`) are appended.
The hash depends only on the upstream's own server and name, so a name is stable across restarts
and independent of which other upstreams are connected, except in the collision case.
"""

from __future__ import annotations

import hashlib
import re

MAX_NAME = 128
_INVALID = re.compile(r"[^A-Za-z0-9_.-]")


def public_name(server: str, name: str, separator: str, prefix: bool, taken: set[str]) -> str:
    """The catalog name for `name` from `server`, unique within `taken` (which it does not modify)."""
    base = _INVALID.sub("_", f"{server}{separator}{name}" if prefix else name) or "_"
    if len(base) <= MAX_NAME and base not in taken:
        return base
    digest = hashlib.sha1(f"{server}\0{name}".encode()).hexdigest()[:8]
    return f"{base[: MAX_NAME - 9]}-{digest}"
