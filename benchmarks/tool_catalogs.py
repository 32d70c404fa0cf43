"""Store real servers' tool catalogs as test data for `benchmarks/tool_search.py`.

    python benchmarks/tool_catalogs.py NPM_FOLDER VENVS [--only NAME ...] [--list]

Each server of `SERVERS` is a real package from npm or PyPI, at the version named there. Install
them first, outside the repository:

    npm install --prefix NPM_FOLDER --ignore-scripts PACKAGE@VERSION ...     (the npm ones)
    python -m venv VENVS/PACKAGE && VENVS/PACKAGE/bin/pip install PACKAGE==VERSION   (one venv each:
                                                                              their pins conflict)

(`--list` prints both command lines.) Each server is started as a client configures it and asked
for its tools by a real client (`mcp.Client` over stdio); no credentials are needed to list tools:
servers that insist on a key get a dummy one, and those needing a database get an address where none
listens. What answered is merged into `tests/data/tool_catalogs.json` (`{"server": [{"name",
"title", "description", "inputSchema"}, ...]}`) and `tests/data/tool_servers.json` (each server's
package, its `serverInfo` and `instructions`). The first 11 servers (time, everything, and the
reference servers of `@modelcontextprotocol`) were stored by an earlier version of this script and
are kept as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]
CATALOGS = ROOT / "tests" / "data" / "tool_catalogs.json"
SERVER_INFO = ROOT / "tests" / "data" / "tool_servers.json"
DUMMY = "dummy-key-for-listing-only"
NOWHERE = "127.0.0.1:9"  # the discard port: nothing listens there

# name -> (package spec, command after the package's entry point, environment). "npm:" packages run
# their `bin` with node; "pypi:" ones their console script from VENVS/<package>/bin.
SERVERS: dict[str, tuple[str, list[str], dict[str, str]]] = {
    "postgres": ("npm:@modelcontextprotocol/server-postgres@0.6.2", [f"postgresql://{NOWHERE}/db"], {}),
    "redis": ("npm:@modelcontextprotocol/server-redis@2025.4.25", [f"redis://{NOWHERE}"], {}),
    "aws_kb": (
        "npm:@modelcontextprotocol/server-aws-kb-retrieval@0.6.2",
        [],
        {"AWS_ACCESS_KEY_ID": DUMMY, "AWS_SECRET_ACCESS_KEY": DUMMY, "AWS_REGION": "us-east-1"},
    ),
    "everart": ("npm:@modelcontextprotocol/server-everart@0.6.2", [], {"EVERART_API_KEY": DUMMY}),
    "gdrive": ("npm:@modelcontextprotocol/server-gdrive@2025.1.14", [], {}),
    "notion": ("npm:@notionhq/notion-mcp-server@2.5.2", [], {"NOTION_TOKEN": DUMMY}),
    "playwright": ("npm:@playwright/mcp@0.0.83", ["--headless"], {}),
    "context7": ("npm:@upstash/context7-mcp@4.1.1", [], {}),
    "firecrawl": ("npm:firecrawl-mcp@3.26.0", [], {"FIRECRAWL_API_KEY": DUMMY}),
    "tavily": ("npm:tavily-mcp@0.2.22", [], {"TAVILY_API_KEY": DUMMY}),
    "exa": ("npm:exa-mcp-server@3.4.1", [], {"EXA_API_KEY": DUMMY}),
    "supabase": ("npm:@supabase/mcp-server-supabase@0.13.0", ["--access-token", DUMMY], {}),
    "stripe": ("npm:@stripe/mcp@0.3.3", ["--tools=all", f"--api-key=sk_test_{DUMMY}"], {}),
    "kubernetes": ("npm:mcp-server-kubernetes@4.1.7", [], {}),
    "youtube": ("npm:@kimtaeyoon83/mcp-server-youtube-transcript@0.1.1", [], {}),
    "mysql": (
        "npm:@benborla29/mcp-server-mysql@2.0.9",
        [],
        {"MYSQL_HOST": "127.0.0.1", "MYSQL_PORT": "9", "MYSQL_USER": "root", "MYSQL_PASS": "", "MYSQL_DB": "db"},
    ),
    "airbnb": ("npm:@openbnb/mcp-server-airbnb@0.3.0", ["--ignore-robots-txt"], {}),
    "hubspot": ("npm:@hubspot/mcp-server@0.4.0", [], {"PRIVATE_APP_ACCESS_TOKEN": DUMMY}),
    "desktop": ("npm:@wonderwhy-er/desktop-commander@0.2.52", [], {}),
    "sentry": ("npm:@sentry/mcp-server@0.39.0", [f"--access-token={DUMMY}"], {}),
    "heroku": ("npm:@heroku/mcp-server@1.2.8", [], {"HEROKU_API_KEY": DUMMY}),
    "linear": ("npm:mcp-server-linear@1.6.0", [], {"LINEAR_API_KEY": DUMMY}),
    "mongodb": ("npm:mongodb-mcp-server@3.0.4", [], {}),
    "elasticsearch": (
        "npm:@elastic/mcp-server-elasticsearch@0.3.1",
        [],
        {"ES_URL": f"http://{NOWHERE}", "ES_API_KEY": DUMMY},
    ),
    "figma": ("npm:figma-developer-mcp@0.13.2", ["--stdio"], {"FIGMA_API_KEY": DUMMY}),
    "perplexity": ("npm:@perplexity-ai/mcp-server@1.2.1", [], {"PERPLEXITY_API_KEY": DUMMY}),
    "git": ("pypi:mcp-server-git==2026.10.19", [], {}),
    "fetch": ("pypi:mcp-server-fetch==2026.10.24", [], {}),
    "sqlite": ("pypi:mcp-server-sqlite==2025.4.25", ["--db-path", "{tmp}/test.db"], {}),
    "sentry_py": ("pypi:mcp-server-sentry==2025.1.14", ["--auth-token", DUMMY], {}),
    "obsidian": ("pypi:mcp-obsidian==0.2.3", [], {"OBSIDIAN_API_KEY": DUMMY}),
    "duckduckgo": ("pypi:duckduckgo-mcp-server==0.7.0", [], {}),
    "arxiv": ("pypi:arxiv-mcp-server==0.8.2", ["--storage-path", "{tmp}"], {}),
    "calculator": ("pypi:mcp-server-calculator==0.2.1", [], {}),
    "wikipedia": ("pypi:wikipedia-mcp==2.0.1", [], {}),
    "excel": ("pypi:excel-mcp-server==2.2.2", ["stdio"], {}),
    "neo4j": (
        "pypi:mcp-neo4j-cypher==0.6.0",
        [],
        {"NEO4J_URI": f"bolt://{NOWHERE}", "NEO4J_USERNAME": "neo4j", "NEO4J_PASSWORD": DUMMY},
    ),
    "trello": ("pypi:mcp-server-trello==0.5.2", [], {"TRELLO_API_KEY": DUMMY, "TRELLO_TOKEN": DUMMY}),
    "clickhouse": ("pypi:mcp-clickhouse==0.7.0", [], {"CLICKHOUSE_HOST": "127.0.0.1", "CLICKHOUSE_PORT": "9"}),
    "atlassian": (
        "pypi:mcp-atlassian==0.23.1",
        [],
        {
            "JIRA_URL": "https://example.atlassian.net",
            "JIRA_USERNAME": "someone@example.com",
            "JIRA_API_TOKEN": DUMMY,
            "CONFLUENCE_URL": "https://example.atlassian.net/wiki",
            "CONFLUENCE_USERNAME": "someone@example.com",
            "CONFLUENCE_API_TOKEN": DUMMY,
        },
    ),
}
EXTRA_PINS = {"mcp-server-sqlite": "mcp<2", "mcp-server-sentry": "mcp<2"}
"""Installed beside these packages: they require `mcp` unpinned, and mcp 2 removed what they use."""
LIST_TIMEOUT = 60.0
_STORED = {"name", "title", "description", "input_schema"}


def package_of(spec: str) -> tuple[str, str, str]:
    """("npm" | "pypi", package name, version) of a `SERVERS` spec."""
    kind, _, rest = spec.partition(":")
    if kind == "npm":
        name, _, version = rest.rpartition("@")
        return kind, name, version
    name, _, version = rest.partition("==")
    return kind, name, version


def command_of(name: str, npm: Path, venvs: Path, tmp: str) -> list[str]:
    spec, args, _ = SERVERS[name]
    kind, package, _ = package_of(spec)
    args = [arg.format(tmp=tmp) for arg in args]
    if kind == "npm":
        manifest = json.loads((npm / "node_modules" / package / "package.json").read_text())
        scripts_of = manifest.get("bin", {})
        entry = scripts_of if isinstance(scripts_of, str) else next(iter(scripts_of.values()))
        return ["node", str(npm / "node_modules" / package / entry), *args]
    scripts = [path for path in (venvs / package / "bin").iterdir() if path.name not in _VENV_SCRIPTS]
    script = min(scripts, key=lambda path: (path.name != package, len(path.name)))  # the package's own first
    return [str(script), *args]


_OTHER_SCRIPTS = (
    "python python3 pip pip3 activate activate.csh activate.fish Activate.ps1 mcp httpx normalizer "
    "dotenv uvicorn fastmcp jsonschema markdown-it pygmentize typer websockets watchfiles"
)
_VENV_SCRIPTS = frozenset(_OTHER_SCRIPTS.split())


async def capture(name: str, command: list[str], env: dict[str, str]) -> dict[str, Any]:
    params = StdioServerParameters(command=command[0], args=command[1:], env={**os.environ, **env})
    with anyio.fail_after(LIST_TIMEOUT):
        async with Client(params) as client:
            tools = (await client.list_tools()).tools
            info = client.server_info
            return {
                "tools": [tool.model_dump(mode="json", by_alias=True, include=_STORED) for tool in tools],
                "info": {
                    "package": SERVERS[name][0],
                    "serverInfo": info.model_dump(mode="json", include={"name", "version", "title"}) if info else None,
                    "instructions": client.instructions or "",
                },
            }


async def main(args: argparse.Namespace) -> None:
    names = args.only or list(SERVERS)
    catalogs = json.loads(CATALOGS.read_text())
    infos = json.loads(SERVER_INFO.read_text()) if SERVER_INFO.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            env = SERVERS[name][2]
            try:
                command = command_of(name, args.npm, args.venvs, tmp)
                found = await capture(name, command, env)
            except Exception as err:  # a server that cannot list offline is left out, and said so
                sys.stderr.write(f"{name}: not stored ({type(err).__name__}: {err})\n")
                continue
            catalogs[name] = found["tools"]
            infos[name] = found["info"]
            sys.stderr.write(f"{name}: {len(found['tools'])} tools\n")
    CATALOGS.write_text(json.dumps(catalogs, indent=1, sort_keys=True) + "\n")
    SERVER_INFO.write_text(json.dumps(infos, indent=1, sort_keys=True) + "\n")


def install_lines(npm: Path, venvs: Path) -> str:
    packages = [package_of(spec) for spec, _, _ in SERVERS.values()]
    npm_specs = " ".join(f"{name}@{version}" for kind, name, version in packages if kind == "npm")
    lines = [f"npm install --prefix {npm} --ignore-scripts {npm_specs}"]
    for kind, name, version in packages:
        if kind == "pypi":
            extra = f" '{EXTRA_PINS[name]}'" if name in EXTRA_PINS else ""
            lines.append(f"python -m venv {venvs / name} && {venvs / name}/bin/pip install {name}=={version}{extra}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("npm", type=Path, help="the folder npm installed the npm servers in")
    parser.add_argument("venvs", type=Path, help="the folder of one virtual environment per PyPI server")
    parser.add_argument("--only", nargs="*", choices=sorted(SERVERS), help="these servers alone")
    parser.add_argument("--list", action="store_true", help="print the install commands and stop")
    parsed = parser.parse_args()
    if parsed.list:
        print(install_lines(parsed.npm, parsed.venvs))
    else:
        anyio.run(main, parsed)
