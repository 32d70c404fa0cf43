"""The line wire under mcpmux's stdio front and its stdio upstreams: whole lines, and a close that wakes writers."""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from mcpmux.wire.stdio_lines import LineWriter, read_lines

pytestmark = pytest.mark.anyio

_BIG = 300_000  # several times a pipe's buffer: the writer must wait for the reader part-way through a line


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _pipe_read_late(delay: float) -> tuple[LineWriter, threading.Thread, list[bytes]]:
    """A writer on a new pipe whose reader starts reading only after `delay` seconds, into the list."""
    read_fd, write_fd = os.pipe()
    received: list[bytes] = []

    def slow_reader() -> None:
        with os.fdopen(read_fd, "rb") as wire:
            time.sleep(delay)
            received.extend(wire.readlines())

    thread = threading.Thread(target=slow_reader)
    thread.start()
    return LineWriter(os.fdopen(write_fd, "wb", buffering=0)), thread, received


async def test_concurrent_lines_longer_than_the_pipe_arrive_whole_and_in_order() -> None:
    writer, thread, received = _pipe_read_late(0.2)  # the first line fills the pipe before anyone reads
    async with anyio.create_task_group() as tasks:
        for mark in "abc":
            tasks.start_soon(writer.write, mark * _BIG + "\n")
            await anyio.lowlevel.checkpoint()  # started in this order
    writer.close()
    await anyio.to_thread.run_sync(thread.join)
    assert [line[:1] for line in received] == [b"a", b"b", b"c"]
    assert all(line == line[:1] * _BIG + b"\n" for line in received)


async def test_close_wakes_a_writer_waiting_for_a_reader_that_never_reads() -> None:
    read_fd, write_fd = os.pipe()
    writer = LineWriter(os.fdopen(write_fd, "wb", buffering=0))
    try:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tasks:

                async def stuck() -> None:
                    with pytest.raises(anyio.ClosedResourceError):
                        await writer.write("x" * _BIG + "\n")

                tasks.start_soon(stuck)
                await anyio.sleep(0.1)
                writer.close()
        with pytest.raises(anyio.ClosedResourceError):
            await writer.write("after close\n")
    finally:
        os.close(read_fd)


async def test_a_writer_cancelled_mid_line_finishes_its_line_before_the_next() -> None:
    writer, thread, received = _pipe_read_late(0.3)  # the cancelled writer is stuck mid-line until then
    with anyio.move_on_after(0.1) as scope:
        await writer.write("a" * _BIG + "\n")
    assert scope.cancelled_caught
    await writer.write("b\n")
    writer.close()
    await anyio.to_thread.run_sync(thread.join)
    assert received == [b"a" * _BIG + b"\n", b"b\n"]


async def test_lines_split_across_reads_and_invalid_utf8_come_out_whole() -> None:
    read_fd, write_fd = os.pipe()
    async with anyio.create_task_group() as tasks:

        async def feed() -> None:
            for part in (b'{"a": 1}\n{"b"', b': "\xc3', b'\xa9"}\n\xff bad\n', b"no newline at the end"):
                os.write(write_fd, part)
                await anyio.sleep(0.05)
            os.close(write_fd)

        tasks.start_soon(feed)
        with os.fdopen(read_fd, "rb", buffering=0) as wire:
            lines = [line async for line in read_lines(wire)]
    assert lines == ['{"a": 1}\n', '{"b": "é"}\n', "\ufffd bad\n", "no newline at the end"]


async def test_write_now_writes_a_short_line_whole_or_nothing() -> None:
    """From synchronous code: a line the pipe takes at once goes out; anything that would wait is refused untouched."""
    writer, thread, received = _pipe_read_late(0.3)
    assert writer.write_now("first\n")
    assert not writer.write_now("x" * (select.PIPE_BUF + 1) + "\n")  # longer than a pipe writes atomically
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(writer.write, "a" * _BIG + "\n")  # fills the pipe and waits, part-way through its line
        await anyio.sleep(0.05)
        assert not writer.write_now("b\n")  # it would land inside that line
    with anyio.fail_after(10):  # the line's tail may still fill the pipe until the late reader drains it
        while not writer.write_now("last\n"):  # refused untouched: the received lines show nothing of it
            await anyio.sleep(0.01)
    writer.close()
    await anyio.to_thread.run_sync(thread.join)
    assert received == [b"first\n", b"a" * _BIG + b"\n", b"last\n"]


