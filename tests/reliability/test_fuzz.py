"""Fuzzing the front server (stdio and HTTP) with what clients get wrong: malformed JSON, wrong JSON-RPC
shapes, unknown methods, bad params for each method, huge and deeply nested payloads, invalid UTF-8.

Every request with a usable id (a string or an integer) gets exactly one response with that id: a
result, or an error coded -32600/-32601/-32602 (-32700 when the bytes are not JSON). Anything else
(notifications, garbage without an id) gets nothing, or one -32700/-32600 error with id null. Over
HTTP a 4xx status is an answer too. Never a crash, a 5xx or a hang, and the server keeps serving.
"""

from __future__ import annotations

import itertools
import json
import queue
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.reliability.conftest import (
    Exchange,
    HttpFront,
    RawStdio,
    http_mux,
    stdio_upstream,
    tagged_pids,
    write_config,
)

pytestmark = pytest.mark.slow

PATIENCE = 15.0  # seconds one example may take before it counts as a hang
ERROR_CODES = {-32700, -32600, -32601, -32602}
FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    # No shrinking: with a hang costing PATIENCE per try it would take many minutes; the failing
    # example is reported as drawn.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
METHODS = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "resources/subscribe",
]
# Around the SDK parser's nesting limit (pydantic-core's serde_json), and past Python's recursion limit.
DEPTHS = [1, 50, 127, 128, 129, 200, 255, 256, 500, 900, 5_000, 20_000]
_ids = itertools.count(1)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def _fresh_id(as_text: bool) -> int | str:
    """An id no earlier example used, so a late or doubled answer cannot pass for this one's."""
    n = next(_ids)
    return f"fuzz-{n}" if as_text else 1_000_000 + n


class StdioFront:
    """One initialized 2025-11-25 session over raw pipes."""

    def __init__(self, mux: RawStdio) -> None:
        self.mux = mux

    def exchange(self, data: bytes, request_id: object) -> Exchange:
        """Send `data` as one line; gather the responses to it, ended by a ping sent after it (and by
        the answer to `request_id`, when one must come: handlers run concurrently, so it may come after
        the ping's)."""
        sentinel = f"sentinel-{uuid.uuid4().hex}"
        self.mux.send(data.replace(b"\n", b" ").replace(b"\r", b" ") + b"\n")
        self.mux.send_json({"jsonrpc": "2.0", "id": sentinel, "method": "ping"})
        got: list[Any] = []
        deadline = time.monotonic() + PATIENCE
        answered_sentinel = False
        while not answered_sentinel or (request_id is not None and not any(_for(m, request_id) for m in got)):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no answer within {PATIENCE}s to {data[:200]!r}; got {str(got)[:300]}"
            try:
                line = self.mux.receive(remaining)
            except queue.Empty:
                raise AssertionError(f"no answer within {PATIENCE}s to {data[:200]!r}; got {str(got)[:300]}") from None
            assert self.mux.process.poll() is None, "mcpmux exited"
            if isinstance(line, dict) and line.get("id") == sentinel:
                answered_sentinel = True
            elif isinstance(line, dict) and "method" in line:
                continue  # the server's own notifications
            else:
                got.append(line)
        return Exchange(0, got)


def _for(message: Any, request_id: object) -> bool:
    return isinstance(message, dict) and "id" in message and json.dumps(message["id"]) == json.dumps(request_id)


def check(answer: Exchange, request_id: object, must_answer: bool = True) -> None:
    """The contract in the module docstring, for one fuzz message."""
    assert answer.status < 500, f"HTTP {answer.status}: {answer.messages}"
    responses = [m for m in answer.messages if not (isinstance(m, dict) and "method" in m)]
    for message in responses:
        assert isinstance(message, dict), f"not a JSON-RPC message: {message!r}"
        assert message.get("jsonrpc") == "2.0", message
        if "error" in message:
            assert message["error"]["code"] in ERROR_CODES, message
            assert isinstance(message["error"].get("message"), str), message
        else:
            assert "result" in message, message
    if 400 <= answer.status < 500:
        return  # refused at the HTTP level: an answer in itself
    mine = [m for m in responses if request_id is not None and _for(m, request_id)]
    assert len(mine) == 1 if must_answer and request_id is not None else len(mine) <= 1, (
        f"{len(mine)} responses to id {request_id!r}: {responses}"
    )
    others = [m for m in responses if m not in mine]
    for message in others:
        assert message.get("id") is None, f"an answer to an id nobody sent: {str(message)[:300]}"
        assert message.get("error", {}).get("code") in {-32700, -32600}, message


