"""Every config format resolves to the same model; every mistake is named with its file and key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcpmux.core.config import Config, config_from_dict, load_config
from mcpmux.errors import ConfigError

ENV = {"HOME": "/home/u", "API_KEY": "sekret", "EMPTY": ""}

TOML = """
[mux]
separator = "__"

[servers.files]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "${HOME}/docs"]
env = { API_KEY = "${API_KEY}" }

[servers.remote]
url = "https://example.com/mcp"
headers = { Authorization = "Bearer ${TOKEN:-none}" }
"""

CLAUDE = {
    "mcpServers": {
        "files": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "${HOME}/docs"],
            "env": {"API_KEY": "${API_KEY}"},
        },
        "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${TOKEN:-none}"}},
    }
}

VSCODE = {
    "inputs": [{"id": "token", "type": "promptString"}],
    "servers": {
        "files": {
            "type": "stdio",
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "${HOME}/docs"],
            "env": {"API_KEY": "${API_KEY}"},
        },
        "remote": {
            "type": "http",
            "url": "https://example.com/mcp",
            "headers": {"Authorization": "Bearer ${TOKEN:-none}"},
        },
    },
}

CODEX = """
[mcp_servers.files]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "${HOME}/docs"]
env = { API_KEY = "${API_KEY}" }

