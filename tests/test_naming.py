"""Public names follow the documented rule: valid, at most 128 characters, unique, stable."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from mcpmux.core.naming import public_name

VALID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def test_plain_names_are_server_separator_tool() -> None:
    assert public_name("time", "get_current_time", "__", True, set()) == "time__get_current_time"
    assert public_name("time", "get_current_time", "__", False, set()) == "get_current_time"


def test_invalid_characters_become_underscores() -> None:
    assert public_name("my server", "do/it now", "__", True, set()) == "my_server__do_it_now"


def test_long_and_colliding_names_get_a_stable_hash_suffix() -> None:
    long = public_name("s", "x" * 200, "__", True, set())
    assert len(long) == 128
    assert long == public_name("s", "x" * 200, "__", True, set())
    first = public_name("s", "a b", "__", True, set())
    second = public_name("s", "a/b", "__", True, {first})
    assert first == "s__a_b"
    assert second.startswith("s__a_b-")
    assert second != first


@given(
    server=st.text(min_size=1, max_size=40),
    names=st.lists(st.text(min_size=1, max_size=200), min_size=1, max_size=20, unique=True),
)
def test_names_are_always_valid_and_unique(server: str, names: list[str]) -> None:
    taken: set[str] = set()
    for name in names:
        result = public_name(server, name, "__", True, taken)
        assert VALID.match(result), result
        assert result not in taken
        taken.add(result)
