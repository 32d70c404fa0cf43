"""The fused kernels' build survives a process killed mid-build, keeps two installs apart, and waits for another
builder a bounded, logged time: real gcc builds in real processes (the kernels themselves, or a one-function
extension where only the build machinery is under test)."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpmux.inference.kernels import jit_build

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="needs a C++ compiler (gcc)"),
]

REPO = Path(__file__).resolve().parents[3]

TINY = textwrap.dedent(
    """
    #include <torch/extension.h>
    int64_t twice(int64_t x) { return 2 * x; }
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }
    """
)

# Builds (or finds) the one-function extension and says where it came from.
TINY_SCRIPT = textwrap.dedent(
    f"""
    import logging, sys, torch
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from mcpmux.inference.kernels import jit_build
    module = jit_build.load("mcpmux_test_tiny", [{TINY!r}], ["-O1"])
    assert module.twice(21) == 42
    print(torch.__file__)
    print(jit_build.build_root() / module.__name__)
    """
)

KERNELS_SCRIPT = textwrap.dedent(
    """
    import logging, sys, torch
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from mcpmux.inference.kernels import cpu_fused
    ops = cpu_fused.enable(wait=True)
    assert ops is not None, "the fused kernels did not build"
    logits = torch.tensor([[0.0, 3.0, 1.0]])
    assert ops.argmax_rows(logits).tolist() == [1]
    print("kernels ready")
    """
)


def _env(extensions: Path) -> dict[str, str]:
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions), PYTHONPATH=str(REPO))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # ninja
    return env


def _run(python: str, script: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-c", script], env=env, capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO
    )


def _partials(root: Path) -> list[Path]:
    return sorted(root.glob("*.partial-*"))


def test_a_build_killed_midway_leaves_nothing_that_stops_the_next_start(tmp_path: Path) -> None:
    env = _env(tmp_path)
    root = tmp_path / "mcpmux"
    first = subprocess.Popen(
        [sys.executable, "-c", KERNELS_SCRIPT], env=env, cwd=REPO, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        # Killed once the compiler is at work: its private folder holds the build file ninja runs.
        while not any((p / "build.ninja").is_file() for p in _partials(root)):
            assert first.poll() is None, "the first build ended before it could be killed"
            assert time.monotonic() < deadline, "the first build never started"
            time.sleep(0.2)
        time.sleep(2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the compiler and ninja with it
        first.wait()
    left = _partials(root)
    assert left, "the killed build left no private folder: the test did not kill it mid-build"

    second = _run(sys.executable, KERNELS_SCRIPT, env, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "kernels ready" in second.stdout
    assert "waiting" not in second.stderr, "the second start waited on the dead build's lock"
    assert "removing" in second.stderr, "the dead build's folder stayed"
    assert not any(p.exists() for p in left)
    assert not _partials(root)
    assert len([p for p in root.iterdir() if p.is_dir()]) == 1

    third = _run(sys.executable, KERNELS_SCRIPT, env, timeout=300)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "loaded from" in third.stderr
    assert "building" not in third.stderr


@pytest.fixture(scope="module")
def second_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Another virtual environment with a torch install of its own (the same version, elsewhere on disk); the
    rest of its packages come from this one's."""
    venv = tmp_path_factory.mktemp("venv2")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    import torch

    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
         f"torch=={torch.__version__.split('+')[0]}"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if install.returncode != 0:
        pytest.skip(f"torch could not be installed into a second venv: {install.stderr[-500:]}")
    ours = sysconfig.get_paths()["purelib"]
    (site / "zz_first_venv.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return venv / "bin" / "python"


def test_two_venvs_build_into_two_folders_that_never_touch(tmp_path: Path, second_venv: Path) -> None:
    env = _env(tmp_path)
    # Both at once, as two checkouts started together would.
    runs = [
        subprocess.Popen([python, "-c", TINY_SCRIPT], env=env, cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for python in (sys.executable, str(second_venv))
    ]  # fmt: skip
    results = [run.communicate(timeout=600) for run in runs]
    for run, (_out, err) in zip(runs, results, strict=True):
        assert run.returncode == 0, err[-3000:]
    (torch_a, folder_a), (torch_b, folder_b) = (out.split() for out, _ in results)
    assert torch_a != torch_b, "the second venv imported the first one's torch"
    assert folder_a != folder_b
    libraries = [Path(folder) / f"{Path(folder).name}.so" for folder in (folder_a, folder_b)]
    stamps = [lib.stat().st_mtime_ns for lib in libraries]

    # Each install finds its own build again, and neither rebuilt the other's.
    for python, folder in ((sys.executable, folder_a), (str(second_venv), folder_b)):
        again = _run(python, TINY_SCRIPT, env, timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        assert again.stdout.split()[1] == folder
        assert "loaded from" in again.stderr
        assert "building" not in again.stderr
    assert [lib.stat().st_mtime_ns for lib in libraries] == stamps


def test_a_wait_for_a_live_builder_is_bounded_and_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    name = f"mcpmux_test_tiny_{jit_build.build_key([TINY], ['-O1'])}"
    lock = tmp_path / "mcpmux" / f"{name}.lock"
    lock.parent.mkdir(parents=True)
    # Another process holds the lock, as a build in progress does, and outlives the wait.
    holder = subprocess.Popen(
        [sys.executable, "-c",
         f"import fcntl, os, time; fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT); "
         f"fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode()); print('held', flush=True); "
         "time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with caplog.at_level(logging.INFO, logger=jit_build.__name__):
            started = time.monotonic()
            module = jit_build.load("mcpmux_test_tiny", [TINY], ["-O1"], wait_seconds=2)
        assert module.twice(4) == 8
        assert time.monotonic() - started < 300
        text = caplog.text
        assert f"pid {holder.pid}" in text
        assert "waiting up to 2 s" in text
        assert "gave up waiting" in text
    finally:
        holder.kill()
        holder.wait()
    # The holder died without unlocking: the next process takes the lock at once and finds the build.
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert (tmp_path / "mcpmux" / name / f"{name}.so").is_file()
