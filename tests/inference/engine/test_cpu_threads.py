"""Intra-op threads follow the cores other processes leave free: a real process burning a core makes the engine's
step thread back off (and say so) and the kernels' pool stop spinning, and a core left free again brings the
threads back."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from mcpmux.inference.engine import cpu_threads
from mcpmux.inference.engine.cpu_threads import ThreadGovernor
from mcpmux.inference.kernels import cpu_fused

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2, reason="needs Linux and 2 cores"
)


def _on_thread(fn: object) -> None:
    """Run `fn` on a fresh thread, as the engine's step thread is: torch's thread count is per thread."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


@pytest.mark.slow  # up to 20 s on a host whose other work keeps the threads high at first
def test_a_process_burning_every_other_core_makes_the_step_thread_back_off(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_threads, "INTERVAL_SECONDS", 0.3)
    monkeypatch.setattr(cpu_threads, "FIRST_INTERVAL_SECONDS", 0.3)
    cores = len(os.sched_getaffinity(0))
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores - 1)
    ]  # fmt: skip
    seen: list[int] = []
    quiet: list[bool] = []

    def serve() -> None:
        governor = ThreadGovernor(most=cores)  # as torch's default count on an idle machine
        quiet.append(cpu_fused.pool_quiet())
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and governor.check() > 1:
            time.sleep(0.05)
        seen.append(governor.threads)
        seen.append(torch.get_num_threads())
        quiet.append(cpu_fused.pool_quiet())

    try:
        with caplog.at_level(logging.INFO, logger=cpu_threads.__name__):
            _on_thread(serve)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert seen == [1, 1], "the step thread kept more threads than the cores left free"
    assert "backing off to 1 intra-op thread" in caplog.text
    # The kernels' pool keeps its threads, but no longer spins on the core the burner shares.
    assert quiet == [True, False]


def test_threads_come_back_once_a_core_stays_free(caplog: pytest.LogCaptureFixture) -> None:
    """What the governor does with a measurement: one quiet check is not enough to grow, two are."""
    seen: list[tuple[int, int]] = []

    def serve() -> None:
        governor = ThreadGovernor(most=2)
        governor.check()
        governor._resize(others=1.0)
        seen.append((governor.threads, torch.get_num_threads()))
        governor._resize(others=0.0)
        seen.append((governor.threads, torch.get_num_threads()))
        governor._resize(others=0.1)
        seen.append((governor.threads, torch.get_num_threads()))

    with caplog.at_level(logging.INFO, logger=cpu_threads.__name__):
        _on_thread(serve)
    assert seen == [(1, 1), (1, 1), (2, 2)]
    assert "back up to 2 intra-op threads" in caplog.text


def test_a_fixed_count_is_kept_whatever_the_load() -> None:
    seen: list[int] = []

    def serve() -> None:
        governor = ThreadGovernor(threads=2)
        for _ in range(3):
            seen.append(governor.check())
        seen.append(torch.get_num_threads())

    _on_thread(serve)
    assert seen == [2, 2, 2, 2]


def test_a_step_the_kernels_pool_runs_gives_torch_one_thread_and_the_next_gets_the_count_back() -> None:
    seen: list[tuple[int, int, int]] = []

    def serve() -> None:
        governor = ThreadGovernor(threads=2)
        for pool_step in (False, True, True, False):
            seen.append((governor.check(pool_step=pool_step), torch.get_num_threads(), governor.threads))

    _on_thread(serve)
    # A pool step's one thread is the step's alone: the count the governor keeps for the others stays 2.
    assert seen == [(2, 2, 2), (1, 1, 2), (1, 1, 2), (2, 2, 2)]


def test_a_later_engines_governor_is_not_held_to_an_earlier_ones_back_off() -> None:
    # torch.set_num_threads on one thread sets the count new threads start with: a second engine (another
    # local model, the next benchmark run) must still be free to use every thread it started with.
    most = cpu_threads._START_THREADS
    if most < 2:
        pytest.skip("torch was started with one thread")
    seen: list[tuple[int, bool, int]] = []

    def first() -> None:
        governor = ThreadGovernor()
        governor.check()
        governor._resize(others=len(governor.cpus) - 1.0)
        seen.append((governor.threads, governor.fixed, torch.get_num_threads()))

    def second() -> None:
        governor = ThreadGovernor()
        seen.append((governor.most, governor.fixed, governor.check()))
        torch.set_num_threads(most)  # as the process started, for the tests after this one

    _on_thread(first)
    _on_thread(second)
    assert seen == [(1, False, 1), (most, False, most)]
