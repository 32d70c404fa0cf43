"""`local__generate` with a `schema`: the output matches it (even from a tiny random model) and its
parsed value is `structuredContent.value`; an unusable schema or a cut output is an error saying which."""

from __future__ import annotations

from collections.abc import AsyncIterator

import jsonschema
import pytest

from mcpmux import Mux
from tests.e2e.conftest import text_of
from tests.inference.tiny_models import build_tiny_model

pytestmark = pytest.mark.anyio

ORDER = {
    "type": "object",
    "properties": {
        "item": {"enum": ["tea", "coffee", "cake"]},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
        "note": {"type": "string", "pattern": "^[a-z ]{0,10}$"},
    },
    "required": ["item", "count", "note"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def mux(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mux]:
    root = tmp_path_factory.mktemp("generate_schema")
    tiny_llama = build_tiny_model("llama", root / "llama")
    config = root / "mcpmux.toml"
    config.write_text(
        f'[inference]\nbackend = "local"\n[inference.models.tiny]\nmodel = "{tiny_llama}"\nkv_cache_memory_mb = 16\n'
        '[inference.embeddings]\nmodel = ""\n'
    )
    async with Mux.from_config(config) as started:
        yield started


async def test_the_output_matches_the_schema_and_is_parsed(mux: Mux) -> None:
    for seed in range(3):
        arguments = {"prompt": "Order:", "schema": ORDER, "max_tokens": 80, "seed": seed}
        result = await mux.call_tool("local__generate", arguments)
        assert not result.is_error, text_of(result)
        assert result.structured_content is not None
        value = result.structured_content["value"]
        jsonschema.validate(value, ORDER)
        assert result.structured_content["finish_reason"] == "stop"
        assert text_of(result) == result.structured_content["text"]


async def test_a_schema_the_grammar_cannot_use_is_an_error_naming_the_feature(mux: Mux) -> None:
    arguments = {"prompt": "Tags:", "schema": {"type": "array", "uniqueItems": True}}
    result = await mux.call_tool("local__generate", arguments)
    assert result.is_error
    assert "local__generate failed" in text_of(result)
    assert "uniqueItems" in text_of(result)


async def test_an_output_cut_by_max_tokens_is_an_error_with_the_text_so_far(mux: Mux) -> None:
    result = await mux.call_tool("local__generate", {"prompt": "Order:", "schema": ORDER, "max_tokens": 3})
    assert result.is_error
    assert "stopped (length) after 3 tokens before its output matched the schema; raise max_tokens" in text_of(result)
    assert "The output so far: {" in text_of(result)
