"""`mux_overhead.py`'s figures and verdicts: what was timed, the lines it prints, and the targets.

A `Timing` holds one section (a transport under one driver: `stdio`, `http`, `http-raw`) and one
tool kind (`plain`, `readonly`, `cached`): each route's `Cell` per concurrency, and per repeat the
median wall time of its 64 × 50 ms bursts. `verdicts` judges mcpmux in it against direct and
against the peers there:

- p50 at the lowest concurrency timed (1 by default), where no queueing hides a cost: ≤ 1.3× direct,
  and below each peer's;
- calls/s at 64 callers: ≥ 0.85× direct, and above each peer's;
- 64 concurrent calls of a tool that sleeps 50 ms, wall time: ≤ 1.2× direct.

Each verdict also lists its figure pass by pass (each pass through mcpmux against the pass of the
same repeat on the other route, minutes apart at most): on a small shared host they spread by tens
of percent, and that spread says how far one run's verdict goes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PEERS = ("callmux", "callmux-c64", "mcp-proxy")
"""Routes through another multiplexer; mcpmux's targets include beating each one present."""
BURST = (64, 50)
"""The burst: this many concurrent calls, each sleeping this many ms in the upstream."""
P50_MAX, CALLS_MIN, BURST_MAX = 1.3, 0.85, 1.2
"""The targets against direct: p50 ratio at most, c=64 calls/s ratio at least, burst wall-time ratio at most."""


@dataclass(slots=True)
class Cell:
    """One route at one concurrency: medians over the repeats, and each timed pass."""

    p50_ms: float
    p99_ms: float
    calls_per_s: float
    cpu_ms_per_call: dict[str, float]
    """CPU time per call by process role: `client` (this process), `middle`, `upstream`."""
    passes: list[dict[str, Any]]

    @classmethod
    def of(cls, passes: list[dict[str, Any]]) -> Cell:
        def median(key: str) -> float:
            return float(statistics.median(p[key] for p in passes))

        roles = passes[0]["cpu_ms_per_call"]
        cpu = {role: statistics.median(p["cpu_ms_per_call"][role] for p in passes) for role in roles}
        return cls(median("p50_ms"), median("p99_ms"), median("calls_per_s"), cpu, passes)

    @property
    def failed_calls(self) -> int:
        return sum(p["failed_calls"] for p in self.passes)


@dataclass(slots=True)
class Timing:
    """One section and tool kind: each route's cells by concurrency, and its burst wall ms, repeat by repeat."""

    section: str
    kind: str
    cells: dict[int, dict[str, Cell]] = field(default_factory=dict)
    bursts_ms: dict[str, list[float]] = field(default_factory=dict)
    failed_calls: dict[str, int] = field(default_factory=dict)
    """Route -> calls that failed in its passes and bursts (left out of the latencies)."""
    first_failure: dict[str, str] = field(default_factory=dict)

    def routes(self) -> list[str]:
        return list(next(iter(self.cells.values()), self.bursts_ms))

    def count_failures(self, route: str, records: list[dict[str, Any]]) -> None:
        """Add the failed calls of `records` (passes or bursts) to `route`'s count; keep the first message."""
        for record in records:
            if record["failed_calls"]:
                self.failed_calls[route] = self.failed_calls.get(route, 0) + record["failed_calls"]
                self.first_failure.setdefault(route, record["first_failure"])


@dataclass(slots=True)
class Verdict:
    """One target: mcpmux's figure (a ratio), whether it met the target, and the same ratio pass by pass.

    A target is not met while mcpmux failed calls of that section and kind, whatever the ratio.
    """

    section: str
    kind: str
    name: str
    value: float
    target: str
    met: bool
    passes: list[float]
    failed_calls: int

    def line(self) -> str:
        outcome = "met" if self.met else "MISSED"
        if self.failed_calls:
            outcome += f" ({self.failed_calls} calls failed)"
        spread = ", ".join(f"{value:.2f}" for value in self.passes)
        figure = f"×{self.value:<5.2f} ({self.target}): {outcome:<6}"
        return f"{self.section:<8} {self.kind:<8} {self.name:<28} {figure} passes {spread}"


def _ratio(mine: list[float], theirs: list[float]) -> tuple[float, list[float]]:
    """Median over median, and pass over pass."""
    by_pass = [m / t for m, t in zip(mine, theirs, strict=True)]
    return statistics.median(mine) / statistics.median(theirs), by_pass


