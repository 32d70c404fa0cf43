"""Store real servers' tool catalogs as test data for `benchmarks/tool_search.py`.

    python benchmarks/tool_catalogs.py NPM_FOLDER [OUT]

NPM_FOLDER holds `node_modules/@modelcontextprotocol/server-*` (npm install them there); the time
server comes from PyPI (`mcp-server-time`), server-everything from the project's `.npm`. No
credentials are needed to list tools: servers that insist on a key get a dummy one. Writes
`{"server": [{"name", "title"?, "description", "inputSchema"}, ...]}` to OUT
(default tests/data/tool_catalogs.json).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

from mcpmux.core.config import config_from_dict
from mcpmux.mux.multiplexer import Mux

ROOT = Path(__file__).resolve().parents[1]
DUMMY = "dummy-key-for-listing-only"
NPM_SERVERS: dict[str, tuple[str, list[str], dict[str, str]]] = {
    "filesystem": ("server-filesystem", ["{tmp}"], {}),
    "memory": ("server-memory", [], {}),
    "thinking": ("server-sequential-thinking", [], {}),
    "github": ("server-github", [], {"GITHUB_PERSONAL_ACCESS_TOKEN": DUMMY}),
    "gitlab": ("server-gitlab", [], {"GITLAB_PERSONAL_ACCESS_TOKEN": DUMMY}),
    "brave": ("server-brave-search", [], {"BRAVE_API_KEY": DUMMY}),
    "maps": ("server-google-maps", [], {"GOOGLE_MAPS_API_KEY": DUMMY}),
    "slack": ("server-slack", [], {"SLACK_BOT_TOKEN": DUMMY, "SLACK_TEAM_ID": "T000"}),
    "puppeteer": ("server-puppeteer", [], {}),
}


def servers(npm: Path, tmp: str) -> dict[str, Any]:
    found: dict[str, Any] = {
        "time": {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]},
        "everything": {
            "command": "node",
            "args": [str(ROOT / ".npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"), "stdio"],
        },
    }
    for name, (package, args, env) in NPM_SERVERS.items():
        entry = npm / "node_modules" / "@modelcontextprotocol" / package / "dist" / "index.js"
        if entry.exists():
            found[name] = {"command": "node", "args": [str(entry), *(a.format(tmp=tmp) for a in args)], "env": env}
    return found


async def main(npm: Path, out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = config_from_dict(
            {"servers": servers(npm, tmp), "inference": {"backend": "off"}, "mux": {"tool_search": "off"}}
        )
        async with Mux(config) as mux:
            catalogs = {}
            for name, upstream in sorted(mux.upstreams.items()):
                tools = [
                    tool.model_dump(
                        mode="json", by_alias=True, include={"name", "title", "description", "input_schema"}
                    )
                    for tool in upstream.listing.tools
                ]
                catalogs[name] = tools
                sys.stderr.write(f"{name}: {len(tools)} tools ({upstream.state.value})\n")
    out.write_text(json.dumps(catalogs, indent=1, sort_keys=True) + "\n")  # noqa: ASYNC240


if __name__ == "__main__":
    anyio.run(
        main, Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "tests/data/tool_catalogs.json"
    )
