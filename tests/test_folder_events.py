"""`FolderEvents` (mcpmux.mux.folder_events) on real inotify: the config watcher wakes when its file
is saved the way editors save it (a new file renamed over the old) or written in place, and not for
other files written in the same folder."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from mcpmux.mux.folder_events import FolderEvents

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def events(tmp_path: Path) -> FolderEvents:
    opened = FolderEvents.open()
    if opened is None:
        pytest.skip("inotify is not available here (the watcher polls instead)")
    assert opened.add(tmp_path)
    return opened


async def test_wakes_for_its_file_saved_by_rename_or_in_place_and_not_for_others(
    tmp_path: Path, events: FolderEvents
) -> None:
    config = tmp_path / "mcpmux.toml"
    config.write_text("[mux]\n")
    try:
        with anyio.fail_after(5):
            await events.wait({config})  # its creation
        (tmp_path / "server.log").write_text("a line\n")  # queued before the wait: read and dropped
        with anyio.move_on_after(1) as scope:
            await events.wait({config})
        assert scope.cancelled_caught, "woke for another file's write"

        (tmp_path / "mcpmux.toml.tmp").write_text("[mux]\nreload = true\n")
        os.replace(tmp_path / "mcpmux.toml.tmp", config)
        with anyio.fail_after(5):
            await events.wait({config})

        with config.open("a") as file:
            file.write("# edited in place\n")
        with anyio.fail_after(5):
            await events.wait({config})
    finally:
        events.close()


def test_a_missing_folder_is_not_watched(tmp_path: Path, events: FolderEvents) -> None:
    try:
        assert not events.add(tmp_path / "gone")
    finally:
        events.close()