@pytest.fixture(scope="module")
def stdio_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StdioFront]:
    folder = tmp_path_factory.mktemp("fuzz_stdio")
    tag = uuid.uuid4().hex
    # Megabyte payloads must come back whole: no cut to fit a model's context here.
    config = write_config(folder / "mux.json", {"alpha": stdio_upstream("alpha")}, max_result_bytes=0)
    with (folder / "mux.log").open("wb") as log:
        mux = RawStdio(config, tag, log)
        try:
            assert "result" in mux.initialize()
            assert "result" in mux.request({"jsonrpc": "2.0", "id": "tools", "method": "tools/list"})
            yield StdioFront(mux)
            # Still serving after everything the fuzzer sent.
            call = {"name": "alpha__echo", "arguments": {"text": "still here"}}
            answer = mux.request({"jsonrpc": "2.0", "id": "after", "method": "tools/call", "params": call})
            assert answer["result"]["content"][0]["text"] == "alpha: still here"
        finally:
            assert mux.close() == 0
    assert not tagged_pids(tag)


@pytest.fixture(scope="module")
def http_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpFront]:
    folder = tmp_path_factory.mktemp("fuzz_http")
    tag = uuid.uuid4().hex
    config = write_config(folder / "mux.json", {"alpha": stdio_upstream("alpha")}, max_result_bytes=0)
    with http_mux(config, tag, folder / "mux.log") as mux:
        front = HttpFront(mux.url, PATIENCE)
        yield front
        # The fuzzed session and a brand-new client are both still served.
        for client in (front, HttpFront(mux.url, PATIENCE)):
            call = {"name": "alpha__echo", "arguments": {"text": "still here"}}
            answer = client.exchange(
                json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}).encode(), 1
            )
            assert answer.messages[0]["result"]["content"][0]["text"] == "alpha: still here"
        front.close()
    assert mux.process.returncode == 0
    assert not tagged_pids(tag)


@pytest.fixture(params=["stdio", "http"])
def front(request: pytest.FixtureRequest) -> StdioFront | HttpFront:
    return request.getfixturevalue(f"{request.param}_front")


@FUZZ
@given(data=st.binary(max_size=300))
def test_bytes_that_are_not_json(front: StdioFront | HttpFront, data: bytes) -> None:
    check(front.exchange(data, None), None)


@FUZZ
@given(value=json_values)
def test_json_that_is_not_a_message(front: StdioFront | HttpFront, value: Any) -> None:
    request_id = None
    if isinstance(value, dict) and "id" in value:
        old = value["id"]
        if isinstance(old, str | int) and not isinstance(old, bool):
            request_id = _fresh_id(isinstance(old, str))  # fresh, so no other example's answer can match
            value = {**value, "id": request_id}
    # Without a method it may read as a response to nothing, which gets no answer.
    asks = request_id is not None and "method" in value
    check(front.exchange(json.dumps(value).encode(), request_id if asks else None), request_id, must_answer=asks)


@FUZZ
@given(
    as_text=st.booleans(),
    field=st.sampled_from(["jsonrpc", "id", "method", "params"]),
    replacement=json_values,
)
def test_requests_with_one_field_wrong(
    front: StdioFront | HttpFront, as_text: bool, field: str, replacement: Any
) -> None:
    request_id = _fresh_id(as_text)
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": "tools/list", "params": {}}
    message[field] = replacement
    usable = message["id"] if isinstance(message["id"], str | int) and not isinstance(message["id"], bool) else None
    check(front.exchange(json.dumps(message).encode(), usable), usable)


