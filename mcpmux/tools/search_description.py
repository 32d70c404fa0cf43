"""What `mux_search_tools` tells a model it can find: the servers behind it and what their tools act on.

A model uses a search tool only when its description makes clear the tool reaches what the task
needs; "find tools of the connected servers" names nothing. In search mode the description lists
each server of the caller's view with the words its tools are named by most often (`github (issue,
pull request, repository)`), generated from the catalog, so it follows every catalog change and
every profile. The list is kept short: servers with the most tools come first, and past
`DESCRIPTION_BUDGET` characters the rest are named without their words, then only counted.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from mcpmux.tools.search_index import ToolDoc, words

DESCRIPTION_BUDGET = 1500
"""Characters the server list may take (about 375 tokens, listed on every turn)."""
WORDS_PER_SERVER = 3

# Verbs and fillers every kind of server names its tools with: they say nothing of the domain.
_GENERIC_WORDS = (
    "get list create update delete remove add set search find read write fetch run execute new all info detail "
    "tool call make show edit query retrieve manage view check send post put patch item data by id"
)
_GENERIC = frozenset(_GENERIC_WORDS.split())


def domain_words(docs: Sequence[ToolDoc]) -> list[str]:
    """The words a server's tools are named and titled by most often, generic verbs left out unless
    nothing else is left (a server whose tools are `search` and `fetch`)."""
    counts: Counter[str] = Counter()
    shown: dict[str, Counter[str]] = {}  # a folded word -> the forms it was written in ("indices", not "indice")
    own = set(words(docs[0].server)) if docs else set()
    for doc in docs:
        seen = set()
        for raw in _PIECE.findall(f"{doc.short} {doc.title}"):
            for word in words(raw):
                shown.setdefault(word, Counter())[raw.lower()] += 1
                seen.add(word)
        counts.update(seen)  # once per tool
    specific = [word for word, _ in counts.most_common() if word not in _GENERIC and word not in own]
    chosen = specific or [word for word, _ in counts.most_common() if word not in own]
    return [shown[word].most_common(1)[0][0] for word in chosen[:WORDS_PER_SERVER]]


_PIECE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")  # as BM25 splits names


def describe_catalog(intro: str, docs: Sequence[ToolDoc]) -> str:
    """`intro` followed by the servers of `docs`, each with its domain words, within the budget."""
    by_server: dict[str, list[ToolDoc]] = {}
    for doc in docs:
        by_server.setdefault(doc.server, []).append(doc)
    if not by_server:
        return intro
    order = sorted(by_server, key=lambda server: (-len(by_server[server]), server))
    parts: list[str] = []
    used = 0
    for position, server in enumerate(order):
        found = domain_words(by_server[server])
        part = f"{server} ({', '.join(found)})" if found else server
        if used + len(part) > DESCRIPTION_BUDGET:
            part = server
        if used + len(part) > DESCRIPTION_BUDGET:
            parts.append(f"and {len(order) - position} more")
            break
        parts.append(part)
        used += len(part) + 2
    return f"{intro} Servers: {'; '.join(parts)}."
