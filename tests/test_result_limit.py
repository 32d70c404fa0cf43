"""`mcpmux.core.result_limit`: what a model is shown of a result over its limit, and what is kept whole."""

from __future__ import annotations

import copy
import json

from hypothesis import given
from hypothesis import strategies as st

from mcpmux.core.result_limit import clean_prefix, fit, text_size

URI = "mcpmux://results/test"


def _fit(raw: dict[str, object], limit: int, keeps_structured: bool = False) -> tuple[dict[str, object], object]:
    return fit(raw, limit, keeps_structured, "tool 'log' of 'big'", lambda: URI)


def _texts(result: dict[str, object]) -> list[str]:
    return [block["text"] for block in result["content"] if block["type"] == "text"]  # type: ignore[index, union-attr]


def test_a_result_within_its_limit_is_passed_on_as_it_is() -> None:
    raw = {"content": [{"type": "text", "text": "é" * 100}], "isError": False}
    shaped, kept = _fit(raw, 200)
    assert shaped is raw
    assert kept is None
    assert text_size(raw, False) == 200  # bytes, not characters: é is two


def test_a_long_text_is_cut_at_a_line_end_and_kept_whole() -> None:
    text = "".join(f"line {i:04d} of the log\n" for i in range(1000))  # 21 bytes a line
    raw = {"content": [{"type": "text", "text": text}], "isError": False, "_meta": {"x": 1}}
    before = copy.deepcopy(raw)
    shaped, kept = _fit(raw, 1000)
    assert raw == before  # the caller's result is not changed (identical calls may share it)
    shown, note = _texts(shaped)
    assert text.startswith(shown)
    assert shown.endswith("\n")
    assert 1000 - 21 < len(shown.encode()) <= 1000
    assert "answered 21,000 bytes of text, more than its limit of 1,000" in note
    assert f"in line {shown.count(chr(10)) + 1}" in note
    assert URI in note
    assert shaped["content"][-1] == {  # type: ignore[index]
        "type": "resource_link",
        "uri": URI,
        "name": "tool 'log' of 'big' result",
        "mimeType": "text/plain",
        "size": 21_000,
    }
    assert shaped["_meta"] == {"x": 1}
    assert shaped["isError"] is False
    assert kept is not None
    assert kept.contents == [{"uri": URI, "mimeType": "text/plain", "text": text}]


def test_without_line_ends_a_cut_falls_on_a_space_then_on_a_whole_character() -> None:
    words = "word " * 1000
    assert clean_prefix(words, 103) == "word " * 20
    emoji = "😀" * 1000  # four bytes each, nothing to cut at but characters
    cut = clean_prefix(emoji, 1001)
    assert cut == "😀" * 250
    shaped, _ = _fit({"content": [{"type": "text", "text": emoji}]}, 1001)
    assert _texts(shaped)[0] == "😀" * 250  # never half a character


def test_blocks_after_the_cut_are_left_out_and_other_blocks_pass() -> None:
    image = {"type": "image", "data": "iVBORw0KGgo=" * 1000, "mimeType": "image/png"}
    raw = {
        "content": [
            {"type": "text", "text": "a" * 600},
            image,
            {"type": "text", "text": "b" * 600},
            {"type": "text", "text": "c" * 600},
        ]
    }
    shaped, kept = _fit(raw, 1000)
    content = shaped["content"]
    assert content[0]["text"] == "a" * 600  # type: ignore[index]
    assert content[1] is image  # not text: neither counted nor cut
    assert content[2]["text"] == "b" * 400  # type: ignore[index]
    assert "and 1 more block(s)" in content[3]["text"]  # type: ignore[index]
    assert [item["text"] for item in kept.contents] == ["a" * 600, "b" * 600, "c" * 600]  # type: ignore[attr-defined]


def test_structured_content_an_output_schema_validates_is_never_touched() -> None:
    structured = {"rows": ["x" * 50] * 100}
    raw = {"content": [{"type": "text", "text": json.dumps(structured)}], "structuredContent": structured}
    shaped, _ = _fit(raw, 1000, keeps_structured=True)
    assert shaped["structuredContent"] is structured
    assert len(_texts(shaped)[0].encode()) <= 1000
    # Without a schema it is text a model may read: counted, and left out when over (kept whole).
    small = {"content": [{"type": "text", "text": "ok"}], "structuredContent": structured}
    shaped, kept = _fit(small, 1000)
    assert "structuredContent" not in shaped
    assert kept.contents[-1] == {  # type: ignore[attr-defined]
        "uri": URI,
        "mimeType": "application/json",
        "text": json.dumps(structured, separators=(",", ":")),
    }


def test_no_limit_and_no_content_mean_no_cut() -> None:
    raw = {"content": [{"type": "text", "text": "x" * 10_000}]}
    assert _fit(raw, 0)[0] is raw
    odd = {"resultType": "input_required"}
    assert _fit(odd, 10)[0] is odd


@given(st.text(min_size=0, max_size=3000), st.integers(min_value=1, max_value=4000))
def test_a_cut_is_a_prefix_within_the_limit_and_the_whole_is_kept(text: str, limit: int) -> None:
    shaped, kept = _fit({"content": [{"type": "text", "text": text}]}, limit)
    if kept is None:
        assert len(text.encode()) <= limit
        return
    shown = _texts(shaped)[0]
    assert text.startswith(shown)
    assert len(shown.encode()) <= max(limit, 256)
    assert kept.contents == [{"uri": URI, "mimeType": "text/plain", "text": text}]
