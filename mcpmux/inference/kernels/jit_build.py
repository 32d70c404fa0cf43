"""Build a C++ extension once per machine and torch install, safe against concurrent and killed builds.

`torch.utils.cpp_extension.load_inline` builds into a shared folder guarded by a lock *file*: a
process killed during its build (Ctrl-C on a first start, a stopped test server) leaves the file,
and every later process waits on it for ever, silently serving with the slower torch kernels; and
its folder is named by the source alone, so two installs (another venv, another torch) rebuild the
same folder in turn with their own include paths. Here instead:

- **The folder's name covers everything the build depends on**: the sources and flags, the torch
  build (version, git revision, where its headers are), the Python it links against and the
  compiler. Two installs never share a folder; the same install finds its build again.
- **A build happens in a private folder** (``<name>.partial-<pid>-<random>``) and is renamed into
  place when complete, so a folder under the final name always holds a whole build, and a killed
  build leaves only a private folder, removed by the next builder.
- **Builders of one name take turns through an OS lock** (`fcntl.flock` on ``<name>.lock``), which
  the kernel drops when its holder dies, however it dies. A process that finds the lock taken
  waits at most `WAIT_SECONDS`, saying so in the log, then builds in a private folder of its own.

Folders live under ``$TORCH_EXTENSIONS_DIR`` (else torch's default, ``~/.cache/torch_extensions``),
in ``mcpmux/``.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

WAIT_SECONDS = 600.0
"""How long a process waits for another's build of the same extension before building its own copy (a
first build takes one to three minutes on two cores)."""

_POLL_SECONDS = 0.5


def build_root() -> Path:
    """Where builds live: ``$TORCH_EXTENSIONS_DIR/mcpmux`` (else under torch's default extensions folder)."""
    from torch.utils.cpp_extension import get_default_build_root

    configured = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(configured or get_default_build_root()) / "mcpmux"


def build_key(sources: list[str], cflags: list[str]) -> str:
    """12 hex digits naming a build of `sources` with `cflags` against this torch, Python and compiler."""
    from torch.utils.cpp_extension import include_paths

    inputs = (
        sources,
        cflags,
        torch.__version__,
        torch.version.git_version,
        include_paths(),
        sysconfig.get_paths()["include"],
        sysconfig.get_config_var("EXT_SUFFIX"),
        torch._C._GLIBCXX_USE_CXX11_ABI,
        _compiler(),
    )
    return hashlib.sha256(repr(inputs).encode()).hexdigest()[:12]


def _compiler() -> str:
    """The compiler torch will run and its version line ('' where it cannot be asked)."""
    cxx = os.environ.get("CXX", "c++")
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return cxx
    return f"{cxx}: {version.stdout.partition(chr(10))[0]}"


def load(prefix: str, sources: list[str], cflags: list[str], *, wait_seconds: float | None = None) -> ModuleType:
    """The extension built from `sources` (C++, as `load_inline` takes them) with `cflags`, built first if needed.

    Its module is named ``<prefix>_<build_key>``. Raises what the build raises (no compiler, a compile
    error); never leaves a lock or a half-written folder behind, whatever ends the process.
    """
    name = f"{prefix}_{build_key(sources, cflags)}"
    root = build_root()
    final = root / name
    if (built := _built(final, name)) is not None:
        return _import(name, built)
    root.mkdir(parents=True, exist_ok=True)
    limit = WAIT_SECONDS if wait_seconds is None else wait_seconds
    with _TurnLock(root / f"{name}.lock", limit) as turn:
        if turn.held and (built := _built(final, name)) is not None:  # built while this process waited
            return _import(name, built)
        if turn.held:
            _remove_abandoned(root, name)
        return _build(name, sources, cflags, root, final)


def _built(folder: Path, name: str) -> Path | None:
    library = folder / f"{name}.so"
    return library if library.is_file() else None


def _import(name: str, library: Path) -> ModuleType:
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(name, library)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    logger.info("C++ extension %s loaded from %s", name, library.parent)
    return module


def _build(name: str, sources: list[str], cflags: list[str], root: Path, final: Path) -> ModuleType:
    from torch.utils.cpp_extension import load_inline

    private = root / f"{name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    private.mkdir()
    # Held for the whole build: a folder whose owner lock can be taken belongs to a dead builder.
    owner = os.open(private / ".owner", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(owner, fcntl.LOCK_EX)
        logger.info("building C++ extension %s in %s", name, private)
        started = time.monotonic()
        module = load_inline(name, cpp_sources=sources, extra_cflags=cflags, build_directory=str(private))
        try:
            os.rename(private, final)
        except OSError as err:  # another builder's copy got there first (it waited no longer): keep theirs
            if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            shutil.rmtree(private, ignore_errors=True)
        logger.info("built C++ extension %s in %.1f s into %s", name, time.monotonic() - started, final)
        return module
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    finally:
        os.close(owner)


def _remove_abandoned(root: Path, name: str) -> None:
    """Remove private build folders of `name` whose builder is gone (its owner lock is free)."""
    for folder in root.glob(f"{name}.partial-*"):
        try:
            owner = os.open(folder / ".owner", os.O_RDWR)
        except FileNotFoundError:  # killed before it took its lock, or being removed by its builder
            owner = None
        except OSError:
            continue
        try:
            if owner is not None:
                fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live builder's
        finally:
            if owner is not None:
                os.close(owner)
        logger.info("removing %s, left by a build that did not finish", folder)
        shutil.rmtree(folder, ignore_errors=True)


class _TurnLock:
    """The OS lock on `path` for at most `limit` seconds of waiting; `held` says whether it was taken.

    The kernel releases an `flock` when its holder's file is closed, which its death does: no lock
    outlives its process. The lock file itself stays, empty of meaning, and is reused.
    """

    def __init__(self, path: Path, limit: float) -> None:
        self.path = path
        self.limit = limit
        self.held = False
        self._fd = -1

    def __enter__(self) -> _TurnLock:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        started = time.monotonic()
        logged = False
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                waited = time.monotonic() - started
                if waited >= self.limit:
                    logger.warning(
                        "gave up waiting for %s after %.0f s (%s); building a private copy",
                        self.path.name, waited, self._holder(),
                    )  # fmt: skip
                    return self
                if not logged:
                    logger.info(
                        "waiting up to %.0f s for another process's build (%s; lock %s)",
                        self.limit, self._holder(), self.path,
                    )  # fmt: skip
                    logged = True
                time.sleep(_POLL_SECONDS)
                continue
            self.held = True
            if logged:
                logger.info("waited %.1f s for another process's build", time.monotonic() - started)
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, str(os.getpid()).encode(), 0)
            return self

    def _holder(self) -> str:
        try:
            pid = os.pread(self._fd, 32, 0).decode().strip()
        except OSError:
            pid = ""
        return f"pid {pid}" if pid else "pid unknown"

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)  # drops the lock
