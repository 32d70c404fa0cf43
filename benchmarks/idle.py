"""What an idle `mcpmux serve` costs: CPU (ms/s) and wake-ups (context switches/s) while nothing asks.

    python benchmarks/idle.py --config examples/mcpmux.toml --transport http
    python benchmarks/idle.py --transport stdio            # a small config: one stdio upstream

Starts the server, waits `--settle` seconds (upstreams connected, models loaded), then reads /proc for
`--seconds`: the mcpmux process's user+system CPU and the voluntary and involuntary context switches of
all its threads (each one a wake-up), and the same summed over its child processes (the upstreams). A
timer that wakes an idle server shows here; a server that sleeps shows ~0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def small_config(folder: Path) -> Path:
    """A config with one stdio upstream (the tests' demo server) and no inference."""
    path = folder / "small.toml"
    server = ROOT / "tests" / "servers" / "demo_server.py"
    path.write_text(
        f'[servers.demo]\ncommand = "{sys.executable}"\nargs = ["{server}", "demo"]\n\n[inference]\nbackend = "off"\n'
    )
    return path


def sample(pid: int) -> tuple[float, int]:
    """CPU seconds and context switches of process `pid` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    switches = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches:" in line:
                    switches += int(line.split()[1])
        except FileNotFoundError:  # a thread that ended between the listing and the read
            continue
    return cpu, switches


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with (task / "children").open() as listed:
            found += [int(child) for child in listed.read().split()]
    return found + [grandchild for child in found for grandchild in children(child)]


def total(pids: list[int]) -> tuple[float, int]:
    cpu, switches = 0.0, 0
    for pid in pids:
        try:
            one = sample(pid)
        except FileNotFoundError:
            continue
        cpu, switches = cpu + one[0], switches + one[1]
    return cpu, switches


def wait_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"nothing listens on port {port}: see the server's stderr above")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="config file (default: a small one with one stdio upstream)")
    ap.add_argument("--transport", choices=["stdio", "http"], default="http")
    ap.add_argument("--settle", type=float, default=15.0, help="seconds after start before measuring")
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds measured")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "idle.json"), help="the result, as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        config = args.config or str(small_config(Path(folder)))
        command = [sys.executable, "-m", "mcpmux", "serve", "--config", config, "--transport", args.transport]
        port = free_port()
        if args.transport == "http":
            command += ["--port", str(port)]
        # stdio: stdin stays an open pipe nobody writes to (a client that connected and said nothing yet)
        server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=ROOT)
        try:
            if args.transport == "http":
                wait_port(port, time.monotonic() + 120)
            time.sleep(args.settle)
            if server.poll() is not None:
                raise SystemExit(f"mcpmux serve exited ({server.returncode}): see its stderr above")
            upstreams = children(server.pid)
            before, before_children = sample(server.pid), total(upstreams)
            start = time.monotonic()
            time.sleep(args.seconds)
            wall = time.monotonic() - start
            after, after_children = sample(server.pid), total(upstreams)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    result = {
        "config": args.config or "one stdio upstream",
        "transport": args.transport,
        "seconds": round(wall, 1),
        "mcpmux_cpu_ms_per_s": round((after[0] - before[0]) * 1000 / wall, 2),
        "mcpmux_wakeups_per_s": round((after[1] - before[1]) / wall, 2),
        "upstreams": len(upstreams),
        "upstreams_cpu_ms_per_s": round((after_children[0] - before_children[0]) * 1000 / wall, 2),
        "upstreams_wakeups_per_s": round((after_children[1] - before_children[1]) / wall, 2),
    }
    print(json.dumps(result))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
