"""The MCP conformance suite against its reference server directly and through mcpmux, and against
its reference client and mcpmux as the client: one table per run, scenario by scenario.

    .venv/bin/python benchmarks/conformance/run.py                 # everything (~10 minutes)
    .venv/bin/python benchmarks/conformance/run.py --role server --suite 0.1.16
    make conformance                                                # the same as the first line

Runs, for each suite version (`install.SUITES`, installed on first use):
- server: the suite as the client, against the reference server (`direct`) and against mcpmux's
  HTTP front fronting that server with `prefix_single = false` and sampling policy `client` (`mcpmux`);
- client: the suite's mock servers, driven by the suite's reference client (`direct`) and by
  mcpmux's own commands (`mcpmux_client.py`: `mcpmux login`, `mcpmux tools`, `mcpmux call`).
0.1.16 runs `--suite all`; the 0.2 line runs each revision's frozen requirement set
(`--requirements 2025-11-25` and `2026-07-28`, each at its own wire). Prints a Markdown table per
run and writes them all as JSON (`--json`, default benchmarks/results/conformance.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from install import ROOT, SUITES, Suite, install, node_env

sys.path.insert(0, str(ROOT))  # run as a script: the repository's packages come first
from tests.e2e.conftest import free_port, stop, wait_for_port

HERE = Path(__file__).resolve().parent
RESULTS = ROOT / "benchmarks" / "results" / "conformance.json"
SUMMARY_LINE = re.compile(r"^([✓✗]) (\S+): (\d+) passed, (\d+) failed")
RUN_TIMEOUT = 900
CLIENT_TIMEOUT_MS = 120_000


@dataclass(frozen=True, slots=True)
class Outcome:
    """One scenario's verdict in one run: passed (the suite's ✓), and its checks."""

    passed: bool
    checks_passed: int
    checks_failed: int

    def cell(self) -> str:
        mark = "pass" if self.passed else "FAIL"
        return f"{mark} ({self.checks_passed}/{self.checks_passed + self.checks_failed})"


@dataclass(frozen=True, slots=True)
class Table:
    """Scenario by scenario, `direct` beside `mcpmux`, for one role, suite version and selection."""

    role: str
    suite: str
    selection: str
    direct: dict[str, Outcome]
    mcpmux: dict[str, Outcome]

    def markdown(self) -> str:
        head = f"### {self.role} scenarios, suite {self.suite}, {self.selection}\n\n"
        rows = ["| scenario | direct | mcpmux |", "|---|---|---|"]
        for name in sorted(self.direct.keys() | self.mcpmux.keys(), key=self._order):
            rows.append(f"| {name} | {self._cell(self.direct, name)} | {self._cell(self.mcpmux, name)} |")
        totals = f"\n\n{self._count(self.direct)} direct, {self._count(self.mcpmux)} through mcpmux.\n"
        return head + "\n".join(rows) + totals

    def _order(self, name: str) -> int:
        order = list(self.mcpmux) + [n for n in self.direct if n not in self.mcpmux]
        return order.index(name)

    @staticmethod
    def _cell(outcomes: dict[str, Outcome], name: str) -> str:
        outcome = outcomes.get(name)
        return outcome.cell() if outcome is not None else "not run"

    @staticmethod
    def _count(outcomes: dict[str, Outcome]) -> str:
        return f"{sum(o.passed for o in outcomes.values())} of {len(outcomes)} passed"


@contextmanager
def serving(command: list[str], port: int, log: Path, cwd: Path | None = None, **env: str) -> Iterator[None]:
    """`command` running (its output in `log`) until the block ends; it must listen on `port`."""
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=cwd, env=node_env() | env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for_port(port, process, timeout=60.0)
            yield
        finally:
            stop(process)


def reference_server(suite: Suite, work: Path) -> tuple[str, AbstractContextManager[None]]:
    port = free_port()
    server = serving(suite.server(), port, work / "reference-server.log", cwd=suite.server_dir, PORT=str(port))
    return f"http://localhost:{port}/mcp", server


def mcpmux_server(upstream: str, protocol: str, work: Path) -> tuple[str, AbstractContextManager[None]]:
    port = free_port()
    config = work / "mcpmux.toml"
    # Sampling policy `client`: the suite tests a relay, so only its own client may answer the reference's
    # sampling (by default mcpmux's local model answers for a client that cannot: docs/conformance.md).
    config.write_text(
        f'[mux]\nprefix_single = false\n\n[servers.reference]\nurl = "{upstream}"\nprotocol = "{protocol}"\n\n'
        '[servers.reference.sampling]\npolicy = "client"\n'
    )
    command = [sys.executable, "-m", "mcpmux", "serve", "--transport", "http", "--config", str(config)]
    server = serving([*command, "--port", str(port)], port, work / "mcpmux-server.log", MCPMUX_HOME=str(work))
    return f"http://localhost:{port}/mcp", server


REVISIONS = ("2025-11-25", "2026-07-28")


def selections(suite: Suite, revisions: list[str] | None = None) -> list[list[str]]:
    """0.1.x: every scenario; 0.2: each revision's frozen requirement set (or those of `revisions`), at its own wire."""
    if suite.version.startswith("0.1."):
        return [["--suite", "all"]]
    return [["--requirements", revision] for revision in revisions or REVISIONS]


