"""`mcpmux check`: the resolved upstreams, and what would keep one from starting, found before serving.

Validation (`load_config`) already refused what cannot mean anything (a server with both `command`
and `url`, an unknown key in `mcpmux.toml`). What is left is what only this machine can answer: a
stdio command that is not there (a relative path after resolving it against the config's folder,
or a name not on the PATH the server will get) and a working directory that does not exist.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from mcpmux.core.config import Config, ServerConfig


def check_servers(config: Config) -> tuple[list[str], int]:
    """One line per server (its transport and where it is), with its problems; and how many problems."""
    lines, problems = [], 0
    for name, server in config.servers.items():
        if server.transport == "stdio":
            where = shlex.join([server.command or "", *server.args]) + (f"  (in {server.cwd})" if server.cwd else "")
        else:
            where = server.url or ""
        flags = "" if server.enabled else "  [disabled]"
        lines.append(f"  {name}: {server.transport} {where}{flags}")
        found = _problems(server) if server.enabled else []
        lines += [f"    problem: {problem}" for problem in found]
        problems += len(found)
    return lines, problems


def _problems(server: ServerConfig) -> list[str]:
    if server.transport != "stdio":
        return []
    found = []
    cwd = Path(server.cwd) if server.cwd else None
    if cwd is not None and not cwd.is_dir():
        found.append(f"cwd {server.cwd!r} is not a folder")
    command = server.command or ""
    if "/" in command:
        path = Path(command) if Path(command).is_absolute() or cwd is None else cwd / command
        if not path.is_file():
            found.append(f"command {command!r} does not exist")
        elif not os.access(path, os.X_OK):
            found.append(f"command {command!r} is not executable (chmod +x it)")
    else:
        search = server.env.get("PATH", os.environ.get("PATH", os.defpath))
        if shutil.which(command, path=search) is None:
            found.append(
                f"command {command!r} is not on PATH; give its absolute path (a client such as Claude Desktop "
                "starts mcpmux with a minimal PATH)"
            )
    return found
