"""Runs the Triton test files in a fresh TRITON_INTERPRET=1 process when this one cannot (see conftest)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.inference.kernels.conftest import TRITON_TEST_FILES, triton_runs_here

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


@pytest.mark.slow
def test_triton_files_pass_in_an_interpreter_process() -> None:
    if triton_runs_here():
        pytest.skip("the Triton test files run in this process already")
    files = [str(HERE / name) for name in TRITON_TEST_FILES if (HERE / name).exists()]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("MCPMUX_KERNELS", None)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, f"Triton tests failed under the interpreter:\n{tail}"
    # Every Triton test must have run for real in the child, none skipped.
    summary = run.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary), tail
    assert "skipped" not in summary, tail
