"""A tool's name said with another verb: the fourth text `search_index` embeds for each tool.

MiniLM places a task's verb close to the verb a tool's name uses and far from its synonyms, so
`land this PR` misses `merge_pull_request` and `list open issues` can lose `list_issues` to
`get_issue`. Each tool is also embedded by its name with the first word that is an action in
`SYNONYM` replaced by that action's synonym (`add issue (github)` for `create_issue`), once, at
index time, and cached with its other vectors; a search costs one more row per tool in the ranking's
product. A name with no such word gets no extra text.

One synonym per verb: with three per verb (three more texts per tool) the tuning servers' MRR fell
back to that of the three views alone, every extra text a new way for the wrong tool to come close.
The table is generic English for what tools do, not any server's wording.
"""

from __future__ import annotations

import re

SYNONYM = {
    "create": "add",
    "add": "create",
    "new": "create",
    "insert": "add",
    "get": "read",
    "read": "get",
    "fetch": "get",
    "retrieve": "get",
    "show": "get",
    "view": "show",
    "list": "show all",
    "search": "find",
    "find": "search",
    "query": "search",
    "lookup": "look up",
    "delete": "remove",
    "remove": "delete",
    "update": "edit",
    "edit": "change",
    "modify": "change",
    "set": "change",
    "send": "post",
    "post": "send",
    "reply": "respond",
    "merge": "land",
    "move": "relocate",
    "write": "save",
    "save": "store",
    "navigate": "go to",
    "open": "launch",
    "close": "shut",
    "screenshot": "capture",
    "click": "press",
    "run": "execute",
    "execute": "run",
    "start": "begin",
    "stop": "halt",
    "cancel": "stop",
    "convert": "translate",
    "upload": "attach",
    "download": "save",
    "watch": "follow",
    "subscribe": "follow",
    "comment": "reply",
    "summarize": "sum up",
    "analyze": "examine",
    "check": "verify",
    "generate": "create",
    "scrape": "extract",
    "crawl": "scrape",
    "extract": "pull out",
    "fill": "enter",
    "type": "enter",
    "select": "choose",
    "hover": "mouse over",
    "evaluate": "run script",
    "copy": "duplicate",
    "rename": "change name",
    "archive": "store away",
    "assign": "give",
    "invite": "add",
    "schedule": "plan",
    "count": "tally",
    "describe": "explain",
    "explain": "describe",
    "translate": "convert",
}
"""An action found in tool names, and the one synonym its extra text uses."""

_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


def synonym_view(short: str, server: str) -> str | None:
    """`short` (a tool's own name) in lowercase words with its first action in `SYNONYM` replaced, and
    its server: "add issue (github)" for `create_issue`; None where the name holds no such action."""
    parts = [part.lower() for part in _PART.findall(short)]
    for at, part in enumerate(parts):
        if part in SYNONYM:
            return " ".join([*parts[:at], SYNONYM[part], *parts[at + 1 :]]) + f" ({server})"
    return None