[mcp_servers.remote]
url = "https://example.com/mcp"
headers = { Authorization = "Bearer ${TOKEN:-none}" }
"""


def _servers(config: Config) -> dict[str, object]:
    return {name: server.model_dump() for name, server in config.servers.items()}


def test_every_format_resolves_to_the_same_servers(tmp_path: Path) -> None:
    files = {
        "mcpmux.toml": TOML,
        "claude_desktop_config.json": json.dumps(CLAUDE),
        "mcp.json": json.dumps(VSCODE),
        "codex.toml": CODEX,
    }
    resolved = []
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        resolved.append(_servers(load_config(tmp_path / name, environ=ENV)))
    assert all(r == resolved[0] for r in resolved)
    files_server = load_config(tmp_path / "mcpmux.toml", environ=ENV).servers["files"]
    assert files_server.transport == "stdio"
    assert files_server.args[-1] == "/home/u/docs"
    assert files_server.env == {"API_KEY": "sekret"}
    remote = load_config(tmp_path / "mcp.json", environ=ENV).servers["remote"]
    assert remote.transport == "http"
    assert remote.headers == {"Authorization": "Bearer none"}


def test_variables_defaults_and_literal_dollar() -> None:
    config = config_from_dict(
        {"servers": {"s": {"command": "x", "args": ["${EMPTY:-fallback}", "$${HOME}", "${HOME}"]}}}, environ=ENV
    )
    assert config.servers["s"].args == ["fallback", "${HOME}", "/home/u"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"servers": {"s": {"command": "x", "args": ["${NOPE}"]}}}, "servers.s.args[0]: environment variable NOPE"),
        ({"servers": {"s": {"args": ["a"]}}}, "servers.s: a stdio server needs 'command'"),
        ({"servers": {"s": {"url": "ftp://x"}}}, "servers.s: 'url' must start with http:// or https://"),
        ({"servers": {"s": {"command": "x", "arg": []}}}, "servers.s.arg: unknown key"),
        ({"servers": {"s": {"command": "x", "args": "a b"}}}, "servers.s.args: Input should be a valid list"),
        ({"servers": {"s": {"command": "x", "timeout": -1}}}, "servers.s.timeout: Input should be greater than 0"),
        ({"servers": {"s": {"type": "sse", "url": "http://x"}}}, "type 'sse' (the deprecated HTTP+SSE transport)"),
        ({"servers": {"bad name": {"command": "x"}}}, "server name 'bad name' must be 1-64 characters"),
        ({"mux": {"separator": "::"}}, "mux.separator: separator must be non-empty"),
        ({"servers": {}, "mcpServers": {}}, "use one of servers, mcpServers, not several"),
        ({"servers": {"s": {"command": "x", "url": "http://h/mcp"}}}, "servers.s: has both 'command' and 'url'"),
    ],
)
def test_bad_configs_name_the_key_and_what_was_expected(raw: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_dict(raw, source="my.toml", environ=ENV)
    assert str(caught.value).startswith("my.toml: ")
    assert expected in str(caught.value)


def test_unreadable_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "broken.json").write_text('{"mcpServers": {')
    with pytest.raises(ConfigError, match=r"broken.json: invalid JSON at line 1"):
        load_config(tmp_path / "broken.json")
    (tmp_path / "broken.toml").write_text("[servers\n")
    with pytest.raises(ConfigError, match=r"broken.toml: invalid TOML"):
        load_config(tmp_path / "broken.toml")


def test_disabled_servers_are_parsed_but_not_started() -> None:
    config = config_from_dict({"mcpServers": {"a": {"command": "x", "disabled": True}, "b": {"command": "y"}}})
    assert set(config.servers) == {"a", "b"}
    assert set(config.enabled_servers) == {"b"}


def test_example_config_is_valid() -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "mcpmux.toml"
    config = load_config(example)
    assert config.enabled_servers


def test_a_wrongly_typed_string_is_named_by_type_never_echoed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A string in the wrong place may be an expanded secret: the error names its type, not its value."""
    monkeypatch.setenv("SECRET_TOKEN", "s3cr3t-value")
    path = tmp_path / "mcpmux.toml"
    path.write_text('[servers.api]\nurl = "http://127.0.0.1:1/mcp"\nheaders = "Bearer ${SECRET_TOKEN}"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "servers.api.headers" in str(caught.value)
    assert "got str" in str(caught.value)
    assert "s3cr3t" not in str(caught.value)


def test_relative_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    """A client launches mcpmux from anywhere (Claude Desktop: `/`): the file's paths must not depend on it."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "mcpmux.toml").write_text(
        '[servers.local]\ncommand = ".venv/bin/server"\nargs = ["server.py"]\n'
        '[servers.npx]\ncommand = "npx"\nargs = ["-y", "pkg"]\n'
        '[servers.sub]\ncommand = "/usr/bin/env"\ncwd = "sub"\n'
        '[servers.home]\ncommand = "~/bin/server"\n'
        '[servers.web]\nurl = "http://127.0.0.1:1/mcp"\n'
    )
    servers = load_config(folder / "mcpmux.toml").servers
    assert servers["local"].command == str(folder / ".venv" / "bin" / "server")
    assert servers["local"].cwd == str(folder)  # so its relative args mean the file's folder too
    assert servers["local"].args == ["server.py"]
    assert servers["npx"].command == "npx"  # a bare name is looked up on PATH, as always
    assert servers["npx"].cwd == str(folder)
    assert servers["sub"].cwd == str(folder / "sub")
    assert servers["home"].command == str(Path("~/bin/server").expanduser())
    assert servers["web"].cwd is None
    # A config made in memory (the library, `serve -- CMD`) has no file to be relative to.
    assert config_from_dict({"servers": {"s": {"command": "./x"}}}).servers["s"].command == "./x"


CLAUDE_DESKTOP_OWN_KEYS = {
    "globalShortcut": "Alt+Space",
    "preferences": {"menuBarEnabled": True, "quickEntryDictationShortcut": "capslock"},
    "mcpServers": {
        "files": {"command": "npx", "args": ["-y", "pkg"], "autoApprove": ["read_file"], "alwaysAllow": []},
    },
}


def test_a_clients_own_keys_are_its_business_but_mcpmux_toml_stays_strict(tmp_path: Path) -> None:
    claude = tmp_path / "claude_desktop_config.json"
    claude.write_text(json.dumps(CLAUDE_DESKTOP_OWN_KEYS))
    assert load_config(claude).servers["files"].args == ["-y", "pkg"]
    codex = tmp_path / "config.toml"
    codex.write_text(
        'model = "o3"\napproval_policy = "never"\n[mcp_servers.files]\ncommand = "npx"\nstartup_timeout_ms = 1\n'
    )
    assert load_config(codex).servers["files"].command == "npx"
    # mcpmux's own tables in a client's file are still checked: a typo there is mcpmux's to catch.
    claude.write_text(json.dumps({**CLAUDE_DESKTOP_OWN_KEYS, "mux": {"call_timout": 5}}))
    with pytest.raises(ConfigError, match=r"mux.call_timout: unknown key"):
        load_config(claude)
    own = tmp_path / "mcpmux.toml"
    own.write_text('globalShortcut = "x"\n[servers.files]\ncommand = "npx"\n')
    with pytest.raises(ConfigError, match="globalShortcut: unknown key"):
        load_config(own)