async def test_write_now_refuses_a_full_pipe_and_a_closed_wire() -> None:
    read_fd, write_fd = os.pipe()
    writer = LineWriter(os.fdopen(write_fd, "wb", buffering=0))
    try:
        line = "y" * 1000 + "\n"
        written = 0
        while writer.write_now(line):  # nobody reads: the pipe fills up
            written += 1
        assert written > 0
        os.set_blocking(read_fd, False)
        data = os.read(read_fd, 1 << 20)
        assert data == line.encode() * written  # only whole lines went in
    finally:
        os.close(read_fd)
    assert not writer.write_now("after the reader left\n")
    writer.close()
    assert not writer.write_now("after close\n")


async def test_offer_sees_every_line_in_order_and_takes_lines_only_after_those_before_them() -> None:
    """A line read while a declined one still waits for the consumer is offered only once that one is taken."""
    read_fd, write_fd = os.pipe()
    events: list[str] = []

    def offer(line: str) -> bool:
        events.append(f"offer {line.strip()}")
        return line.startswith("take")

    os.write(write_fd, b"keep 1\ntake 1\nkeep 2\ntake 2\ntake 3\n")
    os.close(write_fd)
    with os.fdopen(read_fd, "rb", buffering=0) as wire:
        async for line in read_lines(wire, offer=offer):
            events.append(f"got {line.strip()}")
            await anyio.sleep(0.01)  # a slow consumer: the later lines are read meanwhile
    assert events == [
        *("offer keep 1", "got keep 1"),
        *("offer take 1", "offer keep 2", "got keep 2"),  # take 1 and keep 2 waited for keep 1's consumer
        *("offer take 2", "offer take 3"),
    ]


async def test_offer_takes_lines_from_the_read_callback_without_the_consumer() -> None:
    """While no declined line waits, a line is taken as it is read, even with the consumer busy elsewhere."""
    read_fd, write_fd = os.pipe()
    taken: list[str] = []
    async with anyio.create_task_group() as tasks:

        async def consume() -> None:
            with os.fdopen(read_fd, "rb", buffering=0) as wire:
                assert [line async for line in read_lines(wire, offer=lambda line: taken.append(line) is None)] == []

        tasks.start_soon(consume)
        for index in range(3):
            os.write(write_fd, f"line {index}\n".encode())
            with anyio.fail_after(5):
                while len(taken) <= index:
                    await anyio.sleep(0.005)
        os.close(write_fd)
    assert taken == ["line 0\n", "line 1\n", "line 2\n"]


async def test_an_exception_in_offer_comes_out_where_its_line_was() -> None:
    read_fd, write_fd = os.pipe()

    def offer(line: str) -> bool:
        if line.startswith("boom"):
            raise ValueError("offer failed")
        return False

    os.write(write_fd, b"first\nboom\nlast\n")
    os.close(write_fd)
    got: list[str] = []

    async def consume() -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as wire:
            async for line in read_lines(wire, offer=offer):
                got.append(line)

    with pytest.raises(ValueError, match="offer failed"):
        await consume()
    assert got == ["first\n"]


async def test_a_consumer_that_falls_behind_stops_the_reading_until_it_catches_up() -> None:
    """Declined lines are held for the consumer only up to a bound: past it the writer waits, and nothing is lost."""
    read_fd, write_fd = os.pipe()
    lines = [f"{index:06d} {'x' * 90}\n".encode() for index in range(5000)]  # 500 kB: far more than a pipe holds
    written = 0

    def writer() -> None:
        nonlocal written
        with os.fdopen(write_fd, "wb", buffering=0) as wire:
            for data in lines:
                wire.write(data)
                written += 1

    thread = threading.Thread(target=writer)
    got: list[str] = []
    with os.fdopen(read_fd, "rb", buffering=0) as wire:
        reading = read_lines(wire, offer=lambda line: False)
        thread.start()
        got.append(await anext(reading))
        await anyio.sleep(0.5)  # the consumer does not ask; the reader reads on until its bound
        assert 0 < written < len(lines)  # the writer is blocked on a full pipe: lines are not held without end
        got += [line async for line in reading]
    await anyio.to_thread.run_sync(thread.join)
    assert got == [data.decode() for data in lines]


async def test_offer_on_a_wire_that_cannot_be_polled(tmp_path: Path) -> None:
    """A regular file is read by a thread; `offer` sees its lines all the same."""
    path = tmp_path / "lines"
    path.write_bytes(b"keep\ntake\nkeep too")
    with path.open("rb") as wire:
        got = [line async for line in read_lines(wire, offer=lambda line: line.startswith("take"))]
    assert got == ["keep\n", "keep too"]
