"""Constrained decoding on a tiny random model: every constrained output matches its grammar (a random
model would almost never produce valid JSON by chance), Hypothesis-generated JSON schemas included;
unconstrained requests in the same batches keep their exact greedy tokens; grammars llguidance
refuses are clear errors; the async engine compiles each grammar once, off the step loop."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mcpmux.inference.engine.async_engine import Engine
from mcpmux.inference.engine.config import Grammar, SamplingParams
from mcpmux.inference.engine.llm_engine import LLMEngine
from mcpmux.inference.errors import InvalidSettingError
from mcpmux.inference.models.loader import load_model
from tests.inference.engine_harness import MAX_TOKENS, drive, engine_config, greedy_params

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "colour": {"enum": ["red", "green", "blue"]}},
    "required": ["ok", "colour"],
    "additionalProperties": False,
}
DIGITS = r"[0-9]{3}-[a-c]{2}"


def constrained(kind: str, source: str, max_tokens: int = 200, temperature: float = 0.0) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=7, grammar=Grammar(kind, source))


@pytest.mark.parametrize("pool", ["chunked prefill", "preempted"])
def test_constrained_rows_match_their_grammar_and_the_others_stay_exact(tiny_llama: Path, pool: str) -> None:
    """The masks are filled while the forward runs; rows whose prefill is chunked, whose prompt is
    partly cached, or that were preempted and recomputed still sample under their grammar's mask."""
    loaded = load_model(str(tiny_llama), "float32", "cpu")
    blocks = 64 if pool == "chunked prefill" else 16
    config = engine_config(tiny_llama, max_num_batched_tokens=64, prefill_chunk_size=16, num_blocks=blocks)
    reference = drive(loaded, config, greedy_params())
    params = greedy_params()
    schema = json.dumps(SCHEMA)
    for i in range(0, len(MAX_TOKENS), 3):
        params[f"r{i}"] = constrained("json_schema", schema, max_tokens=40)
        params[f"r{i + 1}"] = constrained("regex", DIGITS, max_tokens=40, temperature=1.0)
    run = drive(loaded, config, params)
    stats = run.engine.stats()
    assert stats.cached_prompt_tokens > 0  # the shared prompts hit the prefix cache
    if pool == "preempted":
        assert stats.num_preemptions > 0, "the pool was meant to be too small for the mix"
    for rid, p in params.items():
        if p.grammar is None:
            assert run.tokens[rid] == reference.tokens[rid], rid  # untouched by the masks beside it
        elif p.grammar.kind == "json_schema":
            jsonschema.validate(json.loads(run.texts[rid]), SCHEMA)
            assert run.finish[rid] == "stop"
        else:
            assert re.fullmatch(DIGITS, run.texts[rid]), run.texts[rid]
            assert run.finish[rid] == "stop"


def test_a_grammar_cut_by_max_tokens_ends_with_length_and_a_valid_prefix(tiny_llama: Path) -> None:
    engine = LLMEngine(engine_config(tiny_llama))
    engine.add_request("r", "Hello", constrained("regex", "[a-z]{40}", max_tokens=5))
    text, finish = "", None
    while engine.has_unfinished():
        for out in engine.step():
            text += out.text
            finish = out.finish_reason
    assert finish == "length"
    assert re.fullmatch("[a-z]{1,40}", text), text


@pytest.mark.parametrize(
    ("kind", "source", "reason"),
    [
        ("regex", "(", "unclosed group"),
        ("json_schema", "{not json", "not valid"),
        ("lark", "start: undefined_rule", "undefined_rule"),
    ],
)
def test_grammars_that_cannot_be_used_are_clear_errors(tiny_llama: Path, kind: str, source: str, reason: str) -> None:
    engine = LLMEngine(engine_config(tiny_llama))
    with pytest.raises(InvalidSettingError, match=reason):
        engine.add_request("r", "Hello", constrained(kind, source))
    assert not engine.has_unfinished()


def test_unknown_grammar_kinds_are_refused() -> None:
    with pytest.raises(InvalidSettingError, match="grammar kind must be one of json_schema, regex, lark"):
        Grammar("xml", "<a/>")