def run_suite(suite: Suite, role: str, target: list[str], selection: list[str], out: Path) -> dict[str, Outcome]:
    """One run of the suite; each scenario's outcome as its summary prints it."""
    command = ["node", str(suite.conformance), role, *target, *selection, "-o", str(out)]
    done = subprocess.run(command, env=node_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT)
    (out.parent / f"{out.name}.log").write_text(done.stdout + done.stderr)
    outcomes: dict[str, Outcome] = {}
    for line in done.stdout.splitlines():
        match = SUMMARY_LINE.match(line)
        if match and match[2] not in outcomes:  # the "not scored" list repeats a few
            outcomes[match[2]] = Outcome(match[1] == "✓", int(match[3]), int(match[4]))
    if not outcomes:
        raise RuntimeError(f"`{shlex.join(command)}` printed no summary:\n{(done.stdout + done.stderr)[-3000:]}")
    return outcomes


def server_tables(suite: Suite, protocol: str, work: Path, revisions: list[str] | None) -> list[Table]:
    tables = []
    for selection in selections(suite, revisions):
        name = "-".join(part.strip("-") for part in selection)
        folder = work / f"server-{suite.version}-{name}"
        folder.mkdir(parents=True)
        reference, upstream = reference_server(suite, folder)
        with upstream:
            direct = run_suite(suite, "server", ["--url", reference], selection, folder / "direct")
            front, mux = mcpmux_server(reference, protocol, folder)
            with mux:
                through = run_suite(suite, "server", ["--url", front], selection, folder / "mcpmux")
        tables.append(Table("server", suite.version, " ".join(selection), direct, through))
    return tables


def client_scenarios(suite: Suite, selection: list[str]) -> list[tuple[str, list[str]]]:
    """Each client scenario of `selection`, with the options that run it alone as the selection would."""
    requirements = selection[1:] if selection[0] == "--requirements" else []
    listed = subprocess.run(
        ["node", str(suite.conformance), "list", *(["--requirements", *requirements] if requirements else [])],
        env=node_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    clients = listed.split("Client scenarios", 1)[1].split("Authorization server scenarios", 1)[0]
    names = []
    for line in clients.splitlines():
        entry = re.match(r"^\s+- (\S+)(?: \[(.*)\])?$", line)
        if entry and (not requirements or entry[2] in (None, "client")):
            names.append(entry[1])
    # A requirement set runs its scenarios at its revision's wire, even outside their own window.
    pinned = ["--spec-version", requirements[0], "--force"] if requirements else []
    return [(name, pinned) for name in names]


def run_client(suite: Suite, command: list[str], scenario: str, options: list[str], out: Path) -> Outcome:
    """One client scenario alone: the suite's own runs start every scenario at once, which would
    starve mcpmux's processes (three Python commands a scenario) of CPU past the suite's timeouts."""
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            "node",
            str(suite.conformance),
            "client",
            "--command",
            shlex.join(command),
            "--scenario",
            scenario,
            *options,
            "--timeout",
            str(CLIENT_TIMEOUT_MS),
            "-o",
            str(out),
        ],
        env=node_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    (out / "run.log").write_text(done.stdout + done.stderr)
    statuses = [check.get("status") for path in out.rglob("checks.json") for check in json.loads(path.read_text())]
    return Outcome(
        done.returncode == 0, statuses.count("SUCCESS"), statuses.count("FAILURE") + statuses.count("WARNING")
    )


def client_tables(suite: Suite, work: Path, revisions: list[str] | None, direct_too: bool) -> list[Table]:
    tables = []
    ours = [sys.executable, str(HERE / "mcpmux_client.py")]
    for selection in selections(suite, revisions):
        name = "-".join(part.strip("-") for part in selection)
        folder = work / f"client-{suite.version}-{name}"
        folder.mkdir(parents=True, exist_ok=True)
        direct: dict[str, Outcome] = {}
        if direct_too:  # the reference client is light: the suite runs its scenarios side by side
            direct = run_suite(suite, "client", ["--command", shlex.join(suite.client())], selection, folder / "direct")
        through: dict[str, Outcome] = {}
        for scenario, options in client_scenarios(suite, selection):
            through[scenario] = run_client(
                suite, ours, scenario, options, folder / "mcpmux" / scenario.replace("/", "-")
            )
        tables.append(Table("client", suite.version, " ".join(selection), direct, through))
    return tables


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=SUITES, action="append", help="suite version (default: all of them)")
    parser.add_argument("--role", choices=["server", "client"], action="append", help="default: both")
    parser.add_argument("--requirements", choices=REVISIONS, action="append", help="0.2's sets (default: all)")
    parser.add_argument("--protocol", default="auto", choices=["auto", "legacy"], help="mcpmux's upstream protocol")
    parser.add_argument("--no-direct-client", action="store_true", help="client scenarios: mcpmux only")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"where the tables go (default {RESULTS})")
    parser.add_argument("--keep", type=Path, default=None, help="keep the suite's results and logs in this folder")
    args = parser.parse_args()
    tables: list[Table] = []
    with tempfile.TemporaryDirectory(prefix="conformance-") as scratch:
        work = args.keep or Path(scratch)
        for version in args.suite or SUITES:
            roles = args.role or ["server", "client"]
            suite = install(version, reference="server" in roles or not args.no_direct_client)
            if "server" in roles:
                tables += server_tables(suite, args.protocol, work, args.requirements)
            if "client" in roles:
                tables += client_tables(suite, work, args.requirements, not args.no_direct_client)
    for table in tables:
        print(table.markdown())
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps([asdict(table) for table in tables], indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
