"""The token store: owner-only files, one per server, and a lock that holds across processes."""

from __future__ import annotations

import stat
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from mcpmux.upstream.oauth.token_store import TokenStore, default_home

URL = "https://mcp.example.com/mcp"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_a_record_round_trips_in_an_owner_only_file(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "home" / "oauth")
    assert store.load("docs", URL) is None
    store.save("docs", URL, {"access_token": "a-1"})
    assert store.load("docs", URL) == {"access_token": "a-1"}
    assert stat.S_IMODE(store.file("docs", URL).stat().st_mode) == 0o600
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700
    assert [p.name for p in store.root.iterdir()] == [store.file("docs", URL).name]  # no temporary left


def test_each_name_and_url_has_its_own_record(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    store.save("docs", URL, {"n": 1})
    store.save("docs", URL + "/v2", {"n": 2})
    store.save("../etc/passwd", URL, {"n": 3})
    assert [store.load("docs", URL), store.load("docs", URL + "/v2")] == [{"n": 1}, {"n": 2}]
    assert store.file("../etc/passwd", URL).parent == tmp_path
    assert store.delete("docs", URL)
    assert not store.delete("docs", URL)
    assert store.load("docs", URL) is None
    assert store.load("docs", URL + "/v2") == {"n": 2}


def test_version_changes_on_every_write(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    assert store.version("docs", URL) is None
    store.save("docs", URL, {"n": 1})
    first = store.version("docs", URL)
    time.sleep(0.01)
    store.save("docs", URL, {"n": 2})
    assert store.version("docs", URL) not in (None, first)


def test_an_unreadable_record_counts_as_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = TokenStore(tmp_path)
    store.save("docs", URL, {})
    store.file("docs", URL).write_text('{"access_token": "half')
    assert store.load("docs", URL) is None
    assert "half" not in caplog.text
    assert str(store.file("docs", URL)) in caplog.text


def test_mcpmux_home_overrides_the_data_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MCPMUX_HOME", str(tmp_path))
    assert default_home() == tmp_path
    monkeypatch.delenv("MCPMUX_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_home() in (tmp_path / "data" / "mcpmux", Path.home() / "Library" / "Application Support" / "mcpmux")


_HOLDER = """
import fcntl, os, sys, time
descriptor = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(descriptor, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


@pytest.mark.anyio
async def test_the_lock_waits_for_another_process(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    lock = store._prepared("docs", URL).with_suffix(".lock")
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(lock), "0.5"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        started = time.monotonic()
        async with store.locked("docs", URL):
            waited = time.monotonic() - started
        assert waited > 0.2
    finally:
        holder.wait(5)


@pytest.mark.anyio
async def test_the_lock_admits_one_task_at_a_time(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    inside: list[int] = []
    most = 0

    async def hold() -> None:
        nonlocal most
        async with store.locked("docs", URL):
            inside.append(1)
            most = max(most, len(inside))
            await anyio.sleep(0.02)
            inside.pop()

    async with anyio.create_task_group() as tasks:
        for _ in range(4):
            tasks.start_soon(hold)
    assert most == 1
