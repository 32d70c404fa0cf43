"""The OpenVINO GenAI peer of `benchmarks/engine.py`: `openvino_driver.py` run in the peer's own venv.

`OpenVINOPeer.start` builds the venv and the IR with `setup_openvino.sh` (idempotent; seconds once
done), starts the driver with the run's precision and threads and waits for it to load. `run`
sends one workload and returns its token times (relative to the workload's start), the greedy
tokens and the driver process's CPU seconds. The driver stays up between rounds, so loading and
compiling are paid once and rounds can alternate with mcpmux's.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SETUP = HERE / "setup_openvino.sh"
DRIVER = HERE / "openvino_driver.py"
PEER_PYTHON = HERE / ".peers" / "openvino" / "bin" / "python"


class PeerUnavailable(Exception):
    """The peer could not be installed or loaded; the message says why."""


class OpenVINOPeer:
    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    @classmethod
    def start(cls, precision: str, threads: int, max_num_seqs: int, max_batched_tokens: int) -> OpenVINOPeer:
        setup = subprocess.run([str(SETUP)], capture_output=True, text=True)
        ir = setup.stdout.strip().splitlines()[-1:] if setup.returncode == 0 else []
        if not ir or not Path(ir[0]).is_dir():
            reason = (setup.stderr.strip().splitlines() or [f"exit status {setup.returncode}"])[-1]
            raise PeerUnavailable(f"{SETUP.name}: {reason}")
        command = [
            str(PEER_PYTHON), str(DRIVER), "--model", ir[0], "--precision", precision, "--threads", str(threads),
            "--max-num-seqs", str(max_num_seqs), "--max-batched-tokens", str(max_batched_tokens),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        peer = cls(process)
        hello = peer._receive()
        if "error" in hello:
            peer.close()
            raise PeerUnavailable(f"OpenVINO GenAI at {precision}: {hello['error']}")
        return peer

    def run(self, reqs: list[tuple[float, list[int], int]]) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"reqs": reqs}) + "\n")
        self.process.stdin.flush()
        return self._receive()

    def _receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise PeerUnavailable(f"the OpenVINO driver exited (status {self.process.wait()}); see its stderr above")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=30)