@pytest.mark.anyio
async def test_the_async_engine_compiles_grammars_off_the_step_loop_and_reuses_them(tiny_llama: Path) -> None:
    async with await Engine.start(engine_config(tiny_llama)) as engine:
        params = constrained("json_schema", json.dumps(SCHEMA))
        first, second = [await engine.complete(f"Answer {i}", params) for i in range(2)]
        for done in (first, second):
            jsonschema.validate(json.loads(done.text), SCHEMA)
            assert done.finish_reason == "stop"
        compiler = engine.core._grammar_compiler
        assert compiler is not None
        assert len(compiler._compiled) == 1  # compiled once, copied for the second request
        with pytest.raises(InvalidSettingError, match="unclosed group"):
            await engine.complete("Hello", constrained("regex", "("))


def _leaf() -> st.SearchStrategy[dict[str, Any]]:
    words = st.text(alphabet="abcdefgh", min_size=1, max_size=6)
    return st.one_of(
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.integers(-50, 50).map(lambda low: {"type": "integer", "minimum": low, "maximum": low + 99}),
        st.lists(words, min_size=1, max_size=4, unique=True).map(lambda values: {"enum": values}),
        st.integers(1, 8).map(lambda n: {"type": "string", "maxLength": n, "pattern": "^[a-z]*$"}),
    )


def _schemas() -> st.SearchStrategy[dict[str, Any]]:
    def obj(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
        props = st.dictionaries(st.text(alphabet="xyz", min_size=1, max_size=3), children, min_size=1, max_size=3)
        return props.map(
            lambda p: {"type": "object", "properties": p, "required": sorted(p), "additionalProperties": False}
        )

    def arr(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
        return children.map(lambda item: {"type": "array", "items": item, "maxItems": 3})

    return st.recursive(_leaf(), lambda children: st.one_of(obj(children), arr(children)), max_leaves=5)


def _longest(schema: dict[str, Any]) -> int:
    """Bytes of the longest JSON text a `_schemas()` schema admits, laid out as the grammar writes it
    (`JSON_LAYOUT`: ", " and ": "). A byte-level BPE token is at least one byte, so this many tokens
    always let the output finish."""
    if "enum" in schema:
        return max(len(json.dumps(value)) for value in schema["enum"])
    kind = schema["type"]
    if kind == "object":
        fields = [len(json.dumps(key)) + 2 + _longest(value) for key, value in schema["properties"].items()]
        return 2 + sum(fields) + 2 * (len(fields) - 1)
    if kind == "array":
        return 2 + schema["maxItems"] * _longest(schema["items"]) + 2 * (schema["maxItems"] - 1)
    if kind == "integer":
        return max(len(str(schema["minimum"])), len(str(schema["maximum"])))
    if kind == "string":
        return schema["maxLength"] + 2
    return {"boolean": 5, "null": 4}[kind]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=_schemas(), temperature=st.sampled_from([0.0, 1.0]))
def test_generated_schemas_hold_every_finished_output(
    tiny_llama: Path, schema: dict[str, Any], temperature: float
) -> None:
    longest = _longest(schema)
    assume(longest < 900)  # prompt and output within the tiny model's 1,024 positions
    engine = LLMEngine(engine_config(tiny_llama))
    engine.add_request("r", "Data:", constrained("json_schema", json.dumps(schema), longest + 1, temperature))
    text, finish = "", None
    while engine.has_unfinished():
        for out in engine.step():
            text += out.text
            finish = out.finish_reason
    assert finish == "stop"  # max_tokens covers the longest output the schema admits
    jsonschema.validate(json.loads(text), schema)


def test_forced_tokens_are_appended_without_a_step_each(tiny_llama: Path) -> None:
    """Jump-forward: an object's keys and punctuation need no forward pass of their own, so the same
    constrained requests finish in fewer steps than tokens; their outputs still validate."""
    loaded = load_model(str(tiny_llama), "float32", "cpu")
    steps: dict[bool, int] = {}
    for jump in (False, True):
        engine = LLMEngine(engine_config(tiny_llama, jump_forward=jump), loaded)
        for i in range(4):
            engine.add_request(f"r{i}", f"Answer {i}:", constrained("json_schema", json.dumps(SCHEMA), temperature=1.0))
        texts: dict[str, str] = {}
        tokens = 0
        steps[jump] = 0
        while engine.has_unfinished():
            steps[jump] += 1
            for out in engine.step():
                texts[out.request_id] = texts.get(out.request_id, "") + out.text
                tokens += len(out.token_ids)
                assert not out.finished or out.finish_reason == "stop"
        for text in texts.values():
            jsonschema.validate(json.loads(text), SCHEMA)
        if jump:
            assert steps[jump] < tokens / 4, (steps, tokens)  # a sampled token per step would need `tokens / 4`
    assert steps[True] < steps[False]
