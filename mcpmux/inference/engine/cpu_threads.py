"""Intra-op threads for CPU steps, chosen from the cores other processes leave free and re-checked while serving.

A step's parallel operators split their work over an OpenMP team and wait for its slowest thread. On
a core that another process holds, a team thread runs only when the OS gives it a slice, so every
operator of the step waits for that slice, hundreds of times a step: with other work on one of two
cores, a two-thread engine ran 3-4x slower than with one thread (docs/perf.md). So before a step, at
most every `INTERVAL_SECONDS` (the first time a quarter of a second after the engine starts), the step
thread reads how much CPU time the machine spent outside this
process on the cores it may run on (`/proc/stat` less this process's own time) and sizes its team to
the cores left: fewer threads as soon as other work takes a core, more again once it has been gone
for two checks in a row. Each change is logged.

The fused CPU kernels (nearly all of a decode step) split their loops over a pool of their own that has no
barrier (`cpu_fused.set_pool_threads`): the engine runs them on the most threads whatever the load, since a
pool thread that waits for a core delays only the chunk it took. With one core of two busy, two pool
threads gave 1.6-1.9x the tokens/s of one (docs/perf.md). What the count here still sizes is torch's own
team, for the operators outside those kernels.

A step the pool runs nearly all of (`pool_step`, as the model runner judges it: decode rows the fused
kernels multiply, any bfloat16 step on the packed layout, a float32 one whose attention the kernels take)
gets a team of one thread: the few operators left
to torch are small, and libgomp's team threads spin for a while after each one (300,000 pauses, about
20 ms here) on the cores the pool's threads need next. A 32-sequence bfloat16 decode step took 12.1 ms
so against 13.7-14.2 ms with torch's two threads (docs/perf.md).
The wait policy itself is libgomp's: it is read once, when torch loads, and shortening it for every
step (`OMP_WAIT_POLICY=PASSIVE`, `GOMP_SPINCOUNT`) made steps on torch's own kernels 3-17% slower.

The same measurement tells the pool whether the host is quiet (`cpu_fused.set_pool_quiet`): its threads then
spin longer before they sleep between loops (a 32-sequence bfloat16 decode step on 2 idle cores
16.4-17.8 ms against 19.6-21.0 ms), which on a shared core would spend its slice spinning (30.9-32.4 ms against
24.8 with a core burnt; `cpu_pool_source`). Like the team, the pool starts as on a quiet host; a governor with
its count fixed never measures and keeps it so.

Only on Linux (elsewhere the count is left as torch set it); `threads` fixes the count instead.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass

import torch

from mcpmux.inference.kernels import cpu_fused

log = logging.getLogger(__name__)

QUIET_OTHERS = 0.25
"""Cores' worth of other processes' use under which the host counts as quiet (for the kernels' pool)."""

INTERVAL_SECONDS = 1.0
"""How often the free cores are measured (a read of /proc/stat, about 50 us)."""

FIRST_INTERVAL_SECONDS = 0.25
"""The first measurement's span, from the governor's creation (engine start): a two-thread team on a busy
host ran 10x slower than one thread (docs/perf.md), so the first steps should not wait a whole interval."""

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

_START_THREADS = torch.get_num_threads()
"""torch's count before any governor set one: `torch.set_num_threads` on any thread also sets the count new
threads start with, so a later engine's step thread would otherwise inherit an earlier one's back-off as its
most (and, at 1, never grow)."""


@dataclass(slots=True)
class _Sample:
    at: float  # time.monotonic()
    busy: float  # CPU seconds the machine spent busy on our cores, since boot
    own: float  # CPU seconds of this process


class ThreadGovernor:
    """Sizes the calling thread's intra-op team before each step (call `check` from the thread that steps)."""

    def __init__(self, threads: int = 0, *, most: int | None = None) -> None:
        """`threads`: 0 chooses from the free cores, up to `most` (default: torch's count at import); N always
        runs N."""
        self.cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.most = threads or most or _START_THREADS
        self.fixed = threads > 0 or not sys.platform.startswith("linux") or self.most <= 1
        self.threads = self.most
        self._wants_more = 0
        self._team = 0  # the count last given to torch on this thread (0: none yet)
        self._last = None if self.fixed else self._sample(time.monotonic())
        self._interval = FIRST_INTERVAL_SECONDS
        cpu_fused.set_pool_quiet(True)  # until measured otherwise, as the team starts at its most

    def check(self, pool_step: bool = False) -> int:
        """The team size for the next step, applied to this thread: one for a `pool_step` (module doc), else the
        count from the free cores, measured at most every `INTERVAL_SECONDS`."""
        self._measure()
        team = 1 if pool_step else self.threads
        if team != self._team:
            torch.set_num_threads(team)
            self._team = team
        return team

    def _measure(self) -> None:
        if self.fixed:
            return
        now = time.monotonic()
        if self._last is not None and now - self._last.at < self._interval:
            return
        sample = self._sample(now)
        if sample is None:
            self.fixed = True
            return
        last, self._last = self._last, sample
        self._interval = INTERVAL_SECONDS
        if last is not None:
            elapsed = sample.at - last.at
            others = max(0.0, (sample.busy - last.busy) - (sample.own - last.own)) / elapsed
            self._resize(others)
            quiet = others < QUIET_OTHERS
            if quiet != cpu_fused.pool_quiet():
                cpu_fused.set_pool_quiet(quiet)

    def _resize(self, others: float) -> None:
        free = len(self.cpus) - others
        want = max(1, min(self.most, int(free + 0.5)))
        if want > self.threads:
            self._wants_more += 1
            if self._wants_more < 2:  # once more before growing: a short lull is not a free core
                return
        self._wants_more = 0
        if want == self.threads:
            return
        verb = "backing off to" if want < self.threads else "back up to"
        log.info(
            "other processes use %.1f of %d cores: %s %d intra-op thread%s (most %d)",
            others, len(self.cpus), verb, want, "" if want == 1 else "s", self.most,
        )  # fmt: skip
        self.threads = want
        torch.set_num_threads(want)
        self._team = want

    def _sample(self, now: float) -> _Sample | None:
        try:
            with open("/proc/stat") as stat:
                lines = stat.read().splitlines()
        except OSError:
            return None
        wanted = {f"cpu{n}" for n in self.cpus}
        busy = 0
        for line in lines:
            name, _, rest = line.partition(" ")
            if name in wanted:
                # user nice system idle iowait irq softirq steal ...: all but idle and iowait are taken
                fields = [int(v) for v in rest.split()]
                busy += sum(fields[:8]) - fields[3] - fields[4]
        times = os.times()
        return _Sample(now, busy / _HZ, times.user + times.system)
