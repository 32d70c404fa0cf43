"""The official MCP conformance suite, run as `make conformance` runs it (benchmarks/conformance/).

Server scenarios: every one the reference server passes directly passes through mcpmux's HTTP front
too, in 0.1.16 and in the 0.2 line's requirement sets. Client scenarios: mcpmux's own commands
(`mcpmux login`, `tools`, `call`) pass the 0.1.16 suite. What mcpmux does not pass yet is named
below with the reason, and must still fail: a gap that closes has to leave this list (as the
suite's own expected-failures files work). docs/conformance.md has the table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # minutes of real servers and clients on 2 cores

RUN = ROOT / "benchmarks" / "conformance" / "run.py"
REFERENCE = Path(os.environ.get("MCP_CONFORMANCE_REPO", "/work/.mirror/modelcontextprotocol+conformance/repo"))
"""A git mirror of github.com/modelcontextprotocol/conformance: its reference server is not on npm
(benchmarks/conformance/install.py)."""
LATEST = "0.2.0-alpha.12"

SERVER_GAPS: dict[tuple[str, str], set[str]] = {}
UNSETTLED: dict[tuple[str, str], set[str]] = {
    # Pending in the suite (run, not scored). The reference hands `test_reconnection`'s result only to
    # a reconnection made within 100 ms, though it asks clients to wait 5 s (`retry`); mcpmux waits
    # as asked (docs/conformance.md). Reported, not asserted.
    (LATEST, "--requirements 2025-11-25"): {"server-sse-polling"},
}
CLIENT_GAPS: set[str] = set()


def tables(folder: Path, *options: str) -> list[dict[str, Any]]:
    out = folder / "tables.json"
    done = subprocess.run(
        [sys.executable, str(RUN), *options, "--json", str(out)], capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result: list[dict[str, Any]] = json.loads(out.read_text())
    return result


@pytest.mark.skipif(
    not REFERENCE.exists(),
    reason=f"no mirror of the conformance suite's repository at {REFERENCE} (its reference server is not on npm): "
    "set MCP_CONFORMANCE_REPO to a clone of github.com/modelcontextprotocol/conformance",
)
def test_every_server_scenario_the_reference_passes_passes_through_mcpmux(tmp_path: Path) -> None:
    """With `protocol = "auto"`, mcpmux's default. The reference server speaks both eras and asks for
    sampling and elicitation only on its 2025 path: the 2025 sets' clients, which declare both, reach
    it through a 2025 session (`mcpmux.mux.sessions`), as they would directly."""
    found = tables(tmp_path, "--role", "server", "--suite", "0.1.16", "--suite", LATEST)
    assert [(t["suite"], t["selection"]) for t in found] == [
        ("0.1.16", "--suite all"),
        (LATEST, "--requirements 2025-11-25"),
        (LATEST, "--requirements 2026-07-28"),
    ]
    assert len(found[0]["direct"]) == 32
    for table in found:
        gaps = SERVER_GAPS.get((table["suite"], table["selection"]), set())
        unsettled = UNSETTLED.get((table["suite"], table["selection"]), set())
        passed_direct = {name for name, outcome in table["direct"].items() if outcome["passed"]} - unsettled
        failed_mcpmux = {name for name, outcome in table["mcpmux"].items() if not outcome["passed"]}
        assert (passed_direct & failed_mcpmux) - gaps == set(), (table["suite"], table["selection"], table["mcpmux"])
        assert failed_mcpmux >= gaps, f"now passing, take them off SERVER_GAPS: {gaps - failed_mcpmux}"


def test_mcpmux_as_the_client_passes_the_suite(tmp_path: Path) -> None:
    (table,) = tables(tmp_path, "--role", "client", "--suite", "0.1.16", "--no-direct-client")
    assert len(table["mcpmux"]) == 26
    failed = {name for name, outcome in table["mcpmux"].items() if not outcome["passed"]}
    assert failed - CLIENT_GAPS == set()
    assert failed >= CLIENT_GAPS, f"now passing, take them off CLIENT_GAPS: {CLIENT_GAPS - failed}"