@FUZZ
@given(as_text=st.booleans(), method=st.text(min_size=1, max_size=40), notify=st.booleans())
def test_unknown_methods(front: StdioFront | HttpFront, as_text: bool, method: str, notify: bool) -> None:
    if method in METHODS or method.startswith("notifications/"):
        method = f"x/{method}"
    if notify:
        check(front.exchange(json.dumps({"jsonrpc": "2.0", "method": method}).encode(), None), None)
        return
    request_id = _fresh_id(as_text)
    answer = front.exchange(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method}).encode(), request_id)
    check(answer, request_id)
    if answer.status < 400:
        (mine,) = [m for m in answer.messages if _for(m, request_id)]
        assert mine["error"]["code"] == -32601, mine


@FUZZ
@given(
    as_text=st.booleans(),
    method=st.sampled_from(METHODS),
    params=json_values
    | st.dictionaries(
        st.sampled_from(["name", "arguments", "uri", "cursor", "level", "ref", "argument", "protocolVersion", "_meta"]),
        json_values,
        max_size=4,
    ),
)
def test_bad_params_for_each_method(front: StdioFront | HttpFront, as_text: bool, method: str, params: Any) -> None:
    if isinstance(params, dict) and params.get("name") in ("alpha__crash", "alpha__sleep"):
        params = {**params, "name": "alpha__echo"}  # a crash or a long sleep are the tool's to do, not a fuzz finding
    request_id = _fresh_id(as_text)
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    check(front.exchange(json.dumps(message).encode(), request_id), request_id)


@settings(FUZZ, max_examples=6)
@given(as_text=st.booleans(), size=st.sampled_from([100_000, 1_000_000, 3_000_000]), depth=st.sampled_from(DEPTHS))
def test_huge_and_deeply_nested_payloads(front: StdioFront | HttpFront, as_text: bool, size: int, depth: int) -> None:
    request_id = _fresh_id(as_text)
    text = "x" * size
    big = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "alpha__echo", "arguments": {"text": text}},
    }
    answer = front.exchange(json.dumps(big).encode(), request_id)
    check(answer, request_id)
    if answer.status < 400:
        (mine,) = [m for m in answer.messages if _for(m, request_id)]
        assert mine["result"]["content"][0]["text"] == f"alpha: {text}"
    nested_id = _fresh_id(as_text)
    nested = "[" * depth + "]" * depth
    deep = {"name": "alpha__echo", "arguments": {"text": "n", "deep": "NESTED"}}
    head = json.dumps({"jsonrpc": "2.0", "id": nested_id, "method": "tools/call", "params": deep})
    body = head.replace('"NESTED"', nested)
    # Up to a few hundred levels it is a request (answered, or refused by id); far deeper, no parser
    # reaches the id and the answer is a parse error with id null.
    parsed = depth < 1000
    check(front.exchange(body.encode(), nested_id if parsed else None), nested_id, must_answer=parsed)


@FUZZ
@given(position=st.integers(0, 200), junk=st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"]))
def test_invalid_utf8(front: StdioFront | HttpFront, position: int, junk: bytes) -> None:
    request_id = _fresh_id(False)
    params = {"name": "alpha__echo", "arguments": {"text": "abc"}}
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode()
    cut = position % (len(body) + 1)
    data = body[:cut] + junk + body[cut:]
    # Inside a string the bad bytes may be read as U+FFFD and the call served; elsewhere it is a parse error.
    served = _parses_with_id(data.decode("utf-8", errors="replace"), request_id)
    check(front.exchange(data, request_id if served else None), request_id, must_answer=False)


def _parses_with_id(text: str, request_id: object) -> bool:
    try:
        decoded = json.loads(text)
    except ValueError:
        return False
    return isinstance(decoded, dict) and decoded.get("id") == request_id