def verdicts(timing: Timing, middle: str = "mcpmux") -> list[Verdict]:
    """`middle`'s verdicts in `timing` (only the targets whose figures were timed)."""
    found: list[Verdict] = []

    def judge(name: str, mine: list[float], theirs: list[float], target: str, met: Callable[[float], bool]) -> None:
        value, by_pass = _ratio(mine, theirs)
        failed = timing.failed_calls.get(middle, 0)
        verdict = Verdict(
            timing.section, timing.kind, name, round(value, 3), target, met(value) and not failed, by_pass, failed
        )
        found.append(verdict)

    def series(concurrency: int, route: str, key: str) -> list[float]:
        return [p[key] for p in timing.cells[concurrency][route].passes]

    routes = timing.routes()
    if middle not in routes or "direct" not in routes:
        return found
    peers = [route for route in routes if route in PEERS]
    if timing.cells:
        low = min(timing.cells)
        p50 = series(low, middle, "p50_ms")
        judge(f"p50 c={low} vs direct", p50, series(low, "direct", "p50_ms"), f"≤ {P50_MAX}", lambda v: v <= P50_MAX)
        for peer in peers:
            judge(f"p50 c={low} vs {peer}", p50, series(low, peer, "p50_ms"), "< 1", lambda v: v < 1)
    if 64 in timing.cells:
        rate = series(64, middle, "calls_per_s")
        direct = series(64, "direct", "calls_per_s")
        judge("calls/s c=64 vs direct", rate, direct, f"≥ {CALLS_MIN}", lambda v: v >= CALLS_MIN)
        for peer in peers:
            judge(f"calls/s c=64 vs {peer}", rate, series(64, peer, "calls_per_s"), "> 1", lambda v: v > 1)
    if timing.bursts_ms:
        name = f"{BURST[0]} × {BURST[1]} ms vs direct"
        burst = timing.bursts_ms[middle]
        judge(name, burst, timing.bursts_ms["direct"], f"≤ {BURST_MAX}", lambda v: v <= BURST_MAX)
    return found


# -- lines -----------------------------------------------------------------------------------------

CELL_HEADER = (
    f"{'section':<8} {'kind':<8} {'N':>3} {'route':<11} | {'p50 ms':>7} {'p99 ms':>7} {'calls/s':>7} | "
    f"{'p50×':>5} {'calls/s×':>8} | {'CPU ms/call: middle':>19} {'upstream':>8} {'client':>6}"
)


def cell_lines(timing: Timing, concurrency: int) -> list[str]:
    """One line per route at `concurrency`; the ratios are against direct's medians."""
    cells = timing.cells[concurrency]
    direct = cells["direct"]
    lines = []
    for route, cell in cells.items():
        cpu = cell.cpu_ms_per_call
        lines.append(
            f"{timing.section:<8} {timing.kind:<8} {concurrency:>3} {route:<11} | {cell.p50_ms:>7.2f} "
            f"{cell.p99_ms:>7.2f} {cell.calls_per_s:>7.0f} | {cell.p50_ms / direct.p50_ms:>5.2f} "
            f"{cell.calls_per_s / direct.calls_per_s:>8.2f} | {cpu['middle']:>19.2f} {cpu['upstream']:>8.2f} "
            f"{cpu['client']:>6.2f}" + (f" | {cell.failed_calls} calls failed" if cell.failed_calls else "")
        )
    return lines


def failure_lines(timings: list[Timing]) -> list[str]:
    """One line per route that failed calls: how many, and the first failure's message."""
    return [
        f"{timing.section:<8} {timing.kind:<8} {route:<11} | {count} calls failed; first: {timing.first_failure[route]}"
        for timing in timings
        for route, count in timing.failed_calls.items()
    ]


def burst_lines(timing: Timing) -> list[str]:
    """One line per route: the median of its repeats' burst wall times, and that against direct's."""
    direct = statistics.median(timing.bursts_ms["direct"])
    lines = []
    for route, walls in timing.bursts_ms.items():
        wall = statistics.median(walls)
        lines.append(
            f"{timing.section:<8} {timing.kind:<8} {route:<11} | {BURST[0]} × {BURST[1]} ms: {wall:7.1f} ms wall, "
            f"×{wall / direct:.2f} direct (repeats from {min(walls):.1f} to {max(walls):.1f})"
        )
    return lines


def summary_table(timings: list[Timing]) -> list[str]:
    """A Markdown table of every route's ratios to direct: p50 at the lowest N, calls/s at 64, the burst."""
    lines = [
        "| section | kind | route | p50 ms | p50 × direct | c=64 calls/s | × direct | 64×50 ms wall | × direct |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for timing in timings:
        low = min(timing.cells) if timing.cells else None
        for route in timing.routes():
            cells = [""] * 6
            if low is not None:
                cell, direct = timing.cells[low][route], timing.cells[low]["direct"]
                cells[0:2] = [f"{cell.p50_ms:.2f}", f"{cell.p50_ms / direct.p50_ms:.2f}"]
            if 64 in timing.cells:
                cell, direct = timing.cells[64][route], timing.cells[64]["direct"]
                cells[2:4] = [f"{cell.calls_per_s:.0f}", f"{cell.calls_per_s / direct.calls_per_s:.2f}"]
            if route in timing.bursts_ms:
                wall, direct_wall = (statistics.median(timing.bursts_ms[r]) for r in (route, "direct"))
                cells[4:6] = [f"{wall:.0f}", f"{wall / direct_wall:.2f}"]
            lines.append(f"| {timing.section} | {timing.kind} | {route} | {' | '.join(cells)} |")
    return lines
