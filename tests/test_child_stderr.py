"""An upstream's stderr: passed on under its name, and only its current process's lines quoted when it ends."""

from __future__ import annotations

import pytest

from mcpmux.upstream.child_stderr import ChildStderr


def test_lines_go_on_labelled_and_a_reason_quotes_only_the_last_process(capsys: pytest.CaptureFixture[str]) -> None:
    stderr = ChildStderr("time")
    stderr.started()
    stderr.add("Starting default (STDIO) server...\n")
    assert capsys.readouterr().err == "[time] Starting default (STDIO) server...\n"
    stderr.exit_status = 0
    stderr.started()  # restarted: what the first process said explains nothing about the second
    stderr.exit_status = 1
    assert stderr.describe_exit() == "exited with status 1"
    for line in ("Traceback (most recent call last):", "", "KeyError: 'API_KEY'"):
        stderr.add(line + "\n")
    stderr.exit_status = -9
    assert stderr.describe_exit() == (
        "was killed by signal 9; its stderr ended with: Traceback (most recent call last): | KeyError: 'API_KEY'"
    )
    assert stderr.lines[0] == "Starting default (STDIO) server..."  # kept for the dashboard
