"""The tool-call format read back: whole outputs and streams split at every character, complete calls,
plain text and calls cut short by max_tokens."""

from __future__ import annotations

import pytest

from mcpmux.inference.serving.tool_calls import CallStream, ToolSpec, ToolUse, call_text

ADD = ToolSpec("add", "Add two numbers.", {"type": "object", "properties": {"a": {"type": "integer"}}})
USE = ToolUse((ADD,), "auto")
CALL = call_text("add", {"a": 1, "b": [2, {"c": "}"}]})


def test_a_whole_call_is_parsed_with_its_arguments_as_written() -> None:
    call = USE.parse(CALL)
    assert call is not None
    assert (call.name, call.arguments) == ("add", {"a": 1, "b": [2, {"c": "}"}]})
    assert call.arguments_json == '{"a": 1, "b": [2, {"c": "}"}]}'
    assert call.id.startswith("call_")
    assert USE.parse("plain text") is None
    assert USE.parse(CALL[:-1]) is None  # cut short
    assert USE.parse(call_text("other", {})) is None  # not an offered tool
    assert ToolUse((ADD,), "none").parse(CALL) is None


@pytest.mark.parametrize("cut", [None, -1, -5])
def test_a_streamed_call_gives_its_name_then_fragments_that_add_up(cut: int | None) -> None:
    text = CALL[:cut]
    stream = CallStream(USE)
    pieces = []
    for i, char in enumerate(text):
        assert stream.sees_call(char)
        pieces.append(stream.feed(char, final=i == len(text) - 1))
        if i < len('<tool_call>{"name": "add", "arguments": ') - 1:
            assert stream.name is None
    assert stream.name == "add"
    arguments = "".join(pieces)
    if cut is None:
        assert arguments == '{"a": 1, "b": [2, {"c": "}"}]}'  # the call's own closing brace held back
    else:  # cut short: everything the model wrote of the arguments is sent
        assert arguments == text.split('"arguments": ', 1)[1]


def test_plain_text_is_never_a_call() -> None:
    stream = CallStream(USE)
    assert not stream.sees_call("Hello")
    assert not stream.sees_call("<b>")
    assert not CallStream(ToolUse((ADD,), "none")).sees_call("<tool_call>")


def test_choices_that_cannot_work_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="tool choice names 'sub', which is not among the tools: add"):
        ToolUse((ADD,), "required", "sub")
    with pytest.raises(ValueError, match="tool choice 'required' needs at least one tool"):
        ToolUse((), "required")


WEATHER = ToolSpec(
    "weather",
    "The forecast.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def test_the_json_form_reads_back_as_the_text_form_once_checked() -> None:
    use = ToolUse((ADD, WEATHER), "auto")
    assert use.read_json('{ "name" : "weather", "arguments" : {"city": "Paris"} }') == call_text(
        "weather", {"city": "Paris"}
    )
    assert use.read_json('{"content": "<b>plain</b> text"}') == "<b>plain</b> text"
    with pytest.raises(ValueError, match=r"'city' is a required property \(at the top level\)"):
        use.read_json('{"name": "weather", "arguments": {}}')
    with pytest.raises(ValueError, match="not a call of one of the tools add, weather"):
        use.read_json('{"name": "sub", "arguments": {}}')
    with pytest.raises(ValueError, match="not JSON"):
        use.read_json("Sure! Here is")
    with pytest.raises(ValueError, match="not a call"):  # text is no answer where a call is required
        ToolUse((ADD,), "required").read_json('{"content": "no"}')
    schema = use.json_schema()
    assert [branch["properties"].keys() for branch in schema["anyOf"]] == [{"name", "arguments"}] * 2 + [{"content"}]
    assert ToolUse((ADD,), "required").json_schema()["properties"]["name"] == {"const": "add"}


def test_a_json_form_answer_cut_short_reads_as_far_as_it_goes() -> None:
    use = ToolUse((ADD,), "auto")
    assert use.read_json_cut('{"content": "Hello, wor') == "Hello, wor"
    assert use.read_json_cut('{"content": "caf\\u00') == "caf"  # a cut escape is dropped
    assert use.read_json_cut('{"name": "add", "arguments": {"a": 1').startswith("<tool_call>{")
    assert not CallStream(use).sees_call(use.read_json_cut('{"content": "<b>"'))  # text may start with "<"
