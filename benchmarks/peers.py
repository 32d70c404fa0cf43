"""The other MCP multiplexers `mux_overhead.py` times next to mcpmux, installed on first use.

    .venv/bin/python benchmarks/peers.py   # install both now and print their commands

- callmux (npm `callmux@0.24.3`), stdio: `callmux [--concurrency N] -- CMD`, installed with npm into
  `benchmarks/.peers/npm`;
- mcp-proxy (PyPI `mcp-proxy==0.13.0`), HTTP: `mcp-proxy --port P -- CMD`. It needs `mcp<2`, which
  cannot share mcpmux's environment, so it gets a virtual environment of its own,
  `benchmarks/.peers/mcp-proxy`.

`benchmarks/.peers/` is git-ignored. A peer that cannot be installed (no npm, no registry) is
reported in one line and left out of the run; the rest of the benchmark goes on without it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

PEERS_DIR = Path(__file__).resolve().parent / ".peers"
CALLMUX = "callmux@0.24.3"
MCP_PROXY = ("mcp-proxy==0.13.0", "mcp<2")


def _installed(stamp: Path, spec: str, install: list[list[str]]) -> bool:
    """Run `install` (a list of commands) unless `stamp` already records `spec`; True once it is installed."""
    if stamp.is_file() and stamp.read_text() == spec:
        return True
    print(f"peers: installing {spec} into {stamp.parent} ...", flush=True)
    for command in install:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
            print(f"peers: {spec} left out: `{' '.join(command)}` failed: {reason[0]}", flush=True)
            return False
    stamp.write_text(spec)
    return True


def callmux() -> list[str] | None:
    """The `callmux` executable, installed with npm if need be; None (after saying why) when it cannot be."""
    if shutil.which("npm") is None:
        print(f"peers: {CALLMUX} left out: npm is not installed", flush=True)
        return None
    prefix = PEERS_DIR / "npm"
    prefix.mkdir(parents=True, exist_ok=True)
    npm = ["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix), CALLMUX]
    if not _installed(prefix / ".installed", CALLMUX, [npm]):
        return None
    return [str(prefix / "node_modules" / ".bin" / "callmux")]


def mcp_proxy() -> list[str] | None:
    """The `mcp-proxy` executable, in a virtual environment of its own; None (after saying why) if it cannot be."""
    venv = PEERS_DIR / "mcp-proxy"
    PEERS_DIR.mkdir(parents=True, exist_ok=True)
    steps = [[sys.executable, "-m", "venv", str(venv)], [str(venv / "bin" / "pip"), "install", "-q", *MCP_PROXY]]
    if not _installed(venv / ".installed", " ".join(MCP_PROXY), steps):
        return None
    return [str(venv / "bin" / "mcp-proxy")]


def main() -> int:
    found = {"callmux": callmux(), "mcp-proxy": mcp_proxy()}
    for name, command in found.items():
        print(f"{name}: {' '.join(command) if command else 'not available'}")
    return 0 if all(found.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
