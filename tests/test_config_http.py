"""`[http]` security keys: defaults, where tokens come from, and errors that never show a token."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcpmux.core.config import HttpSettings, config_from_dict, load_config
from mcpmux.errors import ConfigError, MuxError
from mcpmux.server.http.edge import RateLimiter
from mcpmux.server.http.edge_policy import EdgePolicy, is_loopback, prepare_edge

SECRET = "tok-9f8e7d6c5b4a-s3cr3t"


def test_defaults_are_open_on_loopback_and_never_throttle() -> None:
    http = HttpSettings()
    assert (http.host, http.max_body_bytes, http.rate_limit, http.metrics_auth) == ("127.0.0.1", 4 << 20, 0.0, True)
    policy = EdgePolicy.load(config_from_dict({}), "127.0.0.1", environ={})
    assert policy.tokens == ()
    assert policy.rate_limit == 0  # off: the batching benchmark sends thousands of calls/s from one client
    assert policy.idle_per_client == 8


def test_a_negative_idle_connection_limit_names_the_key() -> None:
    key = r"\n  http.idle_connections_per_client: Input should be greater than or equal to 0"
    with pytest.raises(ConfigError, match=r"c.toml: invalid configuration" + key):
        config_from_dict({"http": {"idle_connections_per_client": -1}}, source="c.toml")


def test_token_file_is_read_relative_to_the_config_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    (folder / "tokens.txt").write_text(f"# clients\n\n  {SECRET}  \nsecond-token\n")
    (folder / "mcpmux.toml").write_text('[http]\nauth_token_file = "tokens.txt"\nauth_token_env = "EDGE_T"\n')
    monkeypatch.chdir(tmp_path)  # not the config's folder
    policy = EdgePolicy.load(load_config(folder / "mcpmux.toml"), "127.0.0.1", environ={"EDGE_T": "a-1, b-2"})
    assert policy.tokens == (b"a-1", b"b-2", SECRET.encode(), b"second-token")
    assert policy.client_of(f"Bearer {SECRET}") == 2
    assert policy.client_of(f"bearer   {SECRET}") == 2  # the scheme is case-insensitive
    assert policy.client_of(f"Bearer {SECRET}x") is None
    assert policy.client_of(SECRET) is None


def test_missing_env_var_names_the_key_and_not_a_value(tmp_path: Path) -> None:
    config = config_from_dict({"http": {"auth_token_env": "EDGE_MISSING"}}, source="c.toml")
    with pytest.raises(ConfigError, match=r"c.toml: http.auth_token_env: environment variable EDGE_MISSING"):
        EdgePolicy.load(config, "127.0.0.1", environ={"OTHER": SECRET})


@pytest.mark.parametrize("content", [None, "# only a comment\n\n"])
def test_unreadable_or_empty_token_file_is_a_config_error(tmp_path: Path, content: str | None) -> None:
    if content is not None:
        (tmp_path / "tokens.txt").write_text(content)
    (tmp_path / "mcpmux.toml").write_text('[http]\nauth_token_file = "tokens.txt"\n')
    with pytest.raises(ConfigError, match=r"http.auth_token_file: .*tokens.txt"):
        EdgePolicy.load(load_config(tmp_path / "mcpmux.toml"), "127.0.0.1", environ={})


def test_a_token_pasted_as_the_env_name_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as refused:
        config_from_dict({"http": {"auth_token_env": SECRET}}, source="c.toml")
    assert "http.auth_token_env" in str(refused.value)
    assert SECRET not in str(refused.value)


def test_unknown_http_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"http.auth_token: unknown key"):
        config_from_dict({"http": {"auth_token": SECRET}})


def test_hosts_and_origins() -> None:
    config = config_from_dict(
        {
            "http": {
                "allowed_hosts": ["mcp.example.com", "proxy.example.com:8443", "[fd00::1]:*"],
                "allowed_origins": ["https://app.example.com", "http://tools.example.com:*"],
            }
        }
    )
    policy = EdgePolicy.load(config, "10.0.0.5", environ={})
    for host in ("localhost:1", "127.0.0.1", "[::1]:8765", "10.0.0.5:8765", "MCP.example.com:443", "[fd00::1]:80"):
        assert policy.host_allowed(host), host
    for refused in ("evil.com", "proxy.example.com:443", "127.0.0.1.evil.com", "", None):
        assert not policy.host_allowed(refused), refused
    for origin in (None, "http://localhost:3000", "https://app.example.com/", "http://tools.example.com:9"):
        assert policy.origin_allowed(origin), origin
    for bad in ("http://evil.com", "https://app.example.com.evil.com", "null", "https://tools.example.com:9"):
        assert not policy.origin_allowed(bad), bad
    wide = EdgePolicy.load(config_from_dict({"http": {"allowed_hosts": ["*"], "allowed_origins": ["*"]}}), "::1")
    assert wide.host_allowed("anything:1")
    assert wide.origin_allowed("https://anything")


def test_non_loopback_bind_needs_tokens_or_the_flag() -> None:
    open_config = config_from_dict({}, source="c.toml")
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert is_loopback(host)
        prepare_edge(open_config, host, allow_unauthenticated_remote=False)
    with pytest.raises(MuxError, match=r"refusing to serve HTTP on 0.0.0.0 without authentication.*c.toml"):
        prepare_edge(open_config, "0.0.0.0", allow_unauthenticated_remote=False)
    assert prepare_edge(open_config, "0.0.0.0", allow_unauthenticated_remote=True).tokens == ()


def test_rate_limiter_bursts_then_paces_each_client_alone() -> None:
    limiter = RateLimiter(rate=2.0, burst=3)
    assert [limiter.take("a", 10.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("a", 10.0) == pytest.approx(0.5)
    assert limiter.take("b", 10.0) == 0.0
    assert limiter.take("a", 10.5) == 0.0  # half a second later one request has refilled
    assert limiter.take("a", 10.5) > 0
